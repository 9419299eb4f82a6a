#!/usr/bin/env python
"""Convert a paddletrainer checkpoint (any parallel layout) into a PaddleNLP unified checkpoint.

    python scripts/export_paddlenlp_unified.py output/checkpoint-100 nlp_output/checkpoint-100

PaddleNLP's Trainer (``--unified_checkpoint true``) then resumes it: ``--resume_from_checkpoint
nlp_output/checkpoint-100``. Runs in one process on CPU; every file read is checked against the size and crc32
in the checkpoint index. Weights, optimizer state (and fp32 master weights), LR schedule and trainer state are
converted; the RNG state is not (PaddleNLP resumes without one).
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from paddletrainer.checkpoint.layout import CheckpointError  # noqa: E402
from paddletrainer.checkpoint.paddlenlp_unified_export import export_paddlenlp_unified  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("ckpt_dir", help="a complete paddletrainer checkpoint-N directory")
    ap.add_argument("out_dir", help="a new directory for the PaddleNLP unified checkpoint")
    a = ap.parse_args(argv)
    try:
        export_paddlenlp_unified(a.ckpt_dir, a.out_dir)
    except (CheckpointError, OSError) as e:
        ap.error(str(e))  # a usage error (exit 2), never a traceback
    print(f"wrote the PaddleNLP unified checkpoint {a.out_dir}")


if __name__ == "__main__":
    main()
