"""Walk one command-line option through the library, measured: the files it crosses and how often each is entered.

A *scenario* is a pair of runs of the same tiny training (PaddleNLP's Llama with random weights, random tokens,
two optimizer steps, started from the command line through ``PdArgumentParser``): the *option run* with the
option, and the *baseline run* without it, on the same world size. Each run traces its rank 0 with
``sys.settrace`` from the command-line parse to the end of ``Trainer.train``, restricted to frames whose code lives
under ``paddletrainer/`` (Paddle's and PaddleNLP's frames are not traced, and neither are other threads):

* per library function (file, first line, qualified name), the order of its first call and the set of its
  lines that ran. ``settrace`` rather than ``setprofile``: a shared function that *decides* on the option (an
  ``if stage == 2`` inside ``parallelize``) runs in both runs and differs only in the lines it takes.
* The **walk** is every function of the option run that the baseline run did not call, or that ran other lines in
  the option run than in the baseline run: the code the option adds or redirects. Modules imported only because
  of the option appear as their ``<module>`` function ("import by import").
* **Files crossed**: the files holding a walk function.
* **Entered**: a file is entered once for each function of another library file that first called one of its walk
  functions (the caller looked up through the standard library's ``contextlib``/``functools`` frames and Paddle's
  ``@paddle.no_grad()`` wrapper); one caller
  calling several of the file's functions for its job is one entry, so a module of helpers used by one function is
  not inflated. Counted before the first ``Trainer._train_step`` (parse, set-up, checkpoint load) and in the steps.
  Repeated calls (the loop's later steps, one call per parameter) add nothing, and neither do calls within the file
  (a helper, a comprehension). A walk function whose caller is not library code (Paddle calling back into an
  override or a hook, or the driving script) is counted apart, as *called from outside the library*.
* **From files**: how many other library files those entries come from (a module many files call into, against
  one file asking it several questions).

What the walk excludes, by construction: code that runs the same way with and without the option (the argument
parser's generic field handling, the training loop shared by every layout, utilities called identically), code on
ranks other than 0, and code in other threads (the async checkpoint writer, the loader thread). What it may
include that is not a decision: a function whose lines depend on the run's data rather than on the option (none
seen in these scenarios; rerun and compare if in doubt — the walk is deterministic for a given tree).

Scenarios (each launch under ``flock /tmp/paddletrainer-mp.lock``, world 2):

* ``stage2``: ``--sharding stage2`` against plain data parallel (dp2).
* ``resume``: a dp2 run saves ``checkpoint-2`` (skipped when ``--work`` holds it already); the option run resumes
  it on tp2 with ``--resume_from_checkpoint auto`` (another layout, the same global batch of 4: 4 samples per device
  instead of 2); the baseline is the same tp2 run started fresh. A different global batch would add the path that
  keeps the saved one (gradient accumulation), not the resume's.

Usage: ``python scripts/walk_trace.py stage2 resume [--work DIR] [--json FILE] [--repo CHECKOUT]``; prints one
table per scenario.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import sysconfig
import tempfile
from collections import Counter
from pathlib import Path

# the checkout whose library is traced: this one, or another's (``--repo``, passed to the launched workers)
REPO = Path(os.environ.get("WALK_TRACE_REPO") or Path(__file__).resolve().parents[1])
PACKAGE = str(REPO / "paddletrainer") + os.sep
STDLIB = sysconfig.get_paths()["stdlib"] + os.sep
LOCK = "/tmp/paddletrainer-mp.lock"
# ``@paddle.no_grad()`` calls the decorated function from this frame of Paddle's (paddle 3.3.1)
PADDLE_DECORATOR_FILE = os.path.join("paddle", "base", "dygraph", "base.py")
PADDLE_DECORATOR_FRAMES = frozenset({"_decorate_function"})
STEP = ("trainer.py", "_train_step")  # the walk's functions first called after this one's first call are the steps'
SIZE = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, vocab_size=64)
SEQ = 16
COMMON = ["--per_device_train_batch_size", "2", "--max_steps", "2", "--logging_steps", "1", "--learning_rate",
          "1e-3", "--report_to", "none", "--disable_tqdm", "true", "--seed", "1", "--save_strategy", "no"]
TP2_SAME_BATCH = ["--tensor_parallel_degree", "2", "--per_device_train_batch_size", "4"]
SCENARIOS = {
    "stage2": {"option": ["--sharding", "stage2"], "baseline": [], "saved": None},
    # tp2 at 4 samples per device keeps dp2's global batch of 4: the walk is the resume's, not the kept-batch path's
    "resume": {"option": [*TP2_SAME_BATCH, "--max_steps", "4", "--resume_from_checkpoint", "auto"],
               "baseline": [*TP2_SAME_BATCH, "--max_steps", "4"],
               "saved": ["--max_steps", "2", "--save_strategy", "steps", "--save_steps", "2"]},
}


class Tracer:
    """``sys.settrace`` hooks recording, for ``paddletrainer/`` frames, each function's first-call order and lines."""

    def __init__(self):
        self.order = {}  # code object -> index of its first call
        self.callers = {}  # code object -> the library file that first called it ("" if none: the script)
        self.lines = set()  # (code object, line number)

    def on_call(self, frame, event, arg):
        code = frame.f_code
        if event != "call" or not code.co_filename.startswith(PACKAGE):
            return None
        if code not in self.order:
            self.order[code] = len(self.order)
            self.callers[code] = library_caller(frame)
        return self.on_line

    def on_line(self, frame, event, arg):
        if event == "line":
            self.lines.add((frame.f_code, frame.f_lineno))
        return self.on_line

    def report(self) -> list:
        """[(file relative to the package, first line, qualified name, the file of its first caller ("" when not
        a library frame: a callback from Paddle, or the script), in the steps, sorted lines)] in first-call order;
        *in the steps* is a first call after the first ``Trainer._train_step``."""
        ran = {}
        for code, line in self.lines:
            ran.setdefault(code, set()).add(line)
        rows = []
        first_step = min((i for c, i in self.order.items() if c.co_name == STEP[1] and c.co_filename.endswith(STEP[0])),
                         default=len(self.order))
        for code in sorted(self.order, key=self.order.get):
            name = getattr(code, "co_qualname", code.co_name)
            rows.append([code.co_filename[len(PACKAGE):], code.co_firstlineno, name, self.callers[code],
                         self.order[code] > first_step, sorted(ran.get(code, ()))])
        return rows


