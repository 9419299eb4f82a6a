#!/usr/bin/env bash
# Create (or reuse) a virtualenv and install paddletrainer into it (editable) with the extras the README's
# commands need: Paddle's CPU build, the examples and the whole test suite.
# Usage: source scripts/setup_env.sh   (sets $PY to the venv's python)
# VENV overrides the location (default: .venv in the repository); EXTRAS the extras (default: cpu,test; a CUDA
# machine with paddlepaddle-gpu already in the venv: EXTRAS=test, so no CPU build is laid over it).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VENV:-$ROOT/.venv}"
EXTRAS="${EXTRAS:-cpu,test}"
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
fi
PY="$VENV/bin/python"
# Install only when the package is missing or pyproject.toml (its dependencies) or the extras changed since the
# last install.
STAMP="$VENV/.paddletrainer-installed"
WANT="$(cat "$ROOT/pyproject.toml"; echo "extras: $EXTRAS")"
if [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "$WANT" ]; then
  "$PY" -m pip install -q --upgrade pip
  "$PY" -m pip install -q -e "$ROOT[$EXTRAS]"
  printf '%s' "$WANT" > "$STAMP"
fi
export PY
