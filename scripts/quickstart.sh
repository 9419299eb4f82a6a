#!/usr/bin/env bash
# Set up the environment and run the main job: fine-tune a tiny ERNIE on the bundled chnsenticorp
# sample on CPU (a few minutes), printing a progress bar and the eval accuracy.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/scripts/setup_env.sh"
cd "$ROOT"
exec "$PY" llm_examples/ernie/train.py llm_examples/ernie/quickstart.json "$@"
