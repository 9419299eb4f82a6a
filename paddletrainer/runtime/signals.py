"""Graceful stop: SIGTERM/SIGINT become a flag that every rank agrees on at the same optimizer step.

``GracefulStop`` installs handlers that only set a flag (the previous handlers come back on ``uninstall()`` or at
the end of the ``with`` block). The Trainer's loop calls ``agreed(topology, step)`` right after each optimizer
step. In one process that only looks at the flag. In a multi-process run the ranks agree with a MAX all-reduce of
the flag over the whole world and a host read of the result, so every rank stops at the *same* step — no rank
leaves the loop alone while the others wait for it in a collective. That read would stall the device every
step, so it runs only at steps that are multiples of :attr:`GracefulStop.every` (the same steps on every rank,
since they all count the same ``global_step``); the Trainer's ``start(every)`` sets it to its logging interval, which
already reads the loss, capped at :data:`MAX_CHECK_INTERVAL` steps so a pre-emption notice is not missed. A
second signal while a stop is pending falls back to the previous handler (a second Ctrl-C kills at once).

After the stop checkpoint is published the Trainer raises :class:`paddletrainer.errors.TrainingInterrupted`
(a ``SystemExit`` with code 128 + signal number, no traceback).
"""
from __future__ import annotations

import logging
import os
import signal
import threading
from enum import Enum
from typing import Sequence

import paddle
import paddle.distributed as dist

from ..errors import signal_name
from ..trainer_utils import IntervalStrategy

logger = logging.getLogger(__name__)

__all__ = ["GracefulStop", "MAX_CHECK_INTERVAL", "check_interval"]

#: at most this many optimizer steps between two agreement checks in a multi-process run: a stop can take this
#: many steps (plus the checkpoint save), which the job's SIGTERM-to-SIGKILL grace period must cover
MAX_CHECK_INTERVAL = 10


def check_interval(logging_strategy, logging_steps: int) -> int:
    """Steps between two multi-process stop checks: the logging interval when logging is by steps and at most
    :data:`MAX_CHECK_INTERVAL` steps apart (the check then adds no host read of its own), else
    :data:`MAX_CHECK_INTERVAL`.

    ``logging_strategy`` is read as ``TrainingArguments`` reads it: an :class:`IntervalStrategy`, its value, or
    another enum with that value (PaddleNLP's); anything else is a ``ValueError`` listing the valid values."""
    value = logging_strategy.value if isinstance(logging_strategy, Enum) else logging_strategy
    if IntervalStrategy(value) == IntervalStrategy.STEPS and 0 < logging_steps <= MAX_CHECK_INTERVAL:
        return int(logging_steps)
    return MAX_CHECK_INTERVAL


