"""Memory per rank of the public Trainer on each layout, measured beside the arithmetic.

A Llama (fp32, AdamW, micro-batch 1, one sequence of ``--seq`` tokens per step) trains ``--steps`` steps on
each layout of ``memory_worker.LAYOUTS`` (one launch each, under the machine-wide lock), at two model sizes.
Each rank reports (``memory_worker.py`` has the details):

* the fixed process baseline: memory after imports and topology init, before the model;
* the training state it holds, counted tensor by tensor (each storage once): parameters, gradients,
  optimizer state, master weights, and the communication buffers Python can reach;
* the peak: host RSS (``VmHWM``) on CPU, Paddle's ``max_memory_allocated`` on GPU; the peak of the whole
  run and that of the last step, and the memory before the last optimizer step.

Beside each measured part is the layout planner's prediction for the layout's busiest rank
(``paddletrainer.planning.predict_memory`` on the ``CPU-this-machine`` profile: its fixed baseline, the
state arithmetic, the activation estimate and the calibrated transient), and the error of the predicted peak.
"uncounted" is the memory before the last optimizer step minus the baseline and every counted tensor: what no
Python object shows (allocator slack). ``--raw FILE`` keeps every rank's measurements, so that ``--from-raw``
re-renders the table after a change of the model without launching anything.

The two sizes separate the per-layout terms from the fixed baseline: the slope of the peak between them,
in bytes per model parameter, against the predicted state bytes per model parameter.

    python scripts/bench_memory.py --tiny
    python scripts/bench_memory.py --markdown            # sizes small + large, every 2-rank layout (+ 4-rank at small)
    python scripts/bench_memory.py --sizes small --layouts single,dp2

``--long-context`` measures what sep (Ulysses) and cp (ring) buy instead: a Llama whose activations dominate
(``LONG_CONTEXT_SIZE``, recompute off) trains one sequence per step in one process at ``--seq`` S, 2S and 4S,
and under sep2, sep4, cp2 and cp4 at 4S; each run without a limit, then (``--data-limit-mib M``) again with
every rank's ``RLIMIT_DATA`` at M MiB, the budget Paddle's CPU allocator obeys (``memory_worker.py``):

    python scripts/bench_memory.py --long-context --seq 2048 --data-limit-mib 1400 --markdown
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_common import launch, machine_line, markdown_table, print_table, update_markdown_section  # noqa: E402
from memory_worker import LAYOUTS, LONG_CONTEXT_LAYOUTS  # noqa: E402

from paddletrainer.planning import CALIBRATION, Config, Layout, get_profile, predict_memory  # noqa: E402

WORKER = Path(__file__).resolve().parent / "memory_worker.py"
SIZES = {  # name: Llama shape (no GQA, untied head)
    "tiny": dict(hidden=64, layers=2, heads=4, intermediate=128, vocab=640),
    "tiny2": dict(hidden=128, layers=2, heads=4, intermediate=256, vocab=640),
    "small": dict(hidden=512, layers=4, heads=8, intermediate=1408, vocab=32000),
    "large": dict(hidden=1024, layers=8, heads=16, intermediate=2816, vocab=32000),
}
# activations dominate: attention scores grow with seq² per head, the weights are ~0.2M parameters
LONG_CONTEXT_SIZE = dict(hidden=64, layers=2, heads=4, intermediate=128, vocab=640)
TWO_RANK = [n for n, (k, _) in LAYOUTS.items() if k <= 2]
FOUR_RANK = [n for n, (k, _) in LAYOUTS.items() if k == 4]
MIB = 2**20
PARTS = ("params", "grads", "optimizer", "master", "comm_buffers")
CPU = get_profile("CPU-this-machine")


def total_params(size: dict) -> int:
    h, L, I, V = size["hidden"], size["layers"], size["intermediate"], size["vocab"]
    return 2 * V * h + L * (4 * h * h + 3 * h * I + 2 * h) + h


# ------------------------------------------------------------------------------------ predictions
def planner_layout(layout: str, size: dict, seq: int) -> tuple:
    """The planner's ``Config`` and ``Layout`` for a measured layout: micro-batch 1, accumulation pp (the
    worker's), fp32 (the CPU profile's dtype), no flash attention."""
    _, lay = LAYOUTS[layout]
    c = Config(hidden=size["hidden"], layers=size["layers"], heads=size["heads"], vocab=size["vocab"], seq=seq,
               intermediate=size["intermediate"])
    data = lay.get("dp", 1) * lay.get("sharding", 1)
    return c, Layout(dp=lay.get("dp", 1), sharding=lay.get("sharding", 1), stage=lay.get("stage", 0),
                     tp=lay.get("tp", 1), pp=lay.get("pp", 1), micro_batch=1, global_batch=data * lay.get("pp", 1),
                     recompute=bool(lay.get("recompute")), sequence_parallel=bool(lay.get("sequence_parallel")),
                     split_param=bool(lay.get("split_param")))


def predicted(layout: str, size: dict, seq: int) -> dict:
    """The planner's prediction (``planning.predict_memory`` on the CPU profile) for the busiest rank."""
    c, lay = planner_layout(layout, size, seq)
    return predict_memory(c, lay, CPU)


