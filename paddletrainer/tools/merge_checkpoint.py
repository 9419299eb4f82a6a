"""Merge a paddletrainer checkpoint (any parallel layout) into a ``from_pretrained`` directory.

    paddletrainer-merge-checkpoint output/checkpoint-100 merged/ [--config-from path/to/model]
    paddletrainer-merge-checkpoint lora_run/checkpoint-100 merged/ --base-model path/to/base   # a LoRA run
    python -m paddletrainer.tools.merge_checkpoint ...      (or python scripts/merge_checkpoint.py ... in a checkout)

A LoRA run's checkpoint holds the adapters only: --base-model names the base model's from_pretrained
directory, and the output is that model with LoRA merged (W + scaling * A @ B).

Runs in one process on CPU; only the model weights are merged (the optimizer state is not needed for
inference). Every file read is checked against the size and crc32 in the checkpoint index. A checkpoint that
cannot be merged ends with one ``error: ...`` line and exit status 2.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from typing import List, Optional

from ..checkpoint.export import export_for_from_pretrained
from ..checkpoint.read import read_index
from ..checkpoint.peft import INDEX_KEY, export_merged_lora
from ..errors import friendly_errors


def _check_paths(ap: argparse.ArgumentParser, a) -> None:
    """Every directory named on the command line is usable before anything is read or written."""
    for option, path in (("--base-model", a.base_model), ("--config-from", a.config_from)):
        if path is not None and not os.path.isdir(path):
            ap.error(f"{option} {path}: {'not a directory' if os.path.exists(path) else 'no such directory'}")
    if a.config_from is not None and not os.path.isfile(os.path.join(a.config_from, "config.json")):
        ap.error(f"--config-from {a.config_from}: no config.json there")
    if os.path.lexists(a.out_dir) and not os.path.isdir(a.out_dir):
        ap.error(f"out_dir {a.out_dir}: exists and is not a directory")
    try:
        os.makedirs(a.out_dir, exist_ok=True)
    except OSError as e:
        ap.error(f"out_dir {a.out_dir}: cannot be created ({e.strerror or e})")
    if not os.access(a.out_dir, os.W_OK | os.X_OK):
        ap.error(f"out_dir {a.out_dir}: not writable")


@friendly_errors
def main(argv: Optional[List[str]] = None) -> int:
    """Parse the command line, merge, print what was written; returns the exit status (0)."""
    ap = argparse.ArgumentParser(prog="paddletrainer-merge-checkpoint", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("ckpt_dir", help="a complete checkpoint-N directory")
    ap.add_argument("out_dir", help="where model weights + config.json are written")
    ap.add_argument("--config-from", default=None, help="copy config.json from this model directory instead")
    ap.add_argument("--base-model", default=None,
                    help="a LoRA checkpoint's base model directory (from_pretrained): merge the adapters into it")
    a = ap.parse_args(sys.argv[1:] if argv is None else argv)
    _check_paths(ap, a)
    t0 = time.perf_counter()
    peft = read_index(a.ckpt_dir).get(INDEX_KEY)
    if peft and a.base_model is None:
        ap.error(f"{a.ckpt_dir} is a {peft['type']} checkpoint (adapters only): pass --base-model <the base model's "
                 "from_pretrained directory> to merge them into it")
    if a.base_model is not None and not peft:
        ap.error(f"--base-model applies to LoRA checkpoints only; {a.ckpt_dir} holds a whole model")
    try:
        if peft:
            path = export_merged_lora(a.ckpt_dir, a.out_dir, a.base_model, config_from=a.config_from)
        else:
            path = export_for_from_pretrained(a.ckpt_dir, a.out_dir, config_from=a.config_from)
    except OSError as e:  # a disk that fills up or a file that vanishes while it is written: one line naming it
        ap.error(f"{e.filename or a.out_dir}: {e.strerror or e}")
    print(f"wrote {path} ({os.path.getsize(path) / 2**20:.1f} MiB) in {time.perf_counter() - t0:.2f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
