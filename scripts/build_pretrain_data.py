#!/usr/bin/env python
"""Tokenize a plain-text corpus into the token files ``paddletrainer.data.pretrain`` reads (from a checkout).

    python scripts/build_pretrain_data.py --input corpus.txt --tokenizer path/to/tokenizer --output data/corpus

The tool is ``paddletrainer.tools.build_pretrain_data`` (installed as ``paddletrainer-build-pretrain-data``); this
file runs it from the checkout without an install, and re-exports its functions for the examples that import them
from here (``llm_examples``).
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from paddletrainer.tools.build_pretrain_data import *  # noqa: E402,F401,F403
from paddletrainer.tools.build_pretrain_data import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
