"""Save/load speed of ``paddletrainer.checkpoint`` against the raw speed of the same disk, in the same run.

A model of fp32 matrices plus its AdamW state (moment1, moment2: 2x the weights; beta powers are scalars),
``--size-mb`` in total (default 1024; ``--tiny`` 20), is saved and loaded through
``save_checkpoint``/``load_checkpoint``:

* **1 process**: sync save; async save as the Trainer runs it: the save call, one forward/backward of the
  model (the host copy runs meanwhile in the writer thread), ``wait_for_snapshot`` (where the Trainer waits
  before the optimizer step), then ``finish`` (the publish); load, checksummed in the same pass;
* **4 ranks** (``paddle.distributed.launch``, tensor-parallel slices, each rank owning 1/4 of every matrix and
  its moments, so each writes a quarter): the same, timed between barriers (slowest rank).

Raw disk speed is measured in the same run and the same directory, with the same parallelism as the save
and the load: every rank writes files of the same sizes as the shard files it writes in the save (its model
and optimizer files), each in its own thread, in 64 MiB chunks from memory with ``fsync``, all ranks at once;
then reads them back, again one thread per file (as the load reads its files in parallel). Loads are
measured cold where possible: every file is dropped from the page cache first (``posix_fadvise DONTNEED``
after an fsync, no root needed); ``cold`` says whether that was possible.

The disk of a shared machine drifts within seconds, so each repetition measures the raw write and the sync
save back to back, then (both dropped from the cache) the raw read and the cold load back to back, the
order alternating between repetitions. This machine's disk remembers the last write: whichever of two
back-to-back 1 GB writes runs second is the slower one, by 1.5-2.5x at 4 ranks (0.5-0.6 s first, 1.3-2.1 s
second, for raw and checkpoint alike; a 1-8 s pause with ``os.sync`` does not remove it). So every timed
write is preceded by an untimed write of files of the same sizes (``prime_disk``): both timed writes start
right after a write of this size, which shrinks the order effect to ~10-40%, and the pairing below cancels
the rest; the
"relative" column and the targets are ratios within a repetition (its slowest rank), each pair of
repetitions (one per order) combined by a geometric mean, then the median over pairs
(:func:`order_balanced_ratio`; use an even ``--reps``); the seconds columns are medians of the times.

Async blocking is what the training thread waits for: the save call plus the wait before the optimizer
step. The forward/backward is timed with and without a copy running beside it (on this CPU the copy and
the matmuls share the cores; on a GPU the copy runs on a side stream). ``--batch`` sets its size.
Two costs are NOT in the async blocking figure (nor in its target): the forward/backward's slowdown beside
the copy (training time lost to the copy too; its own row, "forward/backward beside the host copy"), and
the first async save of a run. Every timed async save is a repeat: its writer plan comes from the sync
save just before, and from the second repetition on its host buffers are already mapped, while the first
async save of a training run gathers the metadata and touches fresh host memory (page faults, several
times a copy into mapped memory); the median over repetitions leaves that first-save cost out.

Targets: save ≥ 80% of the raw write bandwidth; load ≥ 80% of the raw read bandwidth; async blocking
(call + wait of a repeat save, see above) ≤ 10% of the sync save time.

    python scripts/bench_checkpoint.py --tiny
    python scripts/bench_checkpoint.py --size-mb 1024 --ranks4 --markdown
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import tempfile
import time
import types
from concurrent.futures import ThreadPoolExecutor
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


def raw_write_parallel(paths_sizes: list, buf: np.ndarray) -> float:
    """Write the files concurrently (one thread and one fsync each); wall seconds until all are durable."""
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=len(paths_sizes)) as pool:
        list(pool.map(lambda ps: raw_write(ps[0], ps[1], buf), paths_sizes))
    return time.perf_counter() - t0


def raw_read_parallel(paths: list) -> float:
    """Read the files concurrently (one thread each); wall seconds."""
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=len(paths)) as pool:
        list(pool.map(raw_read, paths))
    return time.perf_counter() - t0


def shard_file_sizes(ckpt: str, tp_rank: int) -> list:
    """Sizes of the shard files this (tensor-parallel) rank wrote in the checkpoint ``ckpt``."""
    from paddletrainer.checkpoint import placement as L

    files = json.loads(Path(ckpt, L.INDEX_NAME).read_text())["files"]
    names = [L.model_file_name(tp_rank, 0), L.optimizer_file_name(tp_rank, 0, 0)]
    return [int(files[n]["size"]) for n in names]


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
def forward_backward(net, x) -> None:
    """A training step's forward/backward over every matrix (writes gradients, never the weights)."""
    loss = None
    for w in net.ws:
        part = (x @ w).mean()
        loss = part if loss is None else loss + part
    loss.backward()


