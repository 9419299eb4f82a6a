"""The measuring side of ``cost_model.py`` (its ``--measure`` and ``--probe``): CPU launches, counted bytes.

* :func:`run_measure` launches ``paddletrainer.Trainer`` on the tiny Llama, one 2-process launch per layout of
  ``LAYOUTS``; inside each worker (:func:`measure_worker`) :class:`CommCounter` counts the payload handed to
  every collective and ``/proc/self/io`` ``wchar`` the bytes the process wrote. The rows set them against the
  model's numbers, which the caller passes in (the formulas live in ``cost_model.py``, which imports this
  module for its CLI; this module imports nothing of it).
* :func:`run_probe` measures what gloo sends per payload byte for each collective (:func:`probe_worker`);
  :func:`wire_factor` and :func:`priced_wire` price counted calls with gloo's or NCCL's algorithms.

The launches run this file as the workers' entry point (:func:`worker_main`):

    python scripts/cost_measure.py --measure-worker LAYOUT --result-dir DIR [--measure-hidden H]
    python scripts/cost_measure.py --probe-worker --result-dir DIR
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_common import fmt_bytes, launch, met  # noqa: E402

TINY_LLAMA = Path(__file__).resolve().parents[1] / "llm_examples" / "llama" / "tiny_llama" / "config.json"


# ------------------------------------------------------------------------------------ what --measure runs
LAYOUTS = {  # name: (nproc, Layout kwargs)
    "dp2": dict(dp=2),
    "stage1x2": dict(sharding=2, stage=1),
    "stage1v2x2": dict(sharding=2, stage=1, split_param=True),
    "stage2x2": dict(sharding=2, stage=2),
    "stage3x2": dict(sharding=2, stage=3),
    "tp2": dict(tp=2, fused_qkv=True, fused_ffn=True),  # fused q/k/v and gate/up, as llm_examples/llama runs
    "tp2_unfused": dict(tp=2),  # PaddleNLP's default projections
    "tp2_sp": dict(tp=2, fused_qkv=True, fused_ffn=True, sequence_parallel=True),
    "pp2": dict(pp=2),
}
MEASURE = dict(micro_batch=2, grad_accum=2, seq=32, warmup_steps=1, steps=2, stage3_segment=1024)


# ------------------------------------------------------------------------------------ pricing counted calls
GLOO_REDUCE_SEGMENT = 2 << 20  # bytes; see wire_factor


def wire_factor(api: str, n: int, backend: str, nbytes: int = 0) -> float | None:
    """Bytes one rank sends, averaged over the n ranks, per byte of counted payload (see CommCounter), for one
    call of ``nbytes`` with gloo's algorithms ("gloo", as this machine runs them) or NCCL's ring algorithms
    ("nccl"); None if unknown.

    gloo, measured on 2 ranks by ``--probe`` (``/proc/self/io`` wchar): all-reduce 2(n-1)/n (ring),
    all-gather (n-1)/n of the output, broadcast (n-1)/n (the root sends it, averaged), and the CPU backend's
    reduce-scatter is an all-reduce: 2(n-1)/n. gloo's reduce is a ring reduce-scatter after which each
    non-root sends its reduced chunk to the root again: (n-1)/n + (n-1)/n², 0.75 on 2 ranks — up to 4 MiB;
    above that the probe measures 1.25·S − 2 MiB on average on 2 ranks (root S − 2 MiB, the other 1.5·S − 2 MiB:
    1.0 at 8 MiB, 1.19 at 32 MiB), as if the part beyond two 2 MiB segments went round the ring twice.
    NCCL: reduce and reduce-scatter (n-1)/n. A send sends its payload; a recv sends nothing.
    """
    f = (n - 1) / n
    if api in ("all_reduce", "allreduce"):
        return 2 * f
    if api in ("all_gather", "broadcast"):
        return f
    if api == "reduce":
        if backend != "gloo":
            return f
        if n == 2 and nbytes > 2 * GLOO_REDUCE_SEGMENT:
            return 1.25 - GLOO_REDUCE_SEGMENT / nbytes
        return f + f / n
    if api == "reduce_scatter":
        return 2 * f if backend == "gloo" else f
    return {"send": 1.0, "recv": 0.0}.get(api)


def priced_wire(calls: dict, backend: str) -> float | None:
    """Wire of the counted calls ``{"api@n": {payload bytes of one call: calls}}`` with ``backend``'s algorithms
    (None if an API is unknown)."""
    total = 0.0
    for key, sizes in calls.items():
        api, n = key.rsplit("@", 1)
        for nbytes, count in sizes.items():
            factor = wire_factor(api, int(n), backend, int(nbytes))
            if factor is None:
                return None
            total += factor * int(nbytes) * count
    return total


# ------------------------------------------------------------------------------------ inside a launched worker
def _tensor_bytes(x) -> int:
    import paddle

    if isinstance(x, paddle.Tensor):
        return int(x.numel()) * x.element_size() if x._is_initialized() else 0
    if isinstance(x, (list, tuple)):
        return sum(_tensor_bytes(v) for v in x)
    return 0


class CommCounter:
    """Wraps every collective/p2p method of Paddle's ProcessGroup; counts payload bytes while enabled."""

    METHODS = ("all_gather", "all_gather_into_tensor", "all_gather_partial", "all_reduce", "allreduce",
               "all_to_all", "all_to_all_single", "all_to_all_tensor", "alltoall", "alltoall_single", "broadcast",
               "gather", "recv", "recv_partial", "reduce", "reduce_scatter", "reduce_scatter_tensor", "scatter",
               "scatter_tensor", "send", "send_partial")

    def __init__(self):
        from paddle.base import core

        self.enabled = False
        self.inside_fill = 0
        self.calls = {}  # (api, group size) -> (calls, payload bytes)
        self.sizes = {}  # (api, group size) -> {payload bytes of one call: calls}
        cls = core.ProcessGroup
        for base in self.METHODS:
            for name in (base, base + "_on_calc_stream"):
                orig = getattr(cls, name, None)
                if orig is not None:
                    setattr(cls, name, self._wrap(name.replace("_on_calc_stream", ""), orig))

    def count_cpu_reduce_scatter(self) -> None:
        """Count the CPU backend's reduce-scatter (an all-reduce underneath) as one reduce-scatter of its input."""
        from paddletrainer.parallel.cpu import reduce_scatter as cpu_sp_ops

        counter, fill = self, cpu_sp_ops.reduce_scatter_into

        def wrapped(out_tensor, in_tensor, *args, **kwargs):
            group = kwargs.get("group", args[1] if len(args) > 1 else None)
            if counter.enabled:
                counter.count(("reduce_scatter", cpu_sp_ops._group(group).nranks), _tensor_bytes(in_tensor))
            counter.inside_fill += 1
            try:
                return fill(out_tensor, in_tensor, *args, **kwargs)
            finally:
                counter.inside_fill -= 1

        cpu_sp_ops.reduce_scatter_into = wrapped  # the fill's entry points look it up at call time

    def _wrap(self, api, orig):
        counter = self

        def wrapped(pg, *args, **kwargs):
            if counter.enabled and not counter.inside_fill:
                # the largest tensor argument: the full tensor of an all-reduce/broadcast/reduce/send/recv,
                # the output of an all-gather, the input of a reduce-scatter
                nbytes = max([_tensor_bytes(a) for a in list(args) + list(kwargs.values())] or [0])
                counter.count((api, pg.size()), nbytes)
            return orig(pg, *args, **kwargs)

        return wrapped

    def count(self, key, nbytes: int) -> None:
        n, b = self.calls.get(key, (0, 0))
        self.calls[key] = (n + 1, b + nbytes)
        sizes = self.sizes.setdefault(key, {})
        sizes[nbytes] = sizes.get(nbytes, 0) + 1


