"""``python -m judge``: the same as the ``judge`` command."""

import signal
import sys


def _interrupt(_signum: int, _frame: object) -> None:
    raise KeyboardInterrupt


# SIGTERM and SIGHUP while the command's modules load end it as Ctrl-C does (main() keeps
# them so for the command; a run takes all three over while it judges).
for _sig in (signal.SIGTERM, signal.SIGHUP):
    signal.signal(_sig, _interrupt)

try:
    from judge.cli.main import main
except KeyboardInterrupt:  # nothing was sent
    print("judge: interrupted", file=sys.stderr)
    sys.exit(3)

sys.exit(main())
