"""Why the checkpoint's files are safetensors: save/load time of the same tensors with ``paddle.save``/``paddle.load``
and with ``safetensors.numpy`` (``--size-mb`` of fp32 matrices, default 100, in 26 tensors; median of ``--reps``).

Saves include ``fsync``; loads read from the page cache (warm), which compares the formats' own costs rather than
the disk. ``paddle.save`` of Tensors is what PaddleNLP writes (pickles); the numpy rows show how much of the
difference is the Tensor <-> numpy conversion.

    python scripts/bench_checkpoint_formats.py
    python scripts/bench_checkpoint_formats.py --size-mb 100 --reps 5 --markdown
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_common import machine_line, markdown_table, median, print_table, timeit, update_markdown_section  # noqa: E402

TITLE = "Checkpoint file format (bench_checkpoint_formats.py)"


def _synced(save, path):
    def run():
        save(path)
        with open(path, "rb") as f:
            os.fsync(f.fileno())
    return run


def measure(size_mb: int, reps: int, directory: str) -> list:
    import paddle
    from safetensors.numpy import load_file, save_file

    n = 26
    rows = max(1, size_mb * 2**20 // (4 * 1024 * n))
    arrays = {f"layer{i}.weight": np.random.default_rng(i).standard_normal((rows, 1024), np.float32) for i in range(n)}
    tensors = {k: paddle.to_tensor(v) for k, v in arrays.items()}
    path = os.path.join(directory, "state")
    cases = [
        ("paddle.save / paddle.load (Tensors)", lambda p: paddle.save(tensors, p), lambda p: paddle.load(p)),
        ("paddle.save (numpy) / paddle.load(return_numpy=True)", lambda p: paddle.save(arrays, p),
         lambda p: paddle.load(p, return_numpy=True)),
        ("safetensors.numpy save_file / load_file", lambda p: save_file(arrays, p), lambda p: load_file(p)),
    ]
    out = []
    for name, save, load in cases:
        save_s = median(timeit(_synced(save, path), repeat=reps))
        size = os.path.getsize(path)
        load_s = median(timeit(lambda: load(path), repeat=reps))
        out.append((name, f"{size / 2**20:.2f}", f"{save_s:.3f}", f"{size / 2**20 / save_s:,.0f}", f"{load_s:.3f}",
                    f"{size / 2**20 / load_s:,.0f}"))
        os.remove(path)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size-mb", type=int, default=100)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--markdown", action="store_true", help=f"replace the '{TITLE}' section of docs/benchmarks.md")
    args = p.parse_args(argv)
    if args.size_mb < 1 or args.reps < 1:
        p.error("--size-mb and --reps must be >= 1")
    headers = ("format", "MiB", "save s", "save MiB/s", "load s (warm)", "load MiB/s")
    with tempfile.TemporaryDirectory() as directory:
        rows = measure(args.size_mb, args.reps, directory)
    print_table(f"{args.size_mb} MiB, median of {args.reps}", headers, rows)
    if args.markdown:
        body = (f"Machine: {machine_line()}.\n"
                f"`python scripts/bench_checkpoint_formats.py --size-mb {args.size_mb} --reps {args.reps} --markdown` "
                f"(26 fp32 tensors; saves fsync'd, loads from the page cache).\n\n" + markdown_table(headers, rows))
        update_markdown_section(TITLE, body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
