#!/usr/bin/env python
"""Which parallel layout fits and is fastest: predicted peak memory per rank and step time (from a checkout).

    python scripts/plan.py path/to/config.json --devices 8 --profile A100-80G --global-batch 512 --seq-length 4096

The tool is ``paddletrainer.tools.plan`` (installed as ``paddletrainer-plan``); this file runs it from the
checkout without an install.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from paddletrainer.tools.plan import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