def bench_rank(work: str, size_bytes: int, reps: int, rank: int, degree: int, tiny: bool, batch: int) -> dict:
    """Every measurement for this rank; collective (barriers) when degree > 1."""
    import paddle.distributed as dist

    import paddle

    from paddletrainer.checkpoint import Checkpointer, load_checkpoint

    multi = degree > 1
    os.makedirs(work, exist_ok=True)

    def barrier():
        if multi:
            dist.barrier()

    net, opt, local_bytes = make_state(size_bytes, rank, degree, tiny)
    topo = topo_ns(rank, degree)
    saver = Checkpointer(model=net, optimizer=opt, topology=topo, save_rng=False)
    x = paddle.randn([batch, net.ws[0].shape[0]])
    forward_backward(net, x)  # warm up (gradient buffers allocated once)
    buf = np.random.default_rng(rank).integers(0, 255, size=CHUNK, dtype=np.uint8)
    out = {k: [] for k in ("raw_write", "raw_read", "save", "async_call", "async_wait", "async_total", "load",
                           "load_warm", "fb_plain", "fb_during_copy")}
    cold = True
    # a first save tells the sizes of this rank's shard files: the raw baseline writes the same files
    probe = os.path.join(work, "ckpts", "checkpoint-probe")
    saver.save(probe)
    sizes = shard_file_sizes(probe, rank)
    barrier()
    if rank == 0:
        shutil.rmtree(probe)
    for rep in range(reps):
        # Raw disk and checkpoint back to back, the order alternating between repetitions: the disk of a
        # shared machine drifts, and each ratio is taken within one repetition (see combine()).
        raw_first = rep % 2 == 0
        # raw disk: files of the same sizes as this rank's shard files, one writer thread each, all ranks at once
        raws = [(os.path.join(work, f"raw.rank{rank}.{i}"), n) for i, n in enumerate(sizes)]
        ckpt = os.path.join(work, "ckpts", f"checkpoint-{rep}")

        def prime_disk():
            # An untimed write of the same files first: each timed write then starts in the same disk state
            # (right after a write of this size), whichever of the two runs first; see the module docstring.
            primers = [(os.path.join(work, f"primer.rank{rank}.{i}"), n) for i, n in enumerate(sizes)]
            raw_write_parallel(primers, buf)
            for path, _ in primers:
                os.remove(path)
            barrier()

        def raw_write():
            prime_disk()
            out["raw_write"].append(raw_write_parallel(raws, buf))

        def sync_save():
            prime_disk()
            t0 = time.perf_counter()
            saver.save(ckpt)
            out["save"].append(time.perf_counter() - t0)

        def raw_read():
            barrier()
            out["raw_read"].append(raw_read_parallel([path for path, _ in raws]))

        def cold_load():
            barrier()
            t0 = time.perf_counter()
            load_checkpoint(ckpt, model=net, optimizer=opt, topology=topo, load_rng=False)
            out["load"].append(time.perf_counter() - t0)

        for step in ((raw_write, sync_save) if raw_first else (sync_save, raw_write)):
            step()
        barrier()
        for path, _ in raws:  # both cold: every file of both dropped from the page cache first
            cold &= drop_cache(path)
        if rank == 0:
            cold &= drop_cache(ckpt)
        for step in ((raw_read, cold_load) if raw_first else (cold_load, raw_read)):
            step()
        barrier()
        for path, _ in raws:
            os.remove(path)
        barrier()
        t0 = time.perf_counter()
        load_checkpoint(ckpt, model=net, optimizer=opt, topology=topo, load_rng=False)
        out["load_warm"].append(time.perf_counter() - t0)
        barrier()
        if rank == 0:
            shutil.rmtree(ckpt)

        # a forward/backward alone, then the async save as the Trainer runs it
        barrier()
        t0 = time.perf_counter()
        forward_backward(net, x)
        out["fb_plain"].append(time.perf_counter() - t0)
        ackpt = os.path.join(work, "ckpts", f"checkpoint-async{rep}")
        barrier()
        t0 = time.perf_counter()
        saver.save(ackpt, async_save=True)
        t1 = time.perf_counter()
        forward_backward(net, x)
        t2 = time.perf_counter()
        saver.wait_for_snapshot()
        t3 = time.perf_counter()
        opt.clear_grad()
        out["async_call"].append(t1 - t0)
        out["fb_during_copy"].append(t2 - t1)
        out["async_wait"].append(t3 - t2)
        saver.finish()
        out["async_total"].append(time.perf_counter() - t0)
        barrier()
        if rank == 0:
            shutil.rmtree(ackpt)
    out["local_bytes"] = local_bytes
    out["raw_files"] = len(sizes)
    out["cold"] = cold
    return out


