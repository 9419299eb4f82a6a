#!/usr/bin/env python
"""GPU smoke test from a checkout: every layout x {fp32, bf16 O2, fp16} on a tiny Llama (see paddletrainer.tools.gpu_smoke).

    python scripts/gpu_smoke.py [--layouts ...] [--precisions ...] [--work_dir DIR] [--lock FILE]

The tool is ``paddletrainer.tools.gpu_smoke`` (installed as ``paddletrainer-gpu-smoke``); this file runs it from the
checkout without an install.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from paddletrainer.tools.gpu_smoke import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