def is_pass_through(code) -> bool:
    """A frame between a caller and the function it calls that is nobody's decision: the standard library
    (``contextlib``'s ``__enter__``, ``functools``) or Paddle's ``@paddle.no_grad()`` wrapper, which runs the
    decorated library function on its caller's behalf."""
    return code.co_filename.startswith(STDLIB) or (
        code.co_name in PADDLE_DECORATOR_FRAMES and code.co_filename.endswith(PADDLE_DECORATOR_FILE))


def library_caller(frame) -> str:
    """``file::function`` (file relative to the package) of the frame that called ``frame``, looking through the
    pass-through frames (:func:`is_pass_through`): "" when that caller is not library code (Paddle calling back,
    or the script)."""
    caller = frame.f_back
    while caller is not None and is_pass_through(caller.f_code):
        caller = caller.f_back
    if caller is None or not caller.f_code.co_filename.startswith(PACKAGE):
        return ""
    return f"{caller.f_code.co_filename[len(PACKAGE):]}::{getattr(caller.f_code, 'co_qualname', caller.f_code.co_name)}"


def token_samples(count: int = 32):
    import numpy as np

    tokens = np.random.default_rng(0).integers(0, SIZE["vocab_size"], size=(count, SEQ + 1), dtype="int64")
    return [{"input_ids": t[:-1], "labels": t[1:]} for t in tokens]


def run_traced(cli: list, result: Path) -> None:
    """One run of the tiny training from the command line ``cli``; rank 0 writes its trace to ``result``."""
    sys.path.insert(0, str(REPO))
    import paddle
    from paddlenlp.transformers import LlamaConfig, LlamaForCausalLM

    from paddletrainer import PdArgumentParser, Trainer, TrainingArguments

    tracer = Tracer()
    sys.settrace(tracer.on_call)
    try:
        (args,) = PdArgumentParser(TrainingArguments).parse_args_into_dataclasses(cli)
        config = LlamaConfig(**SIZE, max_position_embeddings=SEQ, seq_length=SEQ, use_flash_attention=False)
        config.tensor_parallel_degree = max(args.tensor_parallel_degree, 1)
        config.tensor_parallel_rank = args.tensor_parallel_rank
        config.tensor_parallel_output = False
        paddle.seed(1)
        Trainer(model=LlamaForCausalLM(config), args=args, train_dataset=token_samples()).train()
    finally:
        sys.settrace(None)
    if paddle.distributed.get_rank() == 0:
        result.write_text(json.dumps(tracer.report()))


