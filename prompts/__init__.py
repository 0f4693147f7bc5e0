"""Jinja templates shipped with judge (installed as the package ``judge._prompts``)."""
