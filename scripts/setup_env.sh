#!/usr/bin/env bash
# Create (or reuse) a virtualenv and install paddletrainer into it with the test extras.
# Usage: source scripts/setup_env.sh   (sets $PY to the venv's python)
# VENV overrides the location (default: .venv in the repository).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VENV:-$ROOT/.venv}"
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
fi
PY="$VENV/bin/python"
# Install only when the package is missing or requirements changed since the last install.
STAMP="$VENV/.paddletrainer-installed"
if [ ! -f "$STAMP" ] || ! cmp -s "$ROOT/requirements.txt" "$STAMP"; then
  "$PY" -m pip install -q --upgrade pip
  "$PY" -m pip install -q -e "$ROOT[test]"
  cp "$ROOT/requirements.txt" "$STAMP"
fi
export PY
