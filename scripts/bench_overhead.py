"""Per-step overhead of ``paddletrainer.Trainer`` against a bare Paddle loop and ``paddlenlp.trainer.Trainer``.

The same model, data and number of steps, three ways, each with the optimizer and clip it uses by default:

* **bare**: the tightest loop a user would write: ``paddle.io.DataLoader`` (shuffle, drop_last), forward,
  ``loss.backward()``, ``paddle.optimizer.AdamW(grad_clip=paddle.nn.ClipGradByGlobalNorm)``, ``step``,
  ``clear_grad``, LR schedule step, and every ``logging_steps`` one ``float(loss)`` (the log);
* **paddletrainer**: ``paddletrainer.Trainer`` with its defaults: ``paddletrainer.optim.optimization.AdamW`` (Paddle's
  AdamW, bit-identical results and state, whose ``step`` makes the same ``_C_ops.adamw_`` calls without
  Paddle's per-parameter Python) and no ``grad_clip`` on the optimizer: the Trainer clips itself
  (``parallel.clip_grad_norm``: one fused squared-L2 kernel per gradient, the scale applied in place);
* **paddlenlp**: ``paddlenlp.trainer.Trainer`` with its defaults: ``paddle.optimizer.AdamW`` with
  ``grad_clip=ClipGradByGlobalNorm``, as the bare loop.

So the optimizer step and the clip are not the same code in the three: "vs bare" and "faster than paddlenlp"
compare the products as a user gets them, the Trainer's own optimizer step and clip included, not the loop
overhead alone (``--profile`` shows the clip's and the step's share of a step). The same math in all three:
AdamW (lr 5e-5, linear schedule, no warmup, weight decay 0), clip by global norm 1.0; and the same settings:
same per-device batch, log every ``--logging-steps``, no evaluation, no checkpoint saves, no tqdm,
``report_to none``, dataloader in the main process, fp32, and on dp2 ``DataParallel`` without the per-step
search for unused parameters (``ddp_find_unused_parameters=False``, the bare loop's default). Each run's
first ``--warmup`` steps are excluded: steps/s = (steps - warmup) / (the timed steps' durations summed).
Peak RSS is the process's VmHWM, reset before every run (Linux ``clear_refs``): it includes the process
baseline (paddle and paddlenlp imported), so compare differences.

Interleaved repetitions, so that load drift on a shared machine hits the three alike: a repetition runs
bare, paddletrainer and paddlenlp back to back (the order reversed every other repetition), each a run of
its own. Each repetition runs paddletrainer's and PaddleNLP's Trainer (order alternating), each with one
step of a bare loop (its own model, optimizer and loader) after every one of its steps, both timed step by
step (:func:`one_paired_run`), after an untimed warm-up run of each runner: "vs bare" is each run's own
ratio, and "faster than paddlenlp" the ratio of the two runs' ratios. 1 process: all in one process;
``--dp2``: one ``paddle.distributed.launch`` per workload (``--dp2-reps``, default 10). Runs of whole
loops back to back differed too much: a runner's speed varied by 5-20% between runs seconds apart (and by
±10% from launch to launch on dp2), more than the effect measured; steps ~0.1 s apart share that drift
(per-repetition ratios then agree within ~2%). Each run records the 1-minute load average at its end.
steps/s is the median over repetitions; the ratios ("vs bare", "faster than paddlenlp") are the medians of
each repetition's own ratio (runs seconds apart, under the same load), not ratios of medians.

Workloads (``overhead_workloads.py``, with the three loops): a tiny ERNIE sequence-classification fine-tune
(``ErnieForSequenceClassification``, random ids) and a tiny Llama causal LM (``LlamaForCausalLM``); ``--tiny``
shrinks both for the smoke test.
The single-process runs hold the machine's multi-process lock (``/tmp/paddletrainer-mp.lock``), the dp2 launches
take it too, and the load average is recorded at the start, after the 1-process runs and after dp2.
``--profile`` runs cProfile over paddletrainer's and the bare loop's steps and prints where the per-step time
goes (inclusive seconds per step of the loop's parts).

    python scripts/bench_overhead.py --tiny
    python scripts/bench_overhead.py --dp2 --profile --markdown
"""
from __future__ import annotations

