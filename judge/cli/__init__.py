"""Stage 9, cli: thin argument parsing over the stages.

Owns the ``judge`` command: parsing arguments, calling one stage function per command,
printing, and turning a :class:`~judge.errors.JudgeError` into one line and its exit code.
May import every stage; nothing imports it.
"""

import os

# The command's numpy work is small vectors (metrics, bootstrap draws): OpenBLAS's pool of a
# thread per core, spun up as numpy loads, cost more CPU than all of it (0.1 s of a `judge
# run`'s start-up on 2 cores, more on more). One thread, unless the user set a number.
if not any(
    k in os.environ for k in ("OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "OMP_NUM_THREADS")
):
    os.environ["OPENBLAS_NUM_THREADS"] = "1"
