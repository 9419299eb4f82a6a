#!/usr/bin/env python
"""Merge a paddletrainer checkpoint (any parallel layout) into a from_pretrained directory (from a checkout).

    python scripts/merge_checkpoint.py output/checkpoint-100 merged/ [--config-from path/to/model]

The tool is ``paddletrainer.tools.merge_checkpoint`` (installed as ``paddletrainer-merge-checkpoint``); this file
runs it from the checkout without an install.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from paddletrainer.tools.merge_checkpoint import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