def combine(per_rank: list, reps: int) -> dict:
    """Slowest rank per repetition, then the median over repetitions; bytes summed over ranks."""
    res = {"bytes": sum(r["local_bytes"] for r in per_rank), "cold": all(r["cold"] for r in per_rank),
           "raw_files": sum(r["raw_files"] for r in per_rank)}
    for key in ("raw_write", "raw_read", "save", "async_call", "async_wait", "async_total", "load", "load_warm",
                "fb_plain", "fb_during_copy"):
        res[key] = median(max(r[key][i] for r in per_rank) for i in range(reps))
    # blocked = call + wait, per rank and repetition (the slowest rank's sum, not a sum of maxima)
    res["async_block"] = median(max(r["async_call"][i] + r["async_wait"][i] for r in per_rank) for i in range(reps))
    # the targets' ratios: within each repetition (raw and checkpoint back to back), balanced over the order
    slowest = {k: [max(r[k][i] for r in per_rank) for i in range(reps)]
               for k in ("raw_write", "save", "raw_read", "load")}
    blocked = [max(r["async_call"][i] + r["async_wait"][i] for r in per_rank) for i in range(reps)]
    res["save_frac"] = order_balanced_ratio(slowest["raw_write"], slowest["save"])
    res["load_frac"] = order_balanced_ratio(slowest["raw_read"], slowest["load"])
    res["block_frac"] = order_balanced_ratio(blocked, slowest["save"])
    return res


def order_balanced_ratio(num: list, den: list) -> float:
    """Median, over consecutive pairs of repetitions, of the geometric mean of their two ratios ``num/den``.

    Repetitions alternate which of the two operations runs first, and on this disk the second of two 1 GB
    writes is the slower one whichever it is (the first one's writeback is still going on below the guest):
    a pair holds one of each order, so that factor cancels. One repetition: its ratio; with an odd count
    the last one counts in the seconds columns but not here.
    """
    ratios = [n / d for n, d in zip(num, den)]
    if len(ratios) < 2:
        return ratios[0]
    return median(math.sqrt(ratios[i] * ratios[i + 1]) for i in range(0, len(ratios) - 1, 2))


def worker(a) -> None:
    import paddle.distributed as dist

    dist.init_parallel_env()
    rank, world = dist.get_rank(), dist.get_world_size()
    out = bench_rank(a.work, int(a.size_mb * 2**20), a.reps, rank, world, a.tiny, a.batch)
    gathered = []
    dist.all_gather_object(gathered, out)
    if rank == 0:
        Path(a.result).write_text(json.dumps(combine(gathered, a.reps)))


