#!/usr/bin/env bash
# Runs the whole test suite in .venv (created or refreshed first).
set -euo pipefail
cd "$(dirname "$0")"
source scripts/venv.sh
python -m pytest tests "$@"
