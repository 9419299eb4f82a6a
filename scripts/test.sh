#!/usr/bin/env bash
# Set up the environment, lint, then run the whole test suite (unit, distributed CPU launches, examples).
# Extra arguments go to pytest, e.g. `bash scripts/test.sh tests/unit -x`, `bash scripts/test.sh --lf`.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/scripts/setup_env.sh"
cd "$ROOT"
# the lint stage first: seconds, and a failure here ends the run before 45 minutes of tests (pyproject's [tool.ruff])
"$PY" -m ruff check .
if [ "$#" -eq 0 ]; then set -- tests; fi
# CI runs on a fresh clone and keeps no cache; locally pytest's cache makes --lf / --ff work
CACHE=()
if [ "${CI:-}" = "true" ]; then CACHE=(-p no:cacheprovider); fi
exec "$PY" -m pytest -q "${CACHE[@]}" "$@"
