"""``python -m judge``: the same as the ``judge`` command."""

import sys

from judge.cli.main import main

sys.exit(main())
