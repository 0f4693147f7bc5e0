#!/usr/bin/env bash
# The README's first command: set up on a fresh machine and run the embedded judge on the sample.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh embedded
.venv/bin/judge run configs/quickstart.toml --out runs/quickstart "$@"
echo "report: runs/quickstart/report.md  (and summary.json, verdicts.jsonl, qrels.txt)"
