#!/usr/bin/env bash
# Runs the whole test suite in .venv (created or refreshed first), on two
# pytest-xdist workers; tests needing a local Ray cluster share one worker.
set -euo pipefail
cd "$(dirname "$0")"
source scripts/venv.sh
python -m pytest tests -n "${FIXED_REPLAY_TEST_WORKERS:-2}" --dist loadgroup "$@"
