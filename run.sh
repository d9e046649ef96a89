#!/usr/bin/env bash
# The main job on the embedded default, in .venv (created or refreshed first).
set -euo pipefail
cd "$(dirname "$0")"
source scripts/venv.sh
python examples/demo.py "$@"
