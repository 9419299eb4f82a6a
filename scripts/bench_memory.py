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
from memory_worker import LAYOUTS  # noqa: E402

from paddletrainer.planning import CALIBRATION, Config, Layout, get_profile, predict_memory  # noqa: E402

WORKER = Path(__file__).resolve().parent / "memory_worker.py"
SIZES = {  # name: Llama shape (no GQA, untied head)
    "tiny": dict(hidden=64, layers=2, heads=4, intermediate=128, vocab=640),
    "tiny2": dict(hidden=128, layers=2, heads=4, intermediate=256, vocab=640),
    "small": dict(hidden=512, layers=4, heads=8, intermediate=1408, vocab=32000),
    "large": dict(hidden=1024, layers=8, heads=16, intermediate=2816, vocab=32000),
}
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
    a = p.parse_args(argv)
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
