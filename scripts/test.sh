#!/usr/bin/env bash
# The README's second command: set up (dev + embedded extras, model) and run the test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh "dev,embedded"
set +e
.venv/bin/python -m pytest "$@"
code=$?
set -e
if [ "$code" -eq 5 ]; then
    echo "pytest collected no tests" >&2
    exit 1
fi
exit "$code"
