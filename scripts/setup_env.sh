#!/usr/bin/env bash
# Create (or reuse) a virtualenv and install paddletrainer into it (editable) with the extras the README's
# commands need: Paddle's CPU build, the examples and the whole test suite.
# Usage: source scripts/setup_env.sh   (sets $PY to the venv's python)
# VENV overrides the location (default: .venv in the repository); EXTRAS the extras (default: cpu,test; a CUDA
# machine with paddlepaddle-gpu already in the venv: EXTRAS=test, so no CPU build is laid over it); PYTHON the
# interpreter that creates the venv (default: python3; it must be 3.10 or newer, as pyproject.toml requires).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VENV:-$ROOT/.venv}"
EXTRAS="${EXTRAS:-cpu,test}"
PYTHON="${PYTHON:-python3}"

setup_env_fail() {  # one line on stderr; the failing status stops the script (set -e)
  echo "setup_env.sh: $1" >&2
  return 1
}

if [ ! -x "$VENV/bin/python" ]; then
  if ! version="$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)"; then
    setup_env_fail "no Python interpreter '$PYTHON': install Python 3.10 or newer, or set PYTHON=/path/to/python3"
  elif ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 10))' 2>/dev/null; then
    setup_env_fail "paddletrainer needs Python >= 3.10 and $PYTHON is $version: set PYTHON=/path/to/python3.10 (or newer)"
  else
    existed=0; [ -e "$VENV" ] && existed=1
    # Debian/Ubuntu ship the venv module's pip bootstrap (ensurepip) as a separate package: without it
    # `python3 -m venv` fails half-way and leaves a venv with no pip.
    if ! log="$("$PYTHON" -m venv "$VENV" 2>&1)"; then
      [ "$existed" = 1 ] || rm -rf "$VENV"  # only the half-made venv this command created
      printf '%s\n' "$log" >&2
      setup_env_fail "$PYTHON -m venv $VENV failed; on Debian/Ubuntu install the venv module first: sudo apt-get install python3-venv (python$version-venv), then rerun"
    fi
  fi
fi
PY="$VENV/bin/python"
if ! "$PY" -m pip --version >/dev/null 2>&1; then
  setup_env_fail "$VENV has no pip (created without the venv module's ensurepip?): remove it, install python3-venv on Debian/Ubuntu, and rerun"
fi
# Install only when the package is missing or pyproject.toml (its dependencies) or the extras changed since the
# last install.
STAMP="$VENV/.paddletrainer-installed"
WANT="$(cat "$ROOT/pyproject.toml"; echo "extras: $EXTRAS")"
if [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "$WANT" ]; then
  # pip runs quietly: say what the minutes of silence are for.
  echo "setup_env.sh: installing paddletrainer[$EXTRAS] into $VENV with pip (extras cpu,test: Paddle's CPU build," \
       "PaddleNLP, scikit-learn, pytest, mkdocs; about 2 GB, ~3 min on a fast link; once, until pyproject.toml changes)" >&2
  "$PY" -m pip install -q --upgrade pip
  "$PY" -m pip install -q -e "$ROOT[$EXTRAS]"
  printf '%s' "$WANT" > "$STAMP"
fi
export PY
