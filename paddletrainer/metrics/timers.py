"""Per-phase wall-clock timers ("data", "forward_backward", "optimizer", "checkpoint_save", or any name).

Disabled timers cost almost nothing: ``timers("data")`` returns one shared no-op context manager, so the
training loop can keep its ``with timers(...)`` lines unconditionally.

Enabled timers synchronize the device at the start and end of each phase. On GPU, kernels run
asynchronously: without the sync, a phase's wall time would only measure how long it took to *queue* its
work. The sync slows training down, which is why timers are off unless asked for (PaddleNLP's
``skip_profile_timer=False`` makes the same trade).
"""
from __future__ import annotations

import contextlib
import functools
import time
from typing import Callable, Dict, Optional

import paddle

from ..device import on_cuda_device

__all__ = ["PhaseTimers", "PHASES", "device_synchronize"]

# The phases the Trainer times; other names work too.
PHASES = ("data", "forward_backward", "optimizer", "checkpoint_save")

_NOOP = contextlib.nullcontext()


@functools.lru_cache(maxsize=None)
def _device_is_async() -> bool:
    return on_cuda_device()


def device_synchronize() -> None:
    """Wait for queued device work; a no-op on CPU, where paddle runs ops synchronously."""
    if _device_is_async():
        paddle.device.synchronize()


class _Phase:
    __slots__ = ("_owner", "_name", "_start")

    def __init__(self, owner: "PhaseTimers", name: str):
        self._owner, self._name = owner, name

    def __enter__(self):
        self._owner._sync()
        self._start = self._owner._clock()
        return self

    def __exit__(self, *exc):
        self._owner._sync()
        self._owner._add(self._name, self._owner._clock() - self._start)
        return False


class PhaseTimers:
    """Accumulates wall time per phase while enabled.

    Usage::

        timers = PhaseTimers(enabled=not args.skip_profile_timer)
        with timers("forward_backward"):
            loss = model(**batch); loss.backward()
        logs.update(timers.report_and_reset())   # {"forward_backward_time": mean seconds per call, ...}

    Args:
        enabled: when False every ``timers(name)`` is a shared no-op context and nothing is recorded.
        sync: called at each phase boundary; defaults to ``device_synchronize``.
        clock: a monotonic clock in seconds (tests pass a fake one).
    """

    def __init__(self, enabled: bool = False, sync: Optional[Callable[[], None]] = None,
                 clock: Callable[[], float] = time.perf_counter):
        self.enabled = enabled
        self._sync = sync or device_synchronize
        self._clock = clock
        self._total: Dict[str, float] = {}
        self._count: Dict[str, int] = {}

    def __call__(self, name: str):
        """A context manager that times one run of phase ``name`` (a no-op when disabled)."""
        if not self.enabled:
            return _NOOP
        return _Phase(self, name)

    def _add(self, name: str, seconds: float) -> None:
        self._total[name] = self._total.get(name, 0.0) + seconds
        self._count[name] = self._count.get(name, 0) + 1

    def elapsed(self, reset: bool = True) -> Dict[str, float]:
        """Total seconds per phase since the last reset."""
        out = dict(self._total)
        if reset:
            self.reset()
        return out

    def report_and_reset(self) -> Dict[str, float]:
        """``{"<phase>_time": mean seconds per call}`` since the last reset, ready for ``Trainer.log``; resets."""
        out = {f"{name}_time": self._total[name] / self._count[name] for name in self._total}
        self.reset()
        return out

    def reset(self) -> None:
        """Forget what was recorded."""
        self._total.clear()
        self._count.clear()