import argparse
import cProfile
import contextlib
import fcntl
import gc
import io
import json
import logging
import os
import pstats
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402

from bench_common import (  # noqa: E402
    LOCK, launch, machine_line, markdown_table, median, met, peak_rss_bytes, peak_rss_reset, print_table,
    update_markdown_section,
)
from overhead_workloads import (  # noqa: E402
    RUN, RUNNERS, BareLoop, build_dataset, build_model, loss_of, run_paddletrainer, workloads,
)

SHORT = {"bare": "bare", "paddletrainer": "pt", "paddlenlp": "nlp"}


# What differs between the runners besides the loop, printed with every table (see the module docstring).
OPTIMIZER_NOTE = (
    "What is compared: each runner with its own default optimizer and clip, as a user gets it. The bare loop and "
    "PaddleNLP's Trainer use `paddle.optimizer.AdamW` with `grad_clip=ClipGradByGlobalNorm(1.0)`; paddletrainer's "
    "Trainer uses `paddletrainer.optim.optimization.AdamW` (the same `_C_ops.adamw_` calls and bit-identical results, "
    "without Paddle's per-parameter Python in `step`) and clips with its own fused-norm `clip_grad_norm`. So "
    "\"vs bare\" and \"faster than paddlenlp\" include the optimizer step and the clip, not only the loop's overhead.")


def one_paired_run(runner, spec, dataset, steps, warmup, logging_steps, world_size) -> dict:
    """A trainer run with one bare-loop step after each of its steps: both timed step by step, alternating.

    After the trainer's step ``k`` ends (its ``on_step_end``), the bare loop (its own model, optimizer and
    loader) runs one step; the trainer's step ``k + 1`` is timed from the end of that bare step to its own
    ``on_step_end`` (so it holds everything the trainer does between two steps: logging check, data, forward,
    backward, optimizer). Adjacent steps ~0.1 s apart share whatever the machine is doing, which runs of
    seconds (and launches) do not. Returns both steps/s over the steps after ``warmup``.
    """
    gc.collect()
    peak_rss_reset()
    bare = BareLoop(spec, dataset, steps, logging_steps, world_size)
    trainer_s, bare_s, resumed = [], [], []

    def bare_step():
        if resumed:
            trainer_s.append(time.perf_counter() - resumed[-1])
        t0 = time.perf_counter()
        bare.step()
        t1 = time.perf_counter()
        bare_s.append(t1 - t0)
        resumed.append(t1)

    RUN[runner](spec, dataset, steps, logging_steps, world_size, on_step_end=bare_step)
    if len(bare_s) != steps:
        raise RuntimeError(f"{runner} ran {len(bare_s)} steps, expected {steps}")
    timed = steps - warmup  # trainer steps warmup+1..steps, bare steps warmup+1..steps
    return {"steps_per_s": timed / sum(trainer_s[-timed:]), "bare_steps_per_s": timed / sum(bare_s[-timed:]),
            "peak_rss": peak_rss_bytes(), "load": os.getloadavg()[0]}


def summarize(runs: dict, spec: dict, world_size: int) -> dict:
    """runner -> median steps/s, samples/s, tokens/s, median ratio to the bare loop of its own runs (and to
    paddlenlp), peak RSS (MiB), and the repetitions themselves."""
    out = {}
    for runner, rs in runs.items():
        if not rs:
            continue
        sps = median(r["steps_per_s"] for r in rs)
        samples = sps * spec["batch"] * world_size
        out[runner] = dict(steps_per_s=sps, samples_per_s=samples, tokens_per_s=samples * spec["seq"],
                           ratio=1.0 if runner == "bare" else median(r["vs_bare"] for r in rs),
                           peak_rss_mib=max(r["peak_rss"] for r in rs) / 2**20, reps=len(rs),
                           spread=(min(r["steps_per_s"] for r in rs), max(r["steps_per_s"] for r in rs)), runs=rs)
        if runner == "paddletrainer" and runs.get("paddlenlp"):
            out[runner]["vs_paddlenlp"] = _stepwise_vs(runs, "paddletrainer", "paddlenlp")
    return out


