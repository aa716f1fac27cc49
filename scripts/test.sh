#!/usr/bin/env bash
# Run the whole test suite (unit tests, real-data tests, tutorials) with the project's environment.
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/python -m ruff check .
# --durations: CI prints the 25 slowest tests, so a slower suite shows where its time went.
exec .venv/bin/python -m pytest -q -p no:cacheprovider --durations=25 "$@"
