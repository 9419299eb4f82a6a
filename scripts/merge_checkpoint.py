#!/usr/bin/env python
"""Merge a paddletrainer checkpoint (any parallel layout) into a from_pretrained directory.

    python scripts/merge_checkpoint.py output/checkpoint-100 merged/ [--config-from path/to/model]

Runs in one process on CPU; only the model weights are merged (the optimizer state is not needed for
inference). Every file read is checked against the size and crc32 in the checkpoint index.
"""
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from paddletrainer.checkpoint.export import export_for_from_pretrained  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("ckpt_dir", help="a complete checkpoint-N directory")
    ap.add_argument("out_dir", help="where model weights + config.json are written")
    ap.add_argument("--config-from", default=None, help="copy config.json from this model directory instead")
    a = ap.parse_args(argv)
    t0 = time.perf_counter()
    path = export_for_from_pretrained(a.ckpt_dir, a.out_dir, config_from=a.config_from)
    print(f"wrote {path} ({os.path.getsize(path) / 2**20:.1f} MiB) in {time.perf_counter() - t0:.2f}s")


if __name__ == "__main__":
    main()
