#!/usr/bin/env bash
# Creates or refreshes .venv from the lock; sourced by the top-level commands.
# Installs the exact tested set (requirements-dev.txt, which includes
# requirements.txt), then this project on top without resolving anything
# (pyproject.toml's ranges are for users' own environments). Re-installs only
# when a requirements file or pyproject.toml changed since the last install
# (a hash stamp inside .venv records it).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
PYTHON_BIN="${PYTHON:-python3.11}"
command -v "$PYTHON_BIN" >/dev/null || PYTHON_BIN=python3
STAMP="$VENV/.fixed_replay_requirements"
WANT="$(cat "$ROOT/requirements.txt" "$ROOT/requirements-dev.txt" "$ROOT/pyproject.toml" | sha256sum | cut -d' ' -f1)"

if [ ! -x "$VENV/bin/python" ]; then
  echo "[venv] creating $VENV with $PYTHON_BIN" >&2
  "$PYTHON_BIN" -m venv "$VENV"
fi
if [ "$(cat "$STAMP" 2>/dev/null)" != "$WANT" ]; then
  echo "[venv] installing pinned requirements (first run downloads ~1.5 GB)" >&2
  "$VENV/bin/python" -m pip install --quiet --upgrade pip
  "$VENV/bin/python" -m pip install --quiet -r "$ROOT/requirements-dev.txt"
  "$VENV/bin/python" -m pip install --quiet --no-deps -e "$ROOT"
  echo "$WANT" > "$STAMP"
fi
export PATH="$VENV/bin:$PATH"