class GracefulStop:
    """Turn SIGTERM/SIGINT into a flag the training loop checks after each optimizer step.

    Use as a context manager (or ``install()`` / ``uninstall()``). Handlers can only be installed from the
    main thread; elsewhere ``install()`` logs a warning and the flag can still be set with :meth:`request`.

    ``listening``: whether a loop will still check the flag (default True; :meth:`start` sets it, :meth:`stop`
    clears it). The Trainer calls :meth:`stop` when ``train()`` is left by an exception with the handlers still
    installed: nobody will ever check the flag then, so the handler uninstalls itself and passes the signal to the
    previous handler — Ctrl-C is never swallowed by a stale handler.

    ``stopping``: set by :meth:`agreed` once the ranks agreed to stop; the stop checkpoint is then the last step.

    ``every``: in a multi-process run, :meth:`agreed` communicates only at steps that are multiples of it
    (:meth:`start` sets it).
    """

    def __init__(self, signals: Sequence[int] = (signal.SIGTERM, signal.SIGINT), every: int = MAX_CHECK_INTERVAL):
        self.signals = tuple(signals)
        self.every = int(every)
        self.listening = True
        self.signum: int = 0  # the (first) signal received; 0 = none
        self.stopping = False
        self._previous: dict = {}
        self._installed = False

    # -------------------------------------------------------------------------- handlers
    def install(self) -> "GracefulStop":
        if self._installed:
            return self
        if threading.current_thread() is not threading.main_thread():
            logger.warning("GracefulStop: not in the main thread, signal handlers not installed")
            return self
        for sig in self.signals:
            self._previous[sig] = signal.getsignal(sig)
            signal.signal(sig, self._handle)
        self._installed = True
        return self

    def uninstall(self) -> None:
        """Restore the handlers that were in place before :meth:`install`."""
        if not self._installed:
            return
        for sig, previous in self._previous.items():
            signal.signal(sig, previous if previous is not None else signal.SIG_DFL)
        self._previous.clear()
        self._installed = False

    def __enter__(self) -> "GracefulStop":
        return self.install()

    def __exit__(self, *exc) -> None:
        self.uninstall()

    @property
    def installed(self) -> bool:
        return self._installed

    def _handle(self, signum, frame) -> None:
        if self.signum or not self.listening:
            # a second signal (the user insists), or a stale handler: behave as before we were installed
            previous = self._previous.get(signum, signal.SIG_DFL)
            self.uninstall()
            if callable(previous):
                previous(signum, frame)
            elif previous == signal.SIG_DFL:
                os.kill(os.getpid(), signum)
            return
        self.signum = signum
        # one line, async-signal-safe enough (no locks held by logging here)
        try:
            os.write(2, f"received {signal_name(signum)}: saving a checkpoint at the end of this step, then "
                        f"stopping (send it again to stop at once)\n".encode())
        except OSError:
            pass

    # -------------------------------------------------------------------------- the loop that checks the flag
    def start(self, every: int) -> None:
        """A loop checks the flag from now on, with :meth:`agreed` communicating every ``every`` steps."""
        self.every = int(every)
        self.listening = True

    def stop(self) -> None:
        """No loop checks the flag any more (it was left by an exception): a signal goes to the previous handler.
        Stops listening only; it does not ask for a stop (that is :meth:`request`)."""
        self.listening = False

    # -------------------------------------------------------------------------- the flag
    @property
    def requested(self) -> bool:
        """This process received a stop signal (or :meth:`request` was called)."""
        return bool(self.signum)

    def request(self, signum: int = signal.SIGTERM) -> None:
        """Ask for a stop as if ``signum`` had arrived (tests, callbacks, schedulers' pre-emption hooks)."""
        if not self.signum:
            self.signum = int(signum)

    def reset(self) -> None:
        """Forget a previous stop (a new ``train()``)."""
        self.signum = 0
        self.stopping = False

    def agreed(self, topology=None, step: int | None = None) -> bool:
        """The stop check after optimizer step ``step``: :meth:`should_stop`, and :attr:`stopping` set on every
        rank when it says stop. Every rank must call it at the same point. In a multi-process run it is a
        collective (and a host read) only when ``step`` is None or a multiple of :attr:`every`; between those
        steps it returns the last agreed answer without communicating."""
        if step is not None and step % max(self.every, 1) and _world_size(topology) > 1:
            return self.stopping
        if self.should_stop(topology):
            self.stopping = True
        return self.stopping

    def should_stop(self, topology=None) -> bool:
        """True on every rank iff any rank received a stop signal. Collective when the world has > 1 process:
        every rank must call it at the same point (the trainer: through :meth:`agreed`)."""
        world = _world_size(topology)
        if world <= 1:
            return bool(self.signum)
        flag = paddle.to_tensor([self.signum], dtype="int64")
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        agreed = int(flag.numpy()[0])
        if agreed and not self.signum:
            self.signum = agreed  # another rank got the signal: stop with it
        return bool(agreed)


def _world_size(topology) -> int:
    if topology is not None:
        return int(getattr(topology, "world_size", 1))
    return dist.get_world_size() if dist.is_initialized() else 1
