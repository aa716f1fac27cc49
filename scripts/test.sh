#!/usr/bin/env bash
# Run the whole test suite (unit tests, real-data tests, tutorials) with the project's environment.
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/python -m ruff check .
# --durations: CI prints the 25 slowest tests, so a slower suite shows where its time went.
# -n: the tests run one torch thread each, so one worker process per core (COUNTVAE_TEST_WORKERS, default 2, the
# CI machine's cores); --dist loadfile keeps each file's tests, and their module-scoped fits, on one worker.
exec .venv/bin/python -m pytest -q -p no:cacheprovider --durations=25 \
  -n "${COUNTVAE_TEST_WORKERS:-2}" --dist loadfile "$@"