# ------------------------------------------------------------------------------------ running
def run_layout(layout: str, size_name: str, seq: int, steps: int) -> list:
    nproc, _ = LAYOUTS[layout]
    size = SIZES[size_name]
    with tempfile.TemporaryDirectory() as tmp:
        args = ["--layout", layout, "--seq", seq, "--steps", steps, "--result-dir", tmp,
                *[x for k, v in size.items() for x in (f"--{k}", v)]]
        launch(WORKER, nproc, args, os.path.join(tmp, "logs"), timeout=900)
        return [json.loads(Path(tmp, f"rank{r}.json").read_text()) for r in range(nproc)]


def _mib(x: float) -> str:
    return f"{x / MIB:,.0f}"


def _pair(measured: float, predicted: float) -> str:
    if predicted == 0:
        return _mib(measured) if measured else "0"
    return f"{_mib(measured)} / {_mib(predicted)} ({measured / predicted:.2f})"


def rank_rows(layout: str, size_name: str, ranks: list, seq: int) -> list:
    rows = []
    pred = predicted(layout, SIZES[size_name], seq)
    for r in ranks:
        counted = sum(r[k] for k in PARTS)
        uncounted = r["before_optimizer_step"] - r["baseline"] - counted
        rest = r["peak"] - r["baseline"] - counted  # activations + transient: what the peak holds beyond the state
        err = r["peak"] / pred["peak"] - 1
        rows.append([layout, size_name, r["rank"], _pair(r["baseline"], pred["baseline"]),
                     *[_pair(r[k], pred[k]) for k in PARTS], _mib(uncounted),
                     _pair(r["last_step_peak"] - r["last_step_start"], pred["activations"]),
                     _pair(rest, pred["activations"] + pred["transient"]), _mib(r["peak_before_training"]),
                     f"{r['peak'] / 2**30:.2f}", f"{pred['peak'] / 2**30:.2f}", f"{100 * err:+.1f}%"])
    return rows


HEADERS = ["layout", "size", "rank", "baseline MiB meas / pred (ratio)", "params MiB meas / pred (ratio)", "grads",
           "optimizer", "master", "comm buffers", "uncounted MiB", "last-step rise / activations pred",
           "peak - baseline - state / activations + transient pred", "peak before training MiB", "peak GiB",
           "pred peak GiB", "error"]
SLOPE_HEADERS = ["layout", "rank", "peak slope B/param", "pred peak slope B/param", "ratio", "intercept GiB",
                 "baseline GiB (small)"]


def slope_rows(results: dict, sizes: list, seq: int) -> list:
    """Per layout and rank: (peak_large − peak_small) / (N_large − N_small) beside the planner's."""
    rows = []
    if len(sizes) < 2:
        return rows
    s, l = sizes[0], sizes[1]
    ns, nl = total_params(SIZES[s]), total_params(SIZES[l])
    for layout in LAYOUTS:
        if (layout, s) not in results or (layout, l) not in results:
            continue
        for rs, rl in zip(results[(layout, s)], results[(layout, l)]):
            slope = (rl["peak"] - rs["peak"]) / (nl - ns)
            pred = (predicted(layout, SIZES[l], seq)["peak"] - predicted(layout, SIZES[s], seq)["peak"]) / (nl - ns)
            rows.append([layout, rs["rank"], f"{slope:.2f}", f"{pred:.2f}", f"{slope / pred:.2f}",
                         f"{(rs['peak'] - slope * ns) / 2**30:.2f}", f"{rs['baseline'] / 2**30:.2f}"])
    return rows