def _stepwise_vs(runs: dict, num: str, den: str) -> float:
    """Median over repetitions of ``num``'s ratio to the bare loop over ``den``'s (each measured step by step
    against its own bare loop; the two runs of a repetition are back to back)."""
    by_rep = {r["rep"]: r["vs_bare"] for r in runs[den]}
    return median(r["vs_bare"] / by_rep[r["rep"]] for r in runs[num] if r["rep"] in by_rep)


def paired_reps(spec, dataset, steps, warmup, reps, logging_steps, world_size,
                trainers=("paddletrainer", "paddlenlp")):
    """An untimed warm-up run of each runner, then ``reps`` repetitions of the trainers in ``trainers`` (order
    alternating), each run with a bare-loop step after every one of its steps (:func:`one_paired_run`).

    Returns runner -> runs; the bare rows are the bare loop's steps inside the first trainer's runs. The
    warm-up runs paddletrainer first: with several processes its Trainer initialises the global process
    group (``init_parallel_env``) that the bare loop's DataParallel and PaddleNLP's Trainer then use."""
    for runner in ("paddletrainer", "bare", "paddlenlp"):
        if runner == "bare" or runner in trainers:
            RUN[runner](spec, dataset, warmup + 2, logging_steps, world_size)
    runs = {r: [] for r in ("bare",) + tuple(trainers)}
    for rep in range(reps):
        for position, runner in enumerate(trainers if rep % 2 == 0 else trainers[::-1]):
            run = one_paired_run(runner, spec, dataset, steps, warmup, logging_steps, world_size)
            run.update(rep=rep, position=position, vs_bare=run["steps_per_s"] / run["bare_steps_per_s"])
            runs[runner].append(run)
            if runner == trainers[0]:
                bare = dict(run, steps_per_s=run["bare_steps_per_s"])
                del bare["vs_bare"]
                runs["bare"].append(bare)
    return runs


def measure_single(specs, steps, warmup, reps, logging_steps, runners=RUNNERS) -> dict:
    """1 process: :func:`paired_reps` per workload, in this process."""
    trainers = tuple(r for r in ("paddletrainer", "paddlenlp") if r in runners)
    results = {}
    for name, spec in specs.items():
        dataset = build_dataset(spec, spec["batch"] * (steps + 2))
        results[name] = summarize(paired_reps(spec, dataset, steps, warmup, reps, logging_steps, 1, trainers), spec, 1)
    return results


