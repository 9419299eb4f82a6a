"""Time to the first step: ``paddletrainer.Trainer`` against a bare Paddle script doing the same set-up, phase by phase.

``startup_worker.py`` runs one start either way (its docstring has the two scripts) and reports the seconds of
each phase from the process's start: ``import``, ``topology`` (process groups), ``model`` (build), ``optimizer``
(and the sharded/hybrid optimizer), ``wrap`` (the parallel wrappers), ``first_batch``, ``first_step``; the
Trainer's ``other`` is its own bookkeeping. Two layouts: 1 process, and 8 CPU processes with dp2·tp2·pp2 (one
``paddle.distributed.launch`` each). Runs alternate bare/Trainer (the order reversed every other repetition) so
that load drift on a shared machine hits both alike; every run takes the machine-wide lock and records the
1-minute load average at its end. A cell is the median over repetitions of the mean over ranks, with the
spread (min–max) of the per-run totals; "Trainer / bare" is the median of each repetition's own ratio.

    python scripts/bench_startup.py --reps 3
    python scripts/bench_startup.py --reps 5 --markdown     # also replaces the section in docs/benchmarks.md
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_common import LOCK, PYTHON, REPO, launch, machine_line, markdown_table, median, print_table, update_markdown_section  # noqa: E402

WORKER = Path(__file__).resolve().parent / "startup_worker.py"
PHASES = ("import", "topology", "model", "optimizer", "wrap", "first_batch", "first_step", "other")
LAYOUTS = {"1 process": dict(nproc=1, tp=1, pp=1), "8 processes dp2·tp2·pp2": dict(nproc=8, tp=2, pp=2)}
SECTION = "Time to the first step (bench_startup.py)"


def load_average() -> float:
    return os.getloadavg()[0]


def one_run(runner: str, layout: dict, work: Path) -> dict:
    """One start; returns the phases averaged over ranks, the slowest rank's total and the load at its end."""
    result = work / "result"
    args = ["--runner", runner, "--tp", layout["tp"], "--pp", layout["pp"], "--result-dir", result]
    if layout["nproc"] == 1:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
        subprocess.run(["flock", LOCK, PYTHON, str(WORKER), *map(str, args)], env=env, check=True,
                       capture_output=True)
    else:
        launch(WORKER, layout["nproc"], args, str(work / "log"), timeout=900)
    ranks = [json.loads((result / f"rank{r}.json").read_text())["phases"] for r in range(layout["nproc"])]
    phases = {p: sum(r.get(p, 0.0) for r in ranks) / len(ranks) for p in PHASES}
    return {"phases": phases, "total": max(r["total"] for r in ranks), "load": load_average()}


def measure(layout: dict, reps: int) -> list:
    """``reps`` repetitions, each a bare and a Trainer run (alternating order)."""
    out = []
    for rep in range(reps):
        order = ("bare", "trainer") if rep % 2 == 0 else ("trainer", "bare")
        pair = {}
        for runner in order:
            with tempfile.TemporaryDirectory(prefix="bench_startup_") as tmp:
                pair[runner] = one_run(runner, layout, Path(tmp))
            print(f"  rep {rep + 1}/{reps} {runner}: {pair[runner]['total']:.1f} s (load {pair[runner]['load']:.1f})",
                  flush=True)
        out.append(pair)
    return out


def _cell(values: list) -> str:
    return f"{median(values):.2f}" if len(values) == 1 else f"{median(values):.2f} ({min(values):.1f}–{max(values):.1f})"


def rows_of(name: str, reps: list) -> list:
    """One row per phase and a total row: bare, Trainer, Trainer − bare (medians; spread in parentheses)."""
    rows = []
    for phase in PHASES:
        bare = [r["bare"]["phases"][phase] for r in reps]
        ours = [r["trainer"]["phases"][phase] for r in reps]
        rows.append([name, phase, _cell(bare), _cell(ours), f"{median(o - b for o, b in zip(ours, bare)):+.2f}", ""])
    bare = [r["bare"]["total"] for r in reps]
    ours = [r["trainer"]["total"] for r in reps]
    ratio = median(o / b for o, b in zip(ours, bare))
    loads = [r[k]["load"] for r in reps for k in ("bare", "trainer")]
    rows.append([name, "**total**", _cell(bare), _cell(ours), f"{median(o - b for o, b in zip(ours, bare)):+.2f}",
                 f"{ratio:.2f} (load {min(loads):.1f}–{max(loads):.1f})"])
    return rows


HEADERS = ["layout", "phase", "bare s (min–max)", "Trainer s (min–max)", "Trainer − bare s", "Trainer / bare"]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--layouts", default=",".join(LAYOUTS), help="comma-separated: " + ", ".join(LAYOUTS))
    p.add_argument("--markdown", action="store_true", help=f"replace the '{SECTION}' section of docs/benchmarks.md")
    a = p.parse_args(argv)
    names = [n.strip() for n in a.layouts.split(",")]
    unknown = [n for n in names if n not in LAYOUTS]
    if unknown or a.reps < 1:
        p.error(f"--layouts: unknown {unknown}; valid: {', '.join(LAYOUTS)}" if unknown else "--reps must be >= 1")
    start_load = load_average()
    rows = []
    for name in names:
        print(f"{name}:", flush=True)
        rows += rows_of(name, measure(LAYOUTS[name], a.reps))
    print_table(SECTION, HEADERS, rows)
    body = (f"{machine_line()}; load {start_load:.1f} at the start; {a.reps} repetitions; "
            f"`python scripts/bench_startup.py --reps {a.reps}`\n\n" + markdown_table(HEADERS, rows))
    print("\n" + body)
    if a.markdown:
        update_markdown_section(SECTION, body)


if __name__ == "__main__":
    main()
