#!/usr/bin/env bash
# Runs the test suite in .venv (created or refreshed first from
# requirements-dev.txt), on two pytest-xdist workers; tests needing a local
# Ray cluster share one worker. `./test.sh -m "not slow"` is the core tier.
set -euo pipefail
cd "$(dirname "$0")"
export FIXED_REPLAY_LOCK=requirements-dev.txt
source scripts/venv.sh
python -m pytest tests -n "${FIXED_REPLAY_TEST_WORKERS:-2}" --dist loadgroup "$@"