def calibration_line(rows: list) -> str:
    """The worst error of the table and where the planner's constants come from."""
    errors = [float(r[-1].rstrip("%")) for r in rows if r[-1].endswith("%")]
    worst = f"{max(errors, key=abs):+.1f}%" if errors else "n/a"
    return (f"Worst error {worst} over {len(errors)} ranks. The planner's activation factor and transient "
            f"({CALIBRATION}) were fitted on the 2026-11-25 20:00 run of this benchmark (its table is in "
            "docs/benchmarks.md as of commit 4429ade: peak minus the measured baseline and state; there every layout "
            "but dp within 5.7%); the CPU profile's baseline is this run's measured one (520 MiB; 559-564 MiB on "
            "2026-11-25 20:00).")


# ------------------------------------------------------------------------------------ long context
def long_context_plan(seq: int, layouts) -> list:
    """(layout, sequence length): one process at S, 2S, 4S; each sep/cp layout of ``layouts`` at 4S."""
    return [("single", seq), ("single", 2 * seq), ("single", 4 * seq)] + [(name, 4 * seq) for name in layouts]


def run_long_context(layout: str, seq: int, steps: int, limit_mib: int) -> list:
    """Every rank's result file; a rank refused memory under the limit writes ``out_of_memory`` (the launch
    then fails: its error is kept only when no rank says why)."""
    nproc = (LAYOUTS.get(layout) or LONG_CONTEXT_LAYOUTS[layout])[0]
    with tempfile.TemporaryDirectory() as tmp:
        args = ["--layout", layout, "--seq", seq, "--steps", steps, "--result-dir", tmp,
                "--data-limit-mib", limit_mib, *[x for k, v in LONG_CONTEXT_SIZE.items() for x in (f"--{k}", v)]]
        try:
            launch(WORKER, nproc, args, os.path.join(tmp, "logs"), timeout=900)
        except RuntimeError as e:
            found = [json.loads(f.read_text()) for f in sorted(Path(tmp).glob("rank*.json"))]
            if not any("out_of_memory" in r for r in found):
                raise
            print(f"{layout} @ {seq}: out of memory under {limit_mib} MiB\n{str(e)[-800:]}", file=sys.stderr)
            return found
        return [json.loads(Path(tmp, f"rank{r}.json").read_text()) for r in range(nproc)]


LONG_HEADERS = ["layout", "seq", "tokens per rank", "RLIMIT_DATA MiB", "outcome", "peak RSS MiB (max rank)",
                "baseline MiB", "last-step rise MiB", "peak / one process at S"]


def long_context_row(layout: str, seq: int, limit_mib: int, ranks: list, reference_peak) -> list:
    nproc = (LAYOUTS.get(layout) or LONG_CONTEXT_LAYOUTS[layout])[0]
    limit = str(limit_mib) if limit_mib else "none"
    oom = [r for r in ranks if "out_of_memory" in r]
    if oom:
        return [layout, seq, seq // nproc, limit, f"out of memory (rank {oom[0]['rank']}: {oom[0]['out_of_memory']})",
                "", "", "", ""]
    peak = max(r["peak"] for r in ranks)
    rise = max(r["last_step_peak"] - r["last_step_start"] for r in ranks)
    ratio = f"{peak / reference_peak:.2f}" if reference_peak else ""
    return [layout, seq, seq // nproc, limit, "trained", _mib(peak), _mib(max(r["baseline"] for r in ranks)),
            _mib(rise), ratio]


