#!/usr/bin/env bash
# Set up the environment and run the whole test suite (unit, distributed CPU launches, examples).
# Extra arguments go to pytest, e.g. `bash scripts/test.sh tests/unit -x`.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/scripts/setup_env.sh"
cd "$ROOT"
if [ "$#" -eq 0 ]; then set -- tests; fi
exec "$PY" -m pytest -q -p no:cacheprovider "$@"
