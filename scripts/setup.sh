#!/usr/bin/env bash
# Create .venv with the CPU build of torch first, then countvae with its test and tutorial extras.
# Usage: bash scripts/setup.sh            (idempotent; set PYTHON to choose the interpreter)
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3.11}"
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
# The pinned CPU wheel must come first: an unpinned torch (pulled in by a dependency) is a multi-GB CUDA build.
.venv/bin/python -m pip install --quiet "torch==2.13.0"
.venv/bin/python -m pip install --quiet -e ".[dev]"
echo "countvae environment ready: $(.venv/bin/python -c 'import countvae, torch; print("countvae", countvae.__version__, "torch", torch.__version__)')"