def long_context_main(a) -> None:
    rows, t0, reference = [], time.time(), {}
    for limit in [0] + ([a.data_limit_mib] if a.data_limit_mib else []):
        for layout, seq in long_context_plan(a.seq, a.layouts):
            try:
                ranks = run_long_context(layout, seq, a.steps, limit)
            except RuntimeError as e:
                print(f"{layout} @ {seq}: launch failed\n{str(e)[-3000:]}", file=sys.stderr)
                rows.append([layout, seq, "", limit or "none", "launch failed", "", "", "", ""])
                continue
            if (layout, seq) == ("single", a.seq) and "peak" in ranks[0] and "out_of_memory" not in ranks[0]:
                reference[limit] = ranks[0]["peak"]
            rows.append(long_context_row(layout, seq, limit, ranks, reference.get(limit)))
            print(f"{layout} @ {seq}, limit {limit or 'none'}: {rows[-1][4]} ({time.time() - t0:.0f} s)", flush=True)
    shape = ", ".join(f"{k} {v}" for k, v in LONG_CONTEXT_SIZE.items())
    title = f"Long context: peak memory per rank (fp32 AdamW, Llama {shape}, micro-batch 1, {a.steps} steps)"
    print_table(title, LONG_HEADERS, rows)
    print(f"\n{machine_line()}")
    if a.markdown:
        chosen = "" if a.layouts == list(LONG_CONTEXT_LAYOUTS) else f" --layouts {','.join(a.layouts)}"
        command = f"python scripts/bench_memory.py --long-context --seq {a.seq} --steps {a.steps}{chosen}" + (
            f" --data-limit-mib {a.data_limit_mib}" if a.data_limit_mib else "") + " --markdown"
        body = (f"Measured {machine_line()}; cpu; Llama {shape} (math attention in one process and under sep, "
                f"our ring attention under cp), fp32 AdamW, recompute off, one sequence per step, {a.steps} "
                f"steps, `{command}` ({time.time() - t0:.0f} s). RLIMIT_DATA is set in each rank before Paddle "
                "loads; peak RSS is `VmHWM`.\n\n" + markdown_table(LONG_HEADERS, rows))
        update_markdown_section("Long context: memory per rank (bench_memory.py --long-context)", body)


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tiny", action="store_true", help="sizes tiny,tiny2 and layouts single,dp2 (the smoke test)")
    p.add_argument("--sizes", default=None, help=f"two of {', '.join(SIZES)} (default: small,large)")
    p.add_argument("--layouts", default=None, help=f"comma list of {', '.join(LAYOUTS)} (default: every 1-2 rank one)")
    p.add_argument("--layouts4", default=None,
                   help=f"4-rank layouts run at the first size only (default: {','.join(FOUR_RANK)}; 'none' to skip)")
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--markdown", action="store_true", help="replace this benchmark's section of docs/benchmarks.md")
    p.add_argument("--raw", default=None,
                   help="JSON file: with a run, write every rank's measurements to it (after each layout); with "
                        "--from-raw, read them instead of running (re-render the table after a model change)")
    p.add_argument("--from-raw", action="store_true", help="render the table from --raw's file, launch nothing")
    p.add_argument("--long-context", action="store_true",
                   help="one process at --seq S, 2S, 4S and sep2/sep4/cp2/cp4 (or --layouts) at 4S (a model whose "
                        "activations dominate)")
    p.add_argument("--data-limit-mib", type=int, default=0,
                   help="with --long-context: run the plan again with every rank's RLIMIT_DATA at this many MiB")
    a = p.parse_args(argv)
    if a.long_context:
        if a.tiny or a.sizes or a.layouts4:
            p.error("--long-context takes its own model: drop --tiny/--sizes/--layouts4")
        a.layouts = (a.layouts or ",".join(LONG_CONTEXT_LAYOUTS)).split(",")
        for name in a.layouts:
            if name not in LONG_CONTEXT_LAYOUTS:
                p.error(f"--layouts with --long-context: unknown layout {name!r}; "
                        f"valid: {', '.join(LONG_CONTEXT_LAYOUTS)}")
        if a.seq < 2 or a.seq % 2 or a.steps < 2 or a.data_limit_mib < 0:
            p.error("--long-context needs an even --seq (4S splits into 2·cp4 = 8 chunks), --steps >= 2 and "
                    "--data-limit-mib >= 0")
        return a
    if a.data_limit_mib:
        p.error("--data-limit-mib is a --long-context option")
    a.sizes = (a.sizes or ("tiny,tiny2" if a.tiny else "small,large")).split(",")
    a.layouts = (a.layouts or ("single,dp2" if a.tiny else ",".join(TWO_RANK))).split(",")
    a.layouts4 = [] if a.tiny or a.layouts4 == "none" else (a.layouts4 or ",".join(FOUR_RANK)).split(",")
    for s in a.sizes:
        if s not in SIZES:
            p.error(f"--sizes: unknown size {s!r}; valid: {', '.join(SIZES)}")
    for name in a.layouts + a.layouts4:
        if name not in LAYOUTS:
            p.error(f"--layouts: unknown layout {name!r}; valid: {', '.join(LAYOUTS)}")
    if a.from_raw and not a.raw:
        p.error("--from-raw needs --raw FILE")
    if a.seq < 1 or a.steps < 2:
        p.error("--seq must be >= 1 and --steps >= 2")
    return a


