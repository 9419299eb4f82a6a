"""Where the time before the first optimizer step went: ``startup/*`` metrics and one readable line per rank.

A run's start is a chain of phases; the Trainer marks the end of each (``StartupTimer.mark``) and every second
between the process's start and the end of the first step lands in exactly one of :data:`PHASES`:

* ``import``: from the process's start (the kernel's record of it) to the end of ``paddletrainer.trainer``'s
  imports (Python, paddle, paddletrainer);
* ``topology``: ``init_topology`` (the CPU backend, ``fleet.init``, every process group), wherever it ran: a
  script that reads a rank property of its arguments first builds the groups before ``Trainer()``;
* ``model``: the script's own set-up between the imports and ``Trainer()`` (where a PaddleNLP script builds or
  loads its model; its datasets, when it builds them there), ``model_init``, the lazy start and the callbacks
  inside ``Trainer()``, and loading a checkpoint to resume from;
* ``optimizer``: the optimizer and schedule, and the sharded optimizer's construction (stage 1/2/3 partition and
  storages, fleet's hybrid optimizer);
* ``wrap``: AMP decoration and the parallel wrappers, less the sharded optimizer's construction;
* ``first_batch``: the training data loader's construction and the first step's reading;
* ``first_step``: the first optimizer step (forward, backward, gradient sync, clip, update);
* ``other``: the rest (the script between ``Trainer()`` and ``train()``, the Trainer's bookkeeping);
* ``total``: the process's start to the end of the first step.

The report is written once per process, after the first step and before any other log of the run: the
``startup/<phase>`` seconds through every reporting callback (``MetricsCallback`` and PaddleNLP's per-backend
ones: VisualDL, TensorBoard, W&B on world rank 0, the JSON lines of ``metrics_output_path`` on every rank) and
one INFO line on the ``paddletrainer.metrics.startup`` logger, shown where the process's log level allows it
(``log_level_replica=info`` for the ranks other than the main one).
"""
from __future__ import annotations

import contextlib
import logging
import os
import time
from typing import Callable, Dict, Iterator, Optional

from .callback import MetricsCallback

__all__ = ["PHASES", "StartupTimer", "process_start_time", "report_startup", "startup_line"]

logger = logging.getLogger(__name__)

PHASES = ("import", "topology", "model", "optimizer", "wrap", "first_batch", "first_step", "other")
PREFIX = "startup/"


def process_start_time() -> Optional[float]:
    """This process's start as a Unix time, from ``/proc`` (Linux: boot time + the start in clock ticks);
    None where there is no ``/proc``."""
    try:
        with open("/proc/self/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        with open("/proc/stat") as kernel:
            boot = next(float(line.split()[1]) for line in kernel if line.startswith("btime"))
    except (OSError, StopIteration, IndexError, ValueError):
        return None
    return boot + int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22 of stat: starttime (19 after the name)


class StartupTimer:
    """The phases of one process's start, measured by marks on a cursor.

    ``mark(phase)`` adds the seconds since the previous mark (less what ``timed`` measured inside them) to
    ``phase``; ``skip()`` moves the cursor without counting (that time is ``other``); ``timed(phase)`` measures
    a nested part and takes it out of the enclosing mark. The first ``mark("first_step")`` ends the start:
    ``on_done`` gets the ``startup/*`` values and every later call is a no-op (a second ``train()`` call, the
    second step).

    Args:
        imports_done: the Unix time at which the caller's imports ended (the ``import`` phase's end).
        on_done: called once with the ``startup/<phase>`` seconds.
        process_start: the process's start (default :func:`process_start_time`; without ``/proc`` the imports'
            end, so ``import`` is 0).
        clock: the Unix-time clock (tests pass a fake one).
    """

    def __init__(self, imports_done: float, on_done: Callable[[Dict[str, float]], None],
                 process_start: Optional[float] = None, clock: Callable[[], float] = time.time):
        self._clock, self._on_done = clock, on_done
        start = process_start if process_start is not None else process_start_time()
        self._start = imports_done if start is None else min(start, imports_done)
        self.seconds: Dict[str, float] = dict.fromkeys(PHASES, 0.0)
        self.seconds["import"] = imports_done - self._start
        self._cursor, self._nested, self.done = imports_done, 0.0, False
        self.mark("model")  # the script's set-up before Trainer()

    def mark(self, phase: str) -> None:
        """The time since the last mark, less the ``timed`` parts inside it, belongs to ``phase``."""
        if self.done:
            return
        now = self._clock()
        self.seconds[phase] += max(now - self._cursor - self._nested, 0.0)
        self._cursor, self._nested = now, 0.0
        if phase == "first_step":
            self._finish(now)

    def skip(self) -> None:
        """Move the cursor: the time since the last mark is ``other``."""
        if not self.done:
            self._cursor, self._nested = self._clock(), 0.0

    def topology_built(self, build_seconds: float) -> None:
        """Mark ``topology`` after ``init_topology``; ``build_seconds`` (the Topology's own measure) beyond the
        interval just marked ran earlier, in the script's set-up, and moves there from ``model``."""
        before = self.seconds["topology"]
        self.mark("topology")
        earlier = build_seconds - (self.seconds["topology"] - before)
        if earlier > 0:
            moved = min(earlier, self.seconds["model"])
            self.seconds["model"] -= moved
            self.seconds["topology"] += moved

    @contextlib.contextmanager
    def timed(self, phase: str) -> Iterator[None]:
        """Measure a part nested in a mark's interval (the sharded optimizer inside the wrapping) as ``phase``."""
        began = self._clock()
        try:
            yield
        finally:
            if not self.done:
                spent = self._clock() - began
                self.seconds[phase] += spent
                self._nested += spent

    def _finish(self, now: float) -> None:
        self.done = True
        counted = sum(v for k, v in self.seconds.items() if k != "other")
        self.seconds["other"] = max(now - self._start - counted, 0.0)  # the skipped intervals
        values = {PREFIX + phase: round(seconds, 4) for phase, seconds in self.seconds.items()}
        values[PREFIX + "total"] = round(now - self._start, 4)
        self._on_done(values)


def startup_line(values: Dict[str, float], rank: int) -> str:
    """The readable line: ``startup (rank 1): 41.2 s to the first step = import 6.1 s, topology 2.0 s, ...``."""
    parts = ", ".join(f"{phase.replace('_', ' ')} {values[PREFIX + phase]:.1f} s" for phase in PHASES)
    return f"startup (rank {rank}): {values[PREFIX + 'total']:.1f} s to the end of the first step = {parts}"


def report_startup(values: Dict[str, float], trainer) -> None:
    """Log the readable line and hand ``values`` to ``trainer``'s reporting callbacks, each writing where and
    when it writes logs (world rank 0; every rank for ``metrics_output_path``). Not through ``on_log``: the
    start is not a training log, so ``log_history`` and the progress bar stay as PaddleNLP has them."""
    logger.info(startup_line(values, trainer.topology.rank))
    handler = trainer.callback_handler
    for callback in [*handler.internal_callbacks, *handler.callbacks]:
        if isinstance(callback, MetricsCallback):
            callback.write_scalars(values, trainer.args, trainer.state, trainer.model)