def _wchar() -> int:
    with open("/proc/self/io") as f:
        for line in f:
            if line.startswith("wchar:"):
                return int(line.split()[1])
    return 0


def measure_worker(a) -> None:
    """One layout, inside paddle.distributed.launch: train, count the measured steps, write rank<r>.json."""
    import logging

    import numpy as np
    import paddle

    from paddletrainer import Trainer, TrainerCallback, TrainingArguments
    from paddletrainer.checkpoint.local_state import rank_state
    from paddletrainer.parallel.wrappers import unwrap_optimizer

    logging.disable(logging.WARNING)
    from paddletrainer.device import has_accelerator

    lay = LAYOUTS[a.layout]
    counter = CommCounter()
    if not has_accelerator():
        counter.count_cpu_reduce_scatter()
    total_steps = MEASURE["warmup_steps"] + MEASURE["steps"]
    kw = dict(output_dir=tempfile.mkdtemp(), max_steps=total_steps, per_device_train_batch_size=MEASURE["micro_batch"],
              gradient_accumulation_steps=MEASURE["grad_accum"], logging_steps=10_000, save_strategy="no",
              disable_tqdm=True, report_to="none", max_grad_norm=1.0, learning_rate=1e-4, seed=3,
              # the tiny model's matrices are below Paddle's 2**20 default: nothing would be sliced under stage 3
              sharding_stage3_segment_size=MEASURE["stage3_segment"],
              tensor_parallel_degree=lay.get("tp", 1), pipeline_parallel_degree=lay.get("pp", 1),
              # a PipelineLayer's forward takes `input`, so the default column filter would drop input_ids
              remove_unused_columns=False)
    if lay.get("sharding", 1) > 1:
        kw.update(sharding=f"stage{lay['stage']}", sharding_parallel_degree=lay["sharding"])
        if lay.get("split_param"):
            kw.update(sharding_parallel_config="split_param")
    if lay.get("sequence_parallel"):
        kw.update(sequence_parallel=True)
    args = TrainingArguments(**kw)

    from paddlenlp.transformers import LlamaConfig, LlamaForCausalLM, LlamaForCausalLMPipe

    cfg = LlamaConfig.from_pretrained(str(TINY_LLAMA.parent))
    if a.measure_hidden:
        cfg.hidden_size, cfg.intermediate_size = a.measure_hidden, 2 * a.measure_hidden
    cfg.tensor_parallel_degree = max(args.tensor_parallel_degree, 1)
    cfg.tensor_parallel_rank = args.tensor_parallel_rank
    cfg.tensor_parallel_output = False
    cfg.sequence_parallel = bool(lay.get("sequence_parallel"))
    cfg.seq_length = MEASURE["seq"]  # sequence parallel reshapes [s·b, h] back with the config's seq_length
    cfg.fuse_attention_qkv = bool(lay.get("fused_qkv"))  # on the object: LlamaConfig drops them from config.json
    cfg.fuse_attention_ffn = bool(lay.get("fused_ffn"))
    paddle.seed(3)
    model = (LlamaForCausalLMPipe if args.pipeline_parallel_degree > 1 else LlamaForCausalLM)(cfg)
    seq = MEASURE["seq"]
    ids = np.random.RandomState(0).randint(3, cfg.vocab_size, size=(256, seq + 1)).astype("int64")
    data = [{"input_ids": t[:-1], "labels": t[1:]} for t in ids]
    marks = {}

    class Window(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            if state.global_step == MEASURE["warmup_steps"]:
                counter.calls.clear()
                counter.sizes.clear()
                counter.enabled = True
                marks["wchar"] = _wchar()

        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == total_steps:
                counter.enabled = False
                marks["wchar"] = _wchar() - marks["wchar"]

    trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[Window()])
    trainer.train()
    models = rank_state(trainer.model_wrapped, None, trainer.topology).models
    param_bytes = sum(lt.storage_numel * lt.tensor.element_size() for lt in models.values())
    inner = unwrap_optimizer(trainer.optimizer)
    optim_bytes = sum(int(t.numel()) * t.element_size() for accs in (inner._accumulators or {}).values()
                      for t in accs.values() if t._is_initialized())
    steps = MEASURE["steps"]
    result = {
        "rank": paddle.distributed.get_rank(),
        "calls": {f"{api}@{size}": [n / steps, b / steps] for (api, size), (n, b) in counter.calls.items()},
        "call_sizes": {f"{api}@{size}": {str(nb): c / steps for nb, c in sizes.items()}
                       for (api, size), sizes in counter.sizes.items()},
        "payload": sum(b for _, b in counter.calls.values()) / steps,
        "wire": marks.get("wchar", 0) / steps,
        "param_bytes": param_bytes,
        "optim_bytes": optim_bytes,
    }
    Path(a.result_dir, f"rank{result['rank']}.json").write_text(json.dumps(result))