# ------------------------------------------------------------------------------------ report
def rows_for(label: str, r: dict) -> list:
    mb = r["bytes"] / 2**20
    bw = lambda s: mb / s  # noqa: E731
    save_frac = r["save_frac"]
    rows = [
        [label, f"raw disk write ({r['raw_files']} fsync'd files in parallel, as the save)", mb, r["raw_write"], bw(r["raw_write"]), "100%"],
        [label, "save_checkpoint (sync)", mb, r["save"], bw(r["save"]), f"{100 * save_frac:.0f}% of raw write"],
        [label, "async save: the save call", mb, r["async_call"], bw(r["async_call"]), ""],
        [label, "async save: wait before the optimizer step", mb, r["async_wait"], bw(r["async_wait"]), ""],
        [label, "async save: training thread blocked (call + wait)", mb, r["async_block"], bw(r["async_block"]),
         f"{100 * r['block_frac']:.1f}% of sync save"],
        [label, "async save: until published", mb, r["async_total"], bw(r["async_total"]), ""],
        [label, "forward/backward alone", "", r["fb_plain"], "", "100%"],
        [label, "forward/backward beside the host copy", "", r["fb_during_copy"], "",
         f"{100 * r['fb_during_copy'] / r['fb_plain']:.0f}% of alone"],
        [label, f"raw disk read ({r['raw_files']} files in parallel, {'cold' if r['cold'] else 'page cache'})", mb, r["raw_read"], bw(r["raw_read"]), "100%"],
        [label, f"load_checkpoint ({'cold' if r['cold'] else 'page cache'})", mb, r["load"], bw(r["load"]),
         f"{100 * r['load_frac']:.0f}% of raw read"],
        [label, "load_checkpoint (page cache)", mb, r["load_warm"], bw(r["load_warm"]), ""],
    ]
    return rows


def target_rows(label: str, r: dict) -> list:
    frac, read, block = r["save_frac"], r["load_frac"], r["block_frac"]
    return [[label, "save >= 80% of raw write bandwidth", f"{100 * frac:.0f}%", met(frac >= 0.8)],
            [label, "load >= 80% of raw read bandwidth", f"{100 * read:.0f}%", met(read >= 0.8)],
            [label, "async blocking <= 10% of sync save",
             f"{100 * block:.1f}%", met(block <= 0.10)]]


HEADERS = ["layout", "operation", "MiB", "seconds", "MiB/s", "relative"]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tiny", action="store_true", help="~20 MB, 1 repetition (smoke test)")
    p.add_argument("--size-mb", type=float, default=None, help="weights + optimizer state in MiB (default 1024)")
    p.add_argument("--reps", type=int, default=None, help="repetitions, best even (default 4; tiny 1)")
    p.add_argument("--ranks4", action="store_true", help="also run on 4 ranks (a launch)")
    p.add_argument("--batch", type=int, default=None, help="rows of the forward/backward's input (default 32; tiny 8)")
    p.add_argument("--dir", default=None, help="where to write (default: a temp dir under /tmp)")
    p.add_argument("--markdown", action="store_true")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--work", help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    a.size_mb = a.size_mb or (20 if a.tiny else 1024)
    a.reps = a.reps or (1 if a.tiny else 4)
    a.batch = a.batch or (8 if a.tiny else 32)
    if a.worker:
        return worker(a)

    print(machine_line())
    base = tempfile.mkdtemp(prefix="pt-bench-ckpt-", dir=a.dir)
    try:
        results = {}
        single = bench_rank(os.path.join(base, "single"), int(a.size_mb * 2**20), a.reps, 0, 1, a.tiny, a.batch)
        results["1 proc"] = combine([single], a.reps)
        if a.ranks4:
            work = os.path.join(base, "ranks4")
            os.makedirs(work)
            res = os.path.join(base, "ranks4.json")
            launch(__file__, 4, ["--worker", "--work", work, "--result", res, "--size-mb", a.size_mb,
                                 "--reps", a.reps, "--batch", a.batch] + (["--tiny"] if a.tiny else []),
                   os.path.join(base, "logs"))
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
