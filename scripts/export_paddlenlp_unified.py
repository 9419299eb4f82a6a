#!/usr/bin/env python
"""Convert a paddletrainer checkpoint into a PaddleNLP unified checkpoint (from a checkout).

    python scripts/export_paddlenlp_unified.py output/checkpoint-100 nlp_output/checkpoint-100

The tool is ``paddletrainer.tools.export_paddlenlp_unified`` (installed as ``paddletrainer-export-paddlenlp-unified``);
this file runs it from the checkout without an install.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from paddletrainer.tools.export_paddlenlp_unified import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