PROBE_SIZES = (64 << 10, 4 << 20, 16 << 20)  # bytes of float32 data per collective
PROBE_APIS = ("all_reduce", "all_gather", "broadcast", "reduce", "reduce_scatter")


def probe_worker(a) -> None:
    """Inside a 2-process launch: the bytes each rank writes (wchar) per byte of payload, per collective and size."""
    import paddle
    import paddle.distributed as dist

    from paddletrainer.parallel import init_topology
    from paddletrainer.parallel.config import ParallelConfig
    from paddletrainer.parallel.layout import Layout

    n = int(os.environ["PADDLE_TRAINERS_NUM"])
    init_topology(ParallelConfig(layout=Layout(world_size=n, dp=n)))  # the CPU backend (its reduce-scatter fill)
    rank, reps, out = dist.get_rank(), 3, {}
    for size in PROBE_SIZES:
        numel = size // 4
        for api in PROBE_APIS:
            x = paddle.ones([numel], dtype="float32")
            calls = {
                "all_reduce": lambda: dist.all_reduce(x),
                "all_gather": lambda: dist.all_gather([], x[: numel // n]),  # output: size bytes
                "broadcast": lambda: dist.broadcast(x, src=0),
                "reduce": lambda: dist.reduce(x, dst=0),
                "reduce_scatter": lambda: dist.reduce_scatter(paddle.empty([numel // n]), x),  # input: size bytes
            }
            dist.barrier()
            before = _wchar()
            for _ in range(reps):
                calls[api]()
            out[f"{api}@{size}"] = (_wchar() - before) / reps / size
            dist.barrier()
    Path(a.result_dir, f"rank{rank}.json").write_text(json.dumps(out))


# ------------------------------------------------------------------------------------ launching
def run_probe() -> list:
    """Measured wire factors of gloo on 2 ranks (the barrier between calls adds a few bytes)."""
    with tempfile.TemporaryDirectory() as tmp:
        launch(__file__, 2, ["--probe-worker", "--result-dir", tmp], os.path.join(tmp, "logs"), timeout=300)
        ranks = [json.loads(Path(tmp, f"rank{r}.json").read_text()) for r in range(2)]
    rows = []
    for size in PROBE_SIZES:
        for api in PROBE_APIS:
            f = [r[f"{api}@{size}"] for r in ranks]
            rows.append([api, fmt_bytes(size), f"{f[0]:.3f}", f"{f[1]:.3f}", f"{sum(f) / 2:.3f}",
                         f"{wire_factor(api, 2, 'gloo', size):.3f}", f"{wire_factor(api, 2, 'nccl', size):.3f}"])
    return rows


def run_measure(names, hidden: int | None, model: Callable[[dict], tuple]) -> tuple:
    """Launch each layout of ``names`` (keys of ``LAYOUTS``) on the tiny Llama, widened to ``hidden`` if given,
    and set what it measures against ``model(Layout keyword arguments)`` = (communication per axis, as
    ``cost_model.communication`` returns it; the single-process optimizer-state bytes; the single-process
    parameter bytes). Returns the rows of the communication, sharded-state, targets and explained-wire tables."""
    rows, srows, trows, xrows = [], [], [], []
    for name in names:
        kw = dict(LAYOUTS[name])
        nproc = kw.get("dp", 1) * kw.get("sharding", 1) * kw.get("tp", 1) * kw.get("pp", 1)
        layout_kw = dict(kw, micro_batch=MEASURE["micro_batch"], global_batch=MEASURE["micro_batch"]
                         * MEASURE["grad_accum"] * kw.get("dp", 1) * kw.get("sharding", 1))
        with tempfile.TemporaryDirectory() as tmp:
            try:
                launch(__file__, nproc, ["--measure-worker", name, "--result-dir", tmp]
                       + (["--measure-hidden", hidden] if hidden else []), os.path.join(tmp, "logs"), timeout=600)
            except RuntimeError as e:
                print(f"{name}: launch failed\n{str(e)[-3000:]}", file=sys.stderr)
                rows.append([name, "launch failed", "", "", "", "", "", ""])
                continue
            ranks = [json.loads(Path(tmp, f"rank{r}.json").read_text()) for r in range(nproc)]
        comm, total_opt, total_par = model(layout_kw)
        model_payload = sum(v["payload"] for v in comm.values())
        model_wire = sum(v["min_wire"] for v in comm.values())
        payload = sum(r["payload"] for r in ranks) / nproc
        wire = sum(r["wire"] for r in ranks) / nproc
        apis, call_sizes = {}, {}
        for r in ranks:
            for k, (n, b) in r["calls"].items():
                apis[k] = apis.get(k, 0) + b / nproc
            for k, sizes in r["call_sizes"].items():
                for nb, count in sizes.items():
                    call_sizes.setdefault(k, {})[nb] = call_sizes.get(k, {}).get(nb, 0) + count / nproc
        top = ", ".join(f"{k} {fmt_bytes(v)}" for k, v in sorted(apis.items(), key=lambda kv: -kv[1])[:3])
        # plain dp: paddle.DataParallel's reducer all-reduces from C++, out of the Python shim's sight (wchar sees it)
        ratio = f"{payload / model_payload:.2f}x" if payload else "- (C++ reducer)"
        rows.append([name, fmt_bytes(model_payload), fmt_bytes(payload), ratio,
                     fmt_bytes(model_wire), fmt_bytes(wire), f"{wire / model_wire:.2f}x", top])
        trows.append([name, "wire within 1.1x of the model minimum", f"{wire / model_wire:.2f}x", met(wire <= 1.1 * model_wire)])
        # the measured wire explained: the counted calls priced with gloo's algorithms (what ran) and NCCL's
        gloo, nccl = priced_wire(call_sizes, "gloo"), priced_wire(call_sizes, "nccl")
        if payload and gloo is not None and nccl is not None:
            xrows.append([name, fmt_bytes(wire), fmt_bytes(gloo), f"{100 * (wire - gloo) / wire:+.1f}%",
                          fmt_bytes(nccl), fmt_bytes(model_wire), f"{wire / model_wire:.2f}x", f"{nccl / model_wire:.2f}x"])
            trows.append([name, "the same calls with NCCL's algorithms within 1.1x of the minimum",
                          f"{nccl / model_wire:.2f}x", met(nccl <= 1.1 * model_wire)])
        else:  # plain dp: the C++ reducer's calls are not counted; wchar is all there is
            xrows.append([name, fmt_bytes(wire), "- (C++ reducer)", "", "", fmt_bytes(model_wire),
                          f"{wire / model_wire:.2f}x", ""])
        if kw.get("sharding", 1) > 1:
            for r in ranks:
                srows.append([name, r["rank"], fmt_bytes(r["optim_bytes"]), f"{r['optim_bytes'] / (total_opt / nproc):.2f}",
                              fmt_bytes(r["param_bytes"]), f"{r['param_bytes'] / (total_par / nproc):.2f}"])
            worst = max(r["optim_bytes"] for r in ranks) / (total_opt / nproc)
            trows.append([name, "optimizer state per rank within 1.1x of 1/N", f"{worst:.2f}x", met(worst <= 1.1)])
    return rows, srows, trows, xrows


# ------------------------------------------------------------------------------------ table headers
PH = ["collective", "payload", "rank 0", "rank 1", "average", "wire_factor gloo", "wire_factor nccl"]
XH = ["layout", "measured wire", "gloo on the counted calls", "unexplained", "NCCL on the same calls", "model min wire",
      "measured / min", "NCCL / min"]


def worker_main(argv=None) -> None:
    """A launched worker of :func:`run_measure` (``--measure-worker``) or :func:`run_probe` (``--probe-worker``)."""
    p = argparse.ArgumentParser(description="one rank of cost_model.py --measure / --probe (launched by it)")
    p.add_argument("--measure-worker", metavar="LAYOUT", help="measure this layout (a key of LAYOUTS)")
    p.add_argument("--probe-worker", action="store_true", help="probe gloo's wire per collective")
    p.add_argument("--measure-hidden", type=int, default=None, help="the tiny Llama widened to this hidden size")
    p.add_argument("--result-dir", required=True, help="where this rank writes rank<r>.json")
    a = p.parse_args(argv)
    if a.measure_worker:
        a.layout = a.measure_worker
        return measure_worker(a)
    if a.probe_worker:
        return probe_worker(a)
    p.error("one of --measure-worker, --probe-worker is required")


if __name__ == "__main__":
    worker_main()