# ------------------------------------------------------------------------------------ profile
# The loop's parts, by the function that does them: (label, file fragment, function name).
PROFILE_PARTS = [
    ("Trainer.train total incl. setup (per step)", "paddletrainer/trainer.py", "train"),
    ("data: _read_step (DataLoader + collate + on_load_data_end)", "paddletrainer/trainer.py", "_read_step"),
    ("forward+backward: training_step", "paddletrainer/trainer.py", "training_step"),
    ("  model.train() per micro-batch", "paddle/nn/layer/layers.py", "train"),
    ("  _prepare_inputs", "paddletrainer/trainer.py", "_prepare_inputs"),
    ("  compute_loss (forward)", "paddletrainer/trainer.py", "compute_loss"),
    ("optimizer: _optimizer_step", "paddletrainer/trainer.py", "_optimizer_step"),
    # one process: the optimizer's mode is data_parallel.LocalOptimizer, which defines the step's operations
    ("  named_counted_gradients", "paddletrainer/parallel/data_parallel.py", "named_counted_gradients"),
    ("  clip_named_gradients (norm + clip)", "paddletrainer/parallel/clipping.py", "clip_named_gradients"),
    ("  LocalOptimizer.step (AdamW update)", "paddletrainer/parallel/data_parallel.py", "step"),
    ("  clear_grad", "paddletrainer/parallel/data_parallel.py", "clear_grad"),
    ("  lr_scheduler.step", "paddle/optimizer/lr.py", "step"),
    ("callbacks: CallbackHandler.call_event", "paddletrainer/trainer_callback.py", "call_event"),
    ("throughput: ThroughputMeter.update", "paddletrainer/metrics/throughput.py", "update"),
    ("log/save/eval check: _maybe_log_save_evaluate", "paddletrainer/trainer.py", "_maybe_log_save_evaluate"),
]
BARE_PARTS = [
    ("bare: run_bare total incl. setup (per step)", "overhead_workloads.py", "run_bare"),
    ("bare: ClipGradByGlobalNorm", "paddle/nn/clip.py", "_dygraph_clip"),
    ("bare: AdamW.step (incl. clip)", "paddle/optimizer/adamw.py", "step"),
]


def _cum_by(stats: pstats.Stats, fragment: str, func: str) -> float:
    total = 0.0
    for (filename, _line, name), (_cc, _nc, _tt, ct, _callers) in stats.stats.items():
        if name == func and filename.replace(os.sep, "/").endswith(fragment) or (
                name == func and fragment in filename.replace(os.sep, "/")):
            total += ct
    return total


