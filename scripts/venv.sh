#!/usr/bin/env bash
# Creates or refreshes .venv from the lock; sourced by the top-level commands.
# Installs the exact tested set, then this project on top without resolving
# anything (pyproject.toml's ranges are for users' own environments).
# `./run.sh` installs requirements.txt (the library's lock); `./test.sh` sets
# FIXED_REPLAY_LOCK=requirements-dev.txt, which adds what only the tests and
# docs need (PyTorch's CPU wheel among them), so the main job's first install
# stays as small as it was. Re-installs only when the lock or pyproject.toml
# changed since the last install (a hash stamp inside .venv records it; a
# venv holding the test set also holds the main job's).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
LOCK="${FIXED_REPLAY_LOCK:-requirements.txt}"
PYTHON_BIN="${PYTHON:-python3.11}"
command -v "$PYTHON_BIN" >/dev/null || PYTHON_BIN=python3
STAMP="$VENV/.fixed_replay_requirements"
_lock_hash() {
  cat "$ROOT/requirements.txt" "$ROOT/$1" "$ROOT/pyproject.toml" |
    sha256sum | cut -d' ' -f1
}
WANT="$(_lock_hash "$LOCK")"
TEST_SET="$(_lock_hash requirements-dev.txt)"
HAVE="$(cat "$STAMP" 2>/dev/null || true)"

if [ ! -x "$VENV/bin/python" ]; then
  echo "[venv] creating $VENV with $PYTHON_BIN" >&2
  "$PYTHON_BIN" -m venv "$VENV"
fi
if [ "$HAVE" != "$WANT" ] && [ "$HAVE" != "$TEST_SET" ]; then
  echo "[venv] installing the pinned set in $LOCK (first run downloads ~1.5 GB)" >&2
  "$VENV/bin/python" -m pip install --quiet --upgrade pip
  "$VENV/bin/python" -m pip install --quiet -r "$ROOT/$LOCK"
  "$VENV/bin/python" -m pip install --quiet --no-deps -e "$ROOT"
  echo "$WANT" > "$STAMP"
fi
export PATH="$VENV/bin:$PATH"
