"""Save/load speed of ``paddletrainer.checkpoint`` against the raw speed of the same disk, in the same run.

A model of fp32 matrices plus its AdamW state (moment1, moment2: 2x the weights; beta powers are scalars),
``--size-mb`` in total (default 1024; ``--tiny`` 20), is saved and loaded through
``save_checkpoint``/``load_checkpoint``:

* **1 process**: sync save, async save (``async_save=True``: how long the call blocks — the host snapshot —
  and the full time until :func:`finish_pending_save` returns, waiting right away), load;
* **4 ranks** (``paddle.distributed.launch``, tensor-parallel slices, each rank owning 1/4 of every matrix and
  its moments, so each writes a quarter): the same, timed between barriers (slowest rank).

Raw disk speed is measured in the same run and the same directory: the same byte count written in 64 MiB
chunks from memory with ``fsync`` (one file per rank under 4 ranks, all at once), and read back. Loads are
measured cold where possible: every file is dropped from the page cache first (``posix_fadvise DONTNEED``
after an fsync, no root needed); ``cold`` says whether that was possible.

Targets: save ≥ 80% of the raw write bandwidth; async blocking ≤ 10% of the sync save time.

    python scripts/bench_checkpoint.py --tiny
    python scripts/bench_checkpoint.py --size-mb 1024 --ranks4 --markdown
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402

from bench_common import (  # noqa: E402
    launch, machine_line, markdown_table, median, met, print_table, update_markdown_section,
)

CHUNK = 64 << 20


# ------------------------------------------------------------------------------------ model
def make_state(total_bytes: int, rank: int, degree: int, tiny: bool):
    """A Layer of fp32 [rows, cols] matrices (column-split over ``degree`` ranks) with AdamW accumulators.

    ``total_bytes`` is the global size (all ranks); weights are 1/3 of it (AdamW keeps two moments of the
    same size), cut into whole [rows, cols] matrices of which this rank holds a column slice.
    """
    import paddle

    from paddletrainer.checkpoint.local_state import ensure_accumulators

    rows, cols = (256, 1024) if tiny else (2048, 2048)
    per_matrix = rows * cols * 4
    n = max(1, round(total_bytes / 3 / per_matrix))
    local_cols = cols // degree
    rng = np.random.default_rng(rank)

    class Net(paddle.nn.Layer):
        def __init__(self):
            super().__init__()
            self.ws = paddle.nn.ParameterList()
            for _ in range(n):
                p = self.create_parameter([rows, local_cols], default_initializer=paddle.nn.initializer.Constant(0.0))
                p.set_value(rng.standard_normal((rows, local_cols), dtype=np.float32))
                if degree > 1:
                    p.is_distributed, p.split_axis = True, 1
                self.ws.append(p)

    net = Net()
    opt = paddle.optimizer.AdamW(learning_rate=1e-3, parameters=net.parameters())
    ensure_accumulators(opt)
    inner = opt._accumulators
    for kind in ("moment1", "moment2"):
        for t in inner[kind].values():
            t.set_value(rng.standard_normal(t.shape, dtype=np.float32))
    nbytes = sum(int(np.prod(t.shape)) * 4 for t in net.parameters())
    nbytes += sum(int(np.prod(t.shape)) * 4 for accs in inner.values() for t in accs.values())
    return net, opt, nbytes


def topo_ns(rank: int, degree: int):
    return types.SimpleNamespace(world_size=degree, rank=rank, dp_degree=1, dp_rank=0, sharding_degree=1,
                                 sharding_rank=0, tp_degree=degree, tp_rank=rank, pp_degree=1, pp_rank=0)


# ------------------------------------------------------------------------------------ disk
def drop_cache(path: str) -> bool:
    """Evict a file (or every file under a dir) from the page cache; False if the OS cannot."""
    if not hasattr(os, "posix_fadvise"):
        return False
    paths = [path] if os.path.isfile(path) else [os.path.join(d, f) for d, _, fs in os.walk(path) for f in fs]
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    return True


def raw_write(path: str, nbytes: int, buf: np.ndarray) -> float:
    t0 = time.perf_counter()
    with open(path, "wb") as f:
        left = nbytes
        while left > 0:
            k = min(left, buf.nbytes)
            f.write(memoryview(buf)[:k])
            left -= k
        f.flush()
        os.fsync(f.fileno())
    return time.perf_counter() - t0


def raw_read(path: str) -> float:
    t0 = time.perf_counter()
    with open(path, "rb", buffering=0) as f:
        b = bytearray(CHUNK)
        while f.readinto(b):
            pass
    return time.perf_counter() - t0


# ------------------------------------------------------------------------------------ one rank's work
def bench_rank(work: str, size_bytes: int, reps: int, rank: int, degree: int, tiny: bool) -> dict:
    """Every measurement for this rank; collective (barriers) when degree > 1."""
    import paddle.distributed as dist

    from paddletrainer.checkpoint import finish_pending_save, load_checkpoint, save_checkpoint

    multi = degree > 1
    os.makedirs(work, exist_ok=True)

    def barrier():
        if multi:
            dist.barrier()

    net, opt, local_bytes = make_state(size_bytes, rank, degree, tiny)
    topo = topo_ns(rank, degree)
    buf = np.random.default_rng(rank).integers(0, 255, size=CHUNK, dtype=np.uint8)
    out = {k: [] for k in ("raw_write", "raw_read", "save", "async_block", "async_total", "load", "load_warm")}
    cold = True
    for rep in range(reps):
        # raw disk: the same byte count, this rank's share, all ranks at once
        raw = os.path.join(work, f"raw.rank{rank}")
        barrier()
        out["raw_write"].append(raw_write(raw, local_bytes, buf))
        barrier()
        cold &= drop_cache(raw)
        barrier()
        out["raw_read"].append(raw_read(raw))
        barrier()
        if rank == 0:
            os.remove(raw)

        # sync save
        ckpt = os.path.join(work, "ckpts", f"checkpoint-{rep}")
        barrier()
        t0 = time.perf_counter()
        save_checkpoint(ckpt, model=net, optimizer=opt, topology=topo, save_rng=False)
        out["save"].append(time.perf_counter() - t0)

        # load (cold, then warm)
        barrier()
        if rank == 0:
            cold &= drop_cache(ckpt)
        barrier()
        t0 = time.perf_counter()
        load_checkpoint(ckpt, model=net, optimizer=opt, topology=topo, load_rng=False)
        out["load"].append(time.perf_counter() - t0)
        barrier()
        t0 = time.perf_counter()
        load_checkpoint(ckpt, model=net, optimizer=opt, topology=topo, load_rng=False)
        out["load_warm"].append(time.perf_counter() - t0)
        barrier()
        if rank == 0:
            shutil.rmtree(ckpt)

        # async save: the blocking call, then waiting at once for the publish
        ackpt = os.path.join(work, "ckpts", f"checkpoint-async{rep}")
        barrier()
        t0 = time.perf_counter()
        save_checkpoint(ackpt, model=net, optimizer=opt, topology=topo, save_rng=False, async_save=True)
        out["async_block"].append(time.perf_counter() - t0)
        finish_pending_save()
        out["async_total"].append(time.perf_counter() - t0)
        barrier()
        if rank == 0:
            shutil.rmtree(ackpt)
    out["local_bytes"] = local_bytes
    out["cold"] = cold
    return out


def combine(per_rank: list, reps: int) -> dict:
    """Slowest rank per repetition, then the median over repetitions; bytes summed over ranks."""
    res = {"bytes": sum(r["local_bytes"] for r in per_rank), "cold": all(r["cold"] for r in per_rank)}
    for key in ("raw_write", "raw_read", "save", "async_block", "async_total", "load", "load_warm"):
        res[key] = median(max(r[key][i] for r in per_rank) for i in range(reps))
    return res


def worker(a) -> None:
    import paddle.distributed as dist

    dist.init_parallel_env()
    rank, world = dist.get_rank(), dist.get_world_size()
    out = bench_rank(a.work, int(a.size_mb * 2**20), a.reps, rank, world, a.tiny)
    gathered = []
    dist.all_gather_object(gathered, out)
    if rank == 0:
        Path(a.result).write_text(json.dumps(combine(gathered, a.reps)))


# ------------------------------------------------------------------------------------ report
def rows_for(label: str, r: dict) -> list:
    mb = r["bytes"] / 2**20
    bw = lambda s: mb / s  # noqa: E731
    save_frac = r["raw_write"] / r["save"]
    rows = [
        [label, "raw disk write (fsync)", mb, r["raw_write"], bw(r["raw_write"]), "100%"],
        [label, "save_checkpoint (sync)", mb, r["save"], bw(r["save"]), f"{100 * save_frac:.0f}% of raw write"],
        [label, "save_checkpoint async: call blocks", mb, r["async_block"], bw(r["async_block"]),
         f"{100 * r['async_block'] / r['save']:.1f}% of sync save"],
        [label, "save_checkpoint async: until published", mb, r["async_total"], bw(r["async_total"]), ""],
        [label, f"raw disk read ({'cold' if r['cold'] else 'page cache'})", mb, r["raw_read"], bw(r["raw_read"]), "100%"],
        [label, f"load_checkpoint ({'cold' if r['cold'] else 'page cache'})", mb, r["load"], bw(r["load"]),
         f"{100 * r['raw_read'] / r['load']:.0f}% of raw read"],
        [label, "load_checkpoint (page cache)", mb, r["load_warm"], bw(r["load_warm"]), ""],
    ]
    return rows


def target_rows(label: str, r: dict) -> list:
    frac = r["raw_write"] / r["save"]
    block = r["async_block"] / r["save"]
    return [[label, "save >= 80% of raw write bandwidth", f"{100 * frac:.0f}%", met(frac >= 0.8)],
            [label, "async blocking <= 10% of sync save", f"{100 * block:.1f}%", met(block <= 0.10)]]


HEADERS = ["layout", "operation", "MiB", "seconds", "MiB/s", "relative"]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tiny", action="store_true", help="~20 MB, 1 repetition (smoke test)")
    p.add_argument("--size-mb", type=float, default=None, help="weights + optimizer state in MiB (default 1024)")
    p.add_argument("--reps", type=int, default=None, help="repetitions (default 3; tiny 1)")
    p.add_argument("--ranks4", action="store_true", help="also run on 4 ranks (a launch)")
    p.add_argument("--dir", default=None, help="where to write (default: a temp dir under /tmp)")
    p.add_argument("--markdown", action="store_true")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--work", help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    a.size_mb = a.size_mb or (20 if a.tiny else 1024)
    a.reps = a.reps or (1 if a.tiny else 3)
    if a.worker:
        return worker(a)

    print(machine_line())
    base = tempfile.mkdtemp(prefix="pt-bench-ckpt-", dir=a.dir)
    try:
        results = {}
        single = bench_rank(os.path.join(base, "single"), int(a.size_mb * 2**20), a.reps, 0, 1, a.tiny)
        results["1 proc"] = combine([single], a.reps)
        if a.ranks4:
            work = os.path.join(base, "ranks4")
            os.makedirs(work)
            res = os.path.join(base, "ranks4.json")
            launch(__file__, 4, ["--worker", "--work", work, "--result", res, "--size-mb", a.size_mb,
                                 "--reps", a.reps] + (["--tiny"] if a.tiny else []), os.path.join(base, "logs"))
            results["4 ranks"] = json.loads(Path(res).read_text())
    finally:
        shutil.rmtree(base, ignore_errors=True)
    rows, trows = [], []
    for label, r in results.items():
        rows += rows_for(label, r)
        trows += target_rows(label, r)
    print_table(f"Checkpoint save/load (median of {a.reps}; slowest rank)", HEADERS, rows)
    print_table("Targets", ["layout", "target", "value", "status"], trows)
    if a.markdown:
        body = [f"Machine: {machine_line()}.",
                f"`python scripts/bench_checkpoint.py {' '.join(argv if argv is not None else sys.argv[1:])}` "
                f"({a.size_mb:.0f} MiB of fp32 weights + AdamW moments, median of {a.reps}, files under /tmp).", "",
                markdown_table(HEADERS, rows), "", "Targets:", "", markdown_table(["layout", "target", "value", "status"], trows)]
        update_markdown_section("Checkpoint save/load (bench_checkpoint.py)", "\n".join(body))


if __name__ == "__main__":
    main()
