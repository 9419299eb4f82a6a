"""Convert a paddletrainer checkpoint (any parallel layout) into a PaddleNLP unified checkpoint.

    paddletrainer-export-paddlenlp-unified output/checkpoint-100 nlp_output/checkpoint-100

(also ``python -m paddletrainer.tools.export_paddlenlp_unified`` and, in a checkout,
``python scripts/export_paddlenlp_unified.py``). PaddleNLP's Trainer (``--unified_checkpoint true``) then resumes
it: ``--resume_from_checkpoint nlp_output/checkpoint-100``. Runs in one process on CPU; every file read is checked
against the size and crc32 in the checkpoint index. Weights, optimizer state (and fp32 master weights), LR
schedule and trainer state are converted; the RNG state is not (PaddleNLP resumes without one).
"""
import argparse
import sys
from typing import List, Optional

from ..checkpoint.placement import CheckpointError
from ..checkpoint.paddlenlp_unified_export import export_paddlenlp_unified

__all__ = ["main"]


def main(argv: Optional[List[str]] = None) -> int:
    """Parse the command line, convert, say what was written; returns the exit status (0)."""
    ap = argparse.ArgumentParser(prog="paddletrainer-export-paddlenlp-unified", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("ckpt_dir", help="a complete paddletrainer checkpoint-N directory")
    ap.add_argument("out_dir", help="a new directory for the PaddleNLP unified checkpoint")
    a = ap.parse_args(sys.argv[1:] if argv is None else argv)
    try:
        export_paddlenlp_unified(a.ckpt_dir, a.out_dir)
    except (CheckpointError, OSError) as e:
        ap.error(str(e))  # a usage error (exit 2), never a traceback
    print(f"wrote the PaddleNLP unified checkpoint {a.out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