def main(argv=None) -> None:
    a = parse(argv)
    if a.long_context:
        long_context_main(a)
        return
    plan = [(lay, s) for s in a.sizes for lay in a.layouts] + [(lay, a.sizes[0]) for lay in a.layouts4]
    results, rows, t0 = {}, [], time.time()
    saved = json.loads(Path(a.raw).read_text()) if a.from_raw else {}
    # what the run was: its machine line and duration (a file written before "_meta" existed: say so)
    meta = saved.pop("_meta", f"(raw file {a.raw}, no machine line recorded)") if a.from_raw else None
    saved = {tuple(k.split("@")): v for k, v in saved.items()}
    for layout, size_name in plan:
        try:
            results[(layout, size_name)] = saved.get((layout, size_name)) if a.from_raw else \
                run_layout(layout, size_name, a.seq, a.steps)
        except RuntimeError as e:
            print(f"{layout} @ {size_name}: launch failed\n{str(e)[-3000:]}", file=sys.stderr)
            results[(layout, size_name)] = None
        if results[(layout, size_name)] is None:
            del results[(layout, size_name)]
            rows.append([layout, size_name, "not measured", *[""] * (len(HEADERS) - 3)])
            continue
        if a.raw and not a.from_raw:
            meta = f"{machine_line()}, {time.time() - t0:.0f} s"
            Path(a.raw).write_text(json.dumps({"_meta": meta, **{f"{k[0]}@{k[1]}": v for k, v in results.items()}}))
        rows += rank_rows(layout, size_name, results[(layout, size_name)], a.seq)
        print(f"{layout} @ {size_name}: done ({time.time() - t0:.0f} s)", flush=True)
    sizes_line = "; ".join(f"{s}: {total_params(SIZES[s]) / 1e6:.1f}M parameters "
                           f"({', '.join(f'{k} {v}' for k, v in SIZES[s].items())})" for s in a.sizes)
    device = next(iter(results.values()))[0]["device"] if results else "?"
    print_table(f"Memory per rank (fp32 AdamW, seq {a.seq}, micro-batch 1, {a.steps} steps, {device})", HEADERS, rows)
    slopes = slope_rows(results, a.sizes, a.seq)
    print_table("Peak slope per model parameter between the two sizes", SLOPE_HEADERS, slopes)
    print(f"\n{sizes_line}\n{machine_line()}")
    if a.markdown:
        how = (f"measured {meta}, `python scripts/bench_memory.py --raw FILE`, rendered with `--from-raw --markdown`"
               if a.from_raw else f"measured {machine_line()}, `python scripts/bench_memory.py --markdown` "
               f"({time.time() - t0:.0f} s)")
        body = (f"{how[0].upper() + how[1:]}; device {device}; {sizes_line}. fp32 AdamW, seq {a.seq}, micro-batch 1, "
                f"{a.steps} steps. Cells are `measured / predicted (ratio)` in MiB; the prediction is the layout "
                "planner's for the busiest rank (`paddletrainer.planning.predict_memory`, profile "
                "`CPU-this-machine`), error = measured peak / predicted - 1. " + calibration_line(rows) + "\n\n"
                + markdown_table(HEADERS, rows)
                + "\n\n### Peak slope per model parameter\n\n" + markdown_table(SLOPE_HEADERS, slopes))
        update_markdown_section("Memory per rank (bench_memory.py)", body)


if __name__ == "__main__":
    main()