def launch(cli: list, result: Path, log_dir: Path, world: int = 2) -> None:
    """``run_traced`` under ``paddle.distributed.launch`` on ``world`` processes, holding the machine's launch lock."""
    env = dict(os.environ, WALK_TRACE_REPO=str(REPO),
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    cmd = ["flock", LOCK, "timeout", "900", sys.executable, "-m", "paddle.distributed.launch", "--nproc_per_node",
           str(world), "--log_dir", str(log_dir), str(Path(__file__).resolve()), "--run", str(result), "--", *cli]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode or not result.is_file():
        tails = "".join(p.read_text(errors="replace")[-3000:] for p in sorted(log_dir.glob("workerlog.*")))
        raise SystemExit(f"launch failed (exit {proc.returncode}): {' '.join(cmd)}\n{tails}{proc.stderr[-2000:]}")


COMPREHENSIONS = ("<listcomp>", "<dictcomp>", "<setcomp>", "<genexpr>", "<lambda>")


def walk_of(option_rows: list, baseline_rows: list) -> list:
    """The option run's rows, in first-call order, whose function the baseline did not call or ran other lines of."""
    baseline = {tuple(row[:3]): row[5] for row in baseline_rows}
    return [row for row in option_rows if baseline.get(tuple(row[:3])) != row[5]]


def caller_file(caller: str) -> str:
    return caller.split("::", 1)[0]


def entries_of(walk: list, in_steps: bool) -> Counter:
    """Per file, the functions of other library files that first called one of its walk functions (several of its
    functions called by one such function are one entry), before the first step or in the steps."""
    pairs = {(file, caller) for file, _first, _name, caller, steps, _lines in walk
             if caller and caller_file(caller) != file and steps == in_steps}
    return Counter(file for file, _caller in pairs)


def table(title: str, walk: list) -> str:
    """Markdown: one row per file in the order the walk first reaches it: entries, callbacks, its walk functions."""
    before, steps = entries_of(walk, False), entries_of(walk, True)
    fan_in = {file: len({caller_file(c) for f, _first, _name, c, _steps, _lines in walk
                         if f == file and c and caller_file(c) != file}) for file, *_ in walk}
    callbacks, functions = Counter(), {}
    for file, _first, name, caller, _steps, _lines in walk:
        callbacks[file] += not caller
        shown = functions.setdefault(file, [])
        if name.rsplit(".", 1)[-1] not in COMPREHENSIONS:
            shown.append(name if caller_file(caller) == file else f"{name} ← {caller_file(caller) or 'Paddle/script'}")
    most = max((before[f] + steps[f] for f in functions), default=0)
    lines = [f"{title}: {len(functions)} files; most entries into one file {most}", "",
             "| # | file | entered before the first step | entered in the steps | from files | called from outside the "
             "library | functions on the walk (← the caller's file, when another) |", "|---|---|---|---|---|---|---|"]
    for n, (file, names) in enumerate(functions.items(), 1):
        lines.append(f"| {n} | `{file}` | {before[file]} | {steps[file]} | {fan_in[file]} | {callbacks[file]} | "
                     f"{', '.join(names)} |")
    return "\n".join(lines)


def measure(name: str, work: Path) -> list:
    """Run scenario ``name``'s launches in ``work``; return its walk."""
    spec = SCENARIOS[name]
    out = work / name / "out"
    traces = {}
    if spec["saved"] is not None and not (out / "checkpoint-2").is_dir():  # kept from an earlier measure
        launch([*COMMON, "--output_dir", str(out), *spec["saved"]], work / name / "saved.json", work / name / "log_saved")
    for run in ("option", "baseline"):
        output_dir = out if run == "option" else work / name / "fresh"
        result = work / name / f"{run}.json"
        launch([*COMMON, "--output_dir", str(output_dir), *spec[run]], result, work / name / f"log_{run}")
        traces[run] = json.loads(result.read_text())
    return walk_of(traces["option"], traces["baseline"])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scenarios", nargs="*", choices=sorted(SCENARIOS), default=sorted(SCENARIOS))
    parser.add_argument("--work", type=Path, help="directory for the runs' outputs (default: a new temporary one)")
    parser.add_argument("--json", type=Path, help="also write the walks here as JSON")
    parser.add_argument("--repo", type=Path, help="trace this checkout's paddletrainer/ (default: this one)")
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--run"]:  # a launched worker: ``--run RESULT -- CLI...``
        run_traced(argv[3:], Path(argv[1]))
        return 0
    a = parser.parse_args(argv)
    if a.repo:
        os.environ["WALK_TRACE_REPO"] = str(a.repo.resolve())
        global REPO, PACKAGE
        REPO, PACKAGE = a.repo.resolve(), str(a.repo.resolve() / "paddletrainer") + os.sep
    work = a.work or Path(tempfile.mkdtemp(prefix="walk_trace_"))
    walks = {name: measure(name, work) for name in a.scenarios}
    for name, walk in walks.items():
        print(table(f"{name} (world 2, rank 0)", walk) + "\n")
    if a.json:
        a.json.write_text(json.dumps(walks, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