def profile(spec, steps, logging_steps) -> list:
    """[(part, ms per step)] for paddletrainer's loop and the bare loop, under cProfile (inflates Python)."""
    dataset = build_dataset(spec, spec["batch"] * (steps + 2))
    rows = []
    for runner, parts in (("paddletrainer", PROFILE_PARTS), ("bare", BARE_PARTS)):
        RUN[runner](spec, dataset, max(2, steps // 5), logging_steps)  # warm caches outside the profile
        prof = cProfile.Profile()
        prof.enable()
        RUN[runner](spec, dataset, steps, logging_steps)
        prof.disable()
        stats = pstats.Stats(prof, stream=io.StringIO())
        for label, fragment, func in parts:
            rows.append((label, 1000 * _cum_by(stats, fragment, func) / steps))
    return rows


def micro_costs(spec, repeat: int = 200) -> list:
    """[(what, microseconds per call)]: the pieces of paddletrainer's step that the bare loop does not
    have or does differently, timed directly (no profiler) on the workload's model and real gradients."""

    import paddle

    from paddletrainer.parallel import clip_grad_norm
    from paddletrainer.parallel.data_parallel import LocalOptimizer
    from paddletrainer.parallel.topology import Topology

    model = build_model(spec)
    batch = build_dataset(spec, spec["batch"])
    inputs = {k: paddle.to_tensor(np.stack([b[k] for b in batch])) for k in batch[0]}
    loss_of(model(**inputs)).backward()
    params_grads = [(p, p.grad) for p in model.parameters() if p.grad is not None]
    topo = Topology.of()  # one process
    popt = LocalOptimizer(paddle.optimizer.AdamW(parameters=model.parameters()), topology=topo)
    popt.sync_gradients()
    # max_norm so large that neither clips: clip_grad_norm scales in place, so an active clip would make
    # every later call see an already-clipped gradient; this compares the norm computations alike.
    big = 1e9
    paddle_clip = paddle.nn.ClipGradByGlobalNorm(big)
    norm = paddle.ones([], "float32")

    def per_call(fn):
        for _ in range(5):
            fn()
        ts = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
        return 1e6 * median(ts)

    n = len(params_grads)
    return [
        (f"paddletrainer clip_grad_norm ({n} grads; squared-L2 norm + clip, no host read)", per_call(lambda: clip_grad_norm(model, popt, topo, big))),
        ("paddle ClipGradByGlobalNorm, same grads (bare loop and PaddleNLP)", per_call(lambda: paddle_clip(params_grads))),
        ("  named_counted_gradients() (called once per step)", per_call(popt.named_counted_gradients)),
        ("model.train() (only after an evaluation now)", per_call(model.train)),
        ("float(norm) host read (now only at logging steps)", per_call(lambda: float(norm))),
    ]


def pyinstrument_text(spec, steps, logging_steps) -> str:
    try:
        from pyinstrument import Profiler
    except ImportError:
        return "(pyinstrument not installed)"
    dataset = build_dataset(spec, spec["batch"] * (steps + 2))
    p = Profiler(interval=0.0005)
    p.start()
    run_paddletrainer(spec, dataset, steps, logging_steps)
    p.stop()
    return p.output_text(unicode=False, color=False, show_all=False)


# ------------------------------------------------------------------------------------ dp2
def dp2_worker(a) -> None:
    """Inside ``paddle.distributed.launch``: :func:`paired_reps` on 2 processes; rank 0 writes the runs.

    Everything shares each process, so the bare loop and PaddleNLP's Trainer run with what paddletrainer's
    Trainer set up first: the global process group and its CPU backend's fills (``parallel.cpu.install``),
    which replace gloo's missing subgroup store, reduce-scatter and the like, not the all-reduce dp2 uses."""
    import paddle.distributed as dist

    world = int(os.environ.get("PADDLE_TRAINERS_NUM", "1"))
    spec = workloads(a.tiny)[a.workload]
    dataset = build_dataset(spec, spec["batch"] * world * (a.steps + 2))
    runs = paired_reps(spec, dataset, a.steps, a.warmup, a.reps, a.logging_steps, world)
    if dist.get_rank() == 0:
        Path(a.result).write_text(json.dumps(runs))


def measure_dp2(a, specs) -> dict:
    """One 2-process launch per workload, each trainer's steps interleaved with a bare loop's (see
    :func:`dp2_worker`).

    Not one launch per run, nor runs interleaved: the same runner's speed differs by up to ±10% from one
    launch to the next and ±5-15% between runs seconds apart (two processes on two cores), more than the
    effect measured; steps ~0.1 s apart share it."""
    results = {}
    for name, spec in specs.items():
        with tempfile.TemporaryDirectory() as tmp:
            res = os.path.join(tmp, "res.json")
            try:
                launch(__file__, 2, ["--worker", "--workload", name, "--steps", a.steps, "--warmup", a.warmup,
                                     "--reps", a.dp2_reps, "--logging-steps", a.logging_steps, "--result", res]
                       + (["--tiny"] if a.tiny else []), os.path.join(tmp, "logs"), timeout=1800)
            except RuntimeError as e:  # report it and go on: the other tables still print
                print(f"dp2 {name} failed:\n{str(e)[-3000:]}", file=sys.stderr)
                continue
            results[name] = summarize(json.loads(Path(res).read_text()), spec, 2)
    return results


# ------------------------------------------------------------------------------------ report
HEADERS = ["workload", "layout", "runner", "steps/s", "samples/s", "tokens/s", "vs bare", "peak RSS MiB",
           "reps (min..max steps/s)"]


def table_rows(results: dict, layout: str) -> list:
    rows = []
    for name, by_runner in results.items():
        for runner, r in by_runner.items():
            rows.append([name, layout, runner, r["steps_per_s"], r["samples_per_s"], r["tokens_per_s"],
                         f"{r['ratio']:.3f}x", r["peak_rss_mib"],
                         f"{r['reps']} ({r['spread'][0]:.2f}..{r['spread'][1]:.2f})"])
    return rows


REP_HEADERS = ["workload", "layout", "rep", "order", "bare", "paddletrainer (pt)", "paddlenlp (nlp)", "pt / bare",
               "pt / nlp", "load (1 min) at each run's end"]


def rep_rows(results: dict, layout: str) -> list:
    """One row per repetition: each runner's steps/s, the repetition's ratios and the load of its runs."""
    rows = []
    for name, by_runner in results.items():
        by_rep = {}
        for runner, r in by_runner.items():
            for run in r["runs"]:
                by_rep.setdefault(run["rep"], {})[runner] = run
        for rep in sorted(by_rep):
            runs = by_rep[rep]
            sps = {x: runs[x]["steps_per_s"] for x in runs}
            order = sorted((x for x in runs if x != "bare"), key=lambda x: runs[x]["position"])
            vs = {x: runs[x]["vs_bare"] for x in order}
            pt_bare = f"{vs['paddletrainer']:.3f}" if "paddletrainer" in vs else "-"
            pt_nlp = f"{vs['paddletrainer'] / vs['paddlenlp']:.3f}" if len(vs) == 2 else "-"
            order_text = " > ".join(f"{SHORT[x]}+bare" for x in order)
            rows.append([name, layout, rep, order_text, *(sps.get(x, float("nan")) for x in RUNNERS),
                         pt_bare, pt_nlp, " ".join(f"{runs[x]['load']:.1f}" for x in order)])
    return rows


def targets(results_by_layout: dict) -> list:
    rows = []
    for layout, results in results_by_layout.items():
        for name, r in results.items():
            pt = r.get("paddletrainer")
            if pt is None:
                continue
            rows.append([name, layout, "paddletrainer >= 0.99x bare", f"{pt['ratio']:.3f}x", met(pt["ratio"] >= 0.99)])
            if "vs_paddlenlp" in pt:
                rows.append([name, layout, "paddletrainer faster than paddlenlp", f"{pt['vs_paddlenlp']:.3f}x",
                             met(pt["vs_paddlenlp"] > 1.0)])
    return rows


def _load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tiny", action="store_true", help="small models and few steps (smoke test, < 60 s)")
    p.add_argument("--steps", type=int, default=None, help="steps per run (default 12 tiny, 40 full)")
    p.add_argument("--warmup", type=int, default=None, help="excluded first steps (default 3 tiny, 5 full)")
    p.add_argument("--reps", type=int, default=None, help="repetitions per runner (default 2 tiny, 5 full)")
    p.add_argument("--logging-steps", type=int, default=10)
    p.add_argument("--workloads", default="ernie-cls,llama-clm")
    p.add_argument("--runners", default=",".join(RUNNERS),
                   help="which trainers (paddletrainer,paddlenlp) to compare with the bare loop in the single process")
    p.add_argument("--dp2", action="store_true",
                   help="also run the comparison on 2 processes (one launch per workload)")
    p.add_argument("--dp2-reps", type=int, default=None,
                   help="repetitions per runner on 2 processes (default 2 tiny, 10)")
    p.add_argument("--profile", action="store_true", help="cProfile paddletrainer's per-step path")
    p.add_argument("--pyinstrument", action="store_true", help="also print a pyinstrument tree")
    p.add_argument("--markdown", action="store_true", help="update docs/benchmarks.md")
    # internal: dp2 worker mode
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--workload", help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    a.steps = a.steps or (12 if a.tiny else 40)
    a.warmup = a.warmup or (3 if a.tiny else 5)
    a.reps = a.reps or (2 if a.tiny else 5)
    a.dp2_reps = a.dp2_reps or (2 if a.tiny else 10)
    logging.disable(logging.WARNING)  # the trainers' per-log INFO lines are not what we measure
    os.environ.setdefault("GLOG_v", "0")
    if a.worker:
        return dp2_worker(a)

    specs = {k: v for k, v in workloads(a.tiny).items() if k in a.workloads.split(",")}
    print(machine_line())
    print(f"steps={a.steps} warmup={a.warmup} reps={a.reps} dp2_reps={a.dp2_reps} "
          f"logging_steps={a.logging_steps} tiny={a.tiny}")
    loads = [f"start {_load()}"]
    with contextlib.redirect_stdout(io.StringIO()), open(LOCK, "a") as lock:  # the trainers' own printed logs
        fcntl.flock(lock, fcntl.LOCK_EX)  # no test launch of the others while the 1-process runs are timed
        runners = tuple(r for r in RUNNERS if r in a.runners.split(","))
        single = measure_single(specs, a.steps, a.warmup, a.reps, a.logging_steps, runners=runners)
    loads.append(f"after 1 proc {_load()}")
    by_layout = {"1 proc": single}
    rows = table_rows(single, "1 proc")
    if a.dp2:  # print the single-process table now: the launches can wait a while for the machine's lock
        print_table("Training-loop overhead, 1 process (median steps/s after warmup)", HEADERS, rows)
        dp2 = measure_dp2(a, specs)  # each launch takes the lock itself
        loads.append(f"after dp2 {_load()}")
        by_layout["dp2"] = dp2
        rows += table_rows(dp2, "dp2")
    print_table("Training-loop overhead (median steps/s after warmup)", HEADERS, rows)
    rrows = [row for layout, results in by_layout.items() for row in rep_rows(results, layout)]
    print_table("Repetitions (steps/s; runs in the order shown, each rep's runs back to back)", REP_HEADERS, rrows)
    trows = targets(by_layout)
    print_table("Targets", ["workload", "layout", "target", "value", "status"], trows)
    print(OPTIMIZER_NOTE)

    prof_rows, micro_rows = [], []
    if a.profile:
        spec = specs[next(iter(specs))]
        with contextlib.redirect_stdout(io.StringIO()):
            prof_rows = profile(spec, a.steps, a.logging_steps)
        print_table(f"Where a step goes (cProfile, {next(iter(specs))}, ms per step, inclusive)",
                    ["part", "ms/step"], prof_rows)
        micro_rows = micro_costs(spec)
        print_table(f"Per-call cost of paddletrainer-only step pieces ({next(iter(specs))}, median us)",
                    ["piece", "us/call"], micro_rows)
    if a.pyinstrument:
        spec = specs[next(iter(specs))]
        with contextlib.redirect_stdout(io.StringIO()):
            text = pyinstrument_text(spec, a.steps, a.logging_steps)
        print(text)

    if a.markdown:
        body = [f"Machine: {machine_line()}.",
                f"`python scripts/bench_overhead.py {' '.join(argv if argv is not None else sys.argv[1:])}` "
                f"(steps={a.steps}, warmup={a.warmup}, reps={a.reps} (dp2: {a.dp2_reps}), "
                f"logging every {a.logging_steps}).",
                f"Load average (1/5/15 min) during the run: {'; '.join(loads)}.",
                "Method: each repetition runs paddletrainer's and PaddleNLP's Trainer (order alternating), each "
                "with one bare-loop step after every one of its steps, timed step by step (1 process: one process; "
                "dp2: one launch per workload), so load drift hits the trainer and the bare loop alike; steps/s "
                "is the median over repetitions, the ratios are medians of each run's own ratio to its bare "
                "loop (pt / nlp: of the two runs' ratios).", "",
                OPTIMIZER_NOTE, "",
                markdown_table(HEADERS, rows), "", "Targets (ratios: median over repetitions of each repetition's ratio):", "",
                markdown_table(["workload", "layout", "target", "value", "status"], trows), "",
                "Repetitions (steps/s; each repetition's runs back to back in the order shown; the load is the "
                "1-minute average at the end of each run, in that order):", "", markdown_table(REP_HEADERS, rrows)]
        if prof_rows:
            body += ["", "Per-step breakdown of paddletrainer vs the bare loop (cProfile; inflates Python-heavy parts):", "",
                     markdown_table(["part", "ms/step"], prof_rows), "",
                     "Per-call cost of the step pieces that differ from the bare loop (timed directly, median):", "",
                     markdown_table(["piece", "us/call"], micro_rows)]
        update_markdown_section("Training-loop overhead (bench_overhead.py)", "\n".join(body))


if __name__ == "__main__":
    main()
