#!/usr/bin/env bash
# The README's first command: set up on a fresh machine and judge the sample offline, by score
# (the fused embedded reranker; no compiler, no LLM).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh offline
.venv/bin/judge run configs/quickstart.toml --out runs/quickstart "$@"
echo "report: runs/quickstart/report.md  (and summary.json, verdicts.jsonl, qrels.txt)"
