"""Stage 9, cli: thin argument parsing over the stages.

Owns the ``judge`` command: parsing arguments, calling one stage function per command,
printing, and turning a :class:`~judge.errors.JudgeError` into one line and its exit code.
May import every stage; nothing imports it.
"""
