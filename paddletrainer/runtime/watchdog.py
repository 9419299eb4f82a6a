"""Collective hang watchdog: a phase that lasts longer than a timeout ends the process (a hang becomes an error).

``CollectiveWatchdog(timeout_seconds, rank)`` is a background thread. ``with watchdog.phase("optimizer",
step=120):`` (or ``watchdog.enter(...)`` / ``watchdog.disarm()``) arms it; when one phase lasts longer than the
timeout it writes one line to stderr (``rank 3 stuck in 'optimizer' at step 120 for 600s: a collective is
probably waiting for a rank that died or diverged``), dumps every thread's stack (faulthandler) and ends the
process with :data:`WATCHDOG_EXIT_CODE`, so ``paddle.distributed.launch`` tears the job down.
``timeout_seconds=None`` costs nothing: no thread, ``phase()`` is a shared no-op context.
Caveat: the thread needs the GIL; Paddle releases it inside its collectives and ``time.sleep`` does too, but a C
extension that blocks while holding the GIL would also block the watchdog.
"""
from __future__ import annotations

import contextlib
import faulthandler
import logging
import os
import sys
import threading
import time
from typing import Callable, Optional

logger = logging.getLogger(__name__)

__all__ = ["WATCHDOG_EXIT_CODE", "CollectiveWatchdog"]

WATCHDOG_EXIT_CODE = 86  # distinct from 1 (Python error), 2 (usage error), 124 (coreutils timeout), 128+n (signals)


class CollectiveWatchdog:
    """Ends a process whose current phase runs longer than ``timeout_seconds`` (a hang becomes an error).

    ``phase(name, step)`` is a context manager; ``enter(name, step)`` re-arms the timer with a new phase and
    ``disarm()`` stops timing (for event-driven use). ``timeout_seconds=None`` disables everything at zero cost.
    ``on_timeout`` replaces the default action (message, stack dump, ``os._exit``) — for tests.
    """

    _NULL = contextlib.nullcontext()

    def __init__(self, timeout_seconds: Optional[float], rank: int = 0, *, exit_code: int = WATCHDOG_EXIT_CODE,
                 on_timeout: Optional[Callable[[str], None]] = None, stream=None):
        if timeout_seconds is not None and (isinstance(timeout_seconds, bool) or timeout_seconds <= 0):
            raise ValueError(f"collective_timeout_seconds={timeout_seconds!r} is invalid: must be a positive number "
                             "or None (no watchdog)")
        self.timeout = timeout_seconds
        self.rank = rank
        self.exit_code = exit_code
        self._on_timeout = on_timeout
        self._stream = stream
        self._cond = threading.Condition()
        self._phase: Optional[str] = None
        self._step: Optional[int] = None
        self._started_at = 0.0
        self._deadline: Optional[float] = None
        self._closed = False
        self._thread: Optional[threading.Thread] = None
        self.fired: Optional[str] = None  # the message, once it fired (with a custom on_timeout)

    @property
    def enabled(self) -> bool:
        return self.timeout is not None

    # -------------------------------------------------------------------------- arming
    def enter(self, name: str, step: Optional[int] = None) -> None:
        """Start timing phase ``name`` (at ``step``) now; replaces the current phase."""
        if self.timeout is None:
            return
        with self._cond:
            self._ensure_thread()
            self._phase, self._step = name, step
            self._started_at = time.monotonic()
            self._deadline = self._started_at + self.timeout
            self._cond.notify()

    def disarm(self) -> None:
        if self.timeout is None:
            return
        with self._cond:
            self._phase, self._deadline = None, None
            self._cond.notify()

    def phase(self, name: str, step: Optional[int] = None):
        """``with watchdog.phase("optimizer", step=n):`` — times the block; a no-op context when disabled."""
        if self.timeout is None:
            return self._NULL
        return self._phase_context(name, step)

    @contextlib.contextmanager
    def _phase_context(self, name, step):
        outer = (self._phase, self._step) if self._deadline is not None else None
        self.enter(name, step)
        try:
            yield self
        finally:
            if outer is not None and outer[0] is not None:
                self.enter(*outer)  # nested use: back to the enclosing phase, timer restarted
            else:
                self.disarm()

    def close(self) -> None:
        """Stop the thread (idempotent)."""
        if self._thread is None:
            return
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join(timeout=5)
        self._thread = None

    def __enter__(self) -> "CollectiveWatchdog":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -------------------------------------------------------------------------- the thread
    def _ensure_thread(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._closed = False
            self._thread = threading.Thread(target=self._run, name=f"paddletrainer-watchdog-rank{self.rank}",
                                            daemon=True)
            self._thread.start()

    def _run(self) -> None:
        with self._cond:
            while not self._closed:
                if self._deadline is None:
                    self._cond.wait()
                    continue
                remaining = self._deadline - time.monotonic()
                if remaining > 0:
                    self._cond.wait(remaining)
                    continue
                message = self._message(time.monotonic() - self._started_at)
                self._deadline = None
                break
            else:
                return
        self._fire(message)

    def _message(self, elapsed: float) -> str:
        step = f" at step {self._step}" if self._step is not None else ""
        return (f"rank {self.rank} stuck in '{self._phase}'{step} for {elapsed:.0f}s "
                f"(collective_timeout_seconds={self.timeout:g}): a collective is probably waiting for a rank "
                f"that died or diverged")

    def _fire(self, message: str) -> None:
        self.fired = message
        if self._on_timeout is not None:
            self._on_timeout(message)
            return
        stream = self._stream or sys.stderr
        try:
            stream.write(message + "\n")
            stream.flush()
            faulthandler.dump_traceback(file=stream, all_threads=True)
            stream.flush()
        except Exception:  # a broken stderr must not keep a hung process alive
            pass
        os._exit(self.exit_code)
