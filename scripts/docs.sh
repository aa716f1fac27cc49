#!/usr/bin/env bash
# Build the documentation site into docs/_build/html (open docs/_build/html/index.html; it works offline).
# Warnings are errors, as in the test suite (tests/test_docs.py). Extra arguments go to sphinx-build.
set -euo pipefail
cd "$(dirname "$0")/.."
exec .venv/bin/python -m sphinx -W --keep-going -n -b html "$@" docs docs/_build/html
