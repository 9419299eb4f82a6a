"""This process's memory: its peak (logged as ``peak_memory_gb``), its resident set size now, and what one stage
(train / evaluate / predict) used: PaddleNLP's ``skip_memory_metrics=False`` report.

Peak: device memory on GPU, the host resident set size's high-water mark on CPU (:func:`peak_memory_bytes`).

Per stage (:class:`MemoryTracker`), keys in bytes as PaddleNLP/HF name them (``stage`` is ``train``, ``eval`` or
``test``):

* ``{stage}_mem_cpu_alloc_delta``: host resident set size at the end minus at the start;
* ``{stage}_mem_cpu_peaked_delta``: how far the RSS rose above its end value during the stage (sampled by a
  background thread every few milliseconds, so a very short spike can be missed);
* on GPU, ``{stage}_mem_gpu_alloc_delta`` / ``{stage}_mem_gpu_peaked_delta`` from paddle's allocator counters
  (``memory_allocated`` / ``max_memory_allocated``, the peak counter reset at the start), and
  ``gpu_mem_max_memory_allocated`` / ``gpu_mem_max_memory_reserved``.

A stage started while another runs (an evaluation inside training) is not measured separately: it is part of
the outer stage. The ``init`` stage (the Trainer's construction) has no result of its own to go to: its keys
(``init_mem_cpu_alloc_delta`` ...) come with the first later stage's, as in PaddleNLP/HF.
"""
from __future__ import annotations

import contextlib
import inspect
import os
import resource
import sys
import threading
from typing import Dict, Optional

import paddle

from ..device import on_cuda_device

__all__ = ["peak_memory_bytes", "memory_logs", "current_rss_bytes", "MemoryTracker", "TrainerMemoryTracker"]


def peak_memory_bytes() -> int:
    """Peak bytes since the process started (or since paddle's peak counter was last reset, on GPU).

    GPU: ``paddle.device.cuda.max_memory_allocated()`` for the current device (tensors only, not the
    allocator's cache). CPU: the peak resident set size from ``getrusage``; it is a high-water mark the OS
    keeps and cannot be reset.
    """
    if on_cuda_device():
        return int(paddle.device.cuda.max_memory_allocated())
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # Linux reports kilobytes, macOS bytes.
    return int(peak if sys.platform == "darwin" else peak * 1024)


def memory_logs() -> dict:
    """``{"peak_memory_gb": ...}`` (GiB, rounded to 3 decimals) for ``Trainer.log``."""
    return {"peak_memory_gb": round(peak_memory_bytes() / 2**30, 3)}


_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def current_rss_bytes() -> int:
    """This process's resident set size now (Linux ``/proc/self/statm``; else the peak from ``getrusage``)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * _PAGE
    except OSError:
        return peak_memory_bytes()


class MemoryTracker:
    """``start(stage)`` / ``stop(stage) -> metrics``; does nothing when ``enabled`` is False."""

    def __init__(self, enabled: bool, interval_seconds: float = 0.005):
        self.enabled = enabled
        self.interval = interval_seconds
        self._stage: Optional[str] = None
        self._begin = 0
        self._peak = 0
        self._gpu_begin = 0
        self._done = threading.Event()
        self._sampler: Optional[threading.Thread] = None
        self._init_metrics: Dict[str, int] = {}  # the init stage's, until the next stage reports

    def _sample(self) -> None:
        while not self._done.wait(self.interval):
            self._peak = max(self._peak, current_rss_bytes())

    def start(self, stage: str) -> None:
        """Begin measuring ``stage`` (ignored while another stage is being measured)."""
        if not self.enabled or self._stage is not None:
            return
        self._stage = stage
        self._begin = self._peak = current_rss_bytes()
        if on_cuda_device():
            paddle.device.cuda.reset_max_memory_allocated()
            self._gpu_begin = int(paddle.device.cuda.memory_allocated())
        self._done.clear()
        # No sampler thread for init: a Trainer whose construction fails never stops the stage, and would leave
        # the thread polling; the init stage's peak is then the larger of its two ends.
        self._sampler = None if stage == "init" else threading.Thread(
            target=self._sample, name="paddletrainer-memory", daemon=True)
        if self._sampler is not None:
            self._sampler.start()

    @contextlib.contextmanager
    def stage_ended_on_error(self, stage: str):
        """End ``stage`` without reporting it if the body raises: its sampler thread stops and the next stage
        (a later evaluate or predict) is measured; the ``init`` metrics stay for the next report."""
        try:
            yield
        except BaseException:
            if self._stage == stage:
                self._done.set()
                if self._sampler is not None:
                    self._sampler.join()
                self._stage = None
            raise

    def stop(self, stage: str) -> Dict[str, int]:
        """End ``stage`` and return its metrics, with the ``init`` stage's the first time ({} when disabled or when
        ``stage`` is not the one measured; {} for ``init`` itself)."""
        if not self.enabled or self._stage != stage:
            return {}
        self._done.set()
        if self._sampler is not None:
            self._sampler.join()
        end = current_rss_bytes()
        self._peak = max(self._peak, end)
        metrics = {f"{stage}_mem_cpu_alloc_delta": end - self._begin,
                   f"{stage}_mem_cpu_peaked_delta": max(0, self._peak - end)}
        if on_cuda_device():
            now, peak = int(paddle.device.cuda.memory_allocated()), int(paddle.device.cuda.max_memory_allocated())
            metrics.update({f"{stage}_mem_gpu_alloc_delta": now - self._gpu_begin,
                            f"{stage}_mem_gpu_peaked_delta": max(0, peak - now),
                            "gpu_mem_max_memory_allocated": peak,
                            "gpu_mem_max_memory_reserved": int(paddle.device.cuda.max_memory_reserved())})
        self._stage = None
        if stage == "init":
            self._init_metrics = metrics
            return {}
        metrics, self._init_metrics = {**self._init_metrics, **metrics}, {}
        return metrics


class TrainerMemoryTracker:
    """PaddleNLP's interface to :class:`MemoryTracker`: the stage is the name of the method that calls
    ``start()`` / ``stop_and_update_metrics()`` (``stages`` maps ``__init__``, ``train``, ``evaluate``,
    ``predict`` to ``init``, ``train``, ``eval``, ``test``), and the metrics go into the dict given. Nothing is
    measured with ``skip_memory_metrics``. The ``init`` stage's keys come with the first later stage's."""

    stages = {"__init__": "init", "train": "train", "_inner_training_loop": "train", "evaluate": "eval",
              "predict": "test"}

    def __init__(self, skip_memory_metrics: bool = False):
        self.skip_memory_metrics = skip_memory_metrics
        self._tracker = MemoryTracker(enabled=not skip_memory_metrics)
        self._stopped: Dict[str, Dict[str, int]] = {}  # stage -> its metrics, until update_metrics takes them

    def derive_stage(self) -> str:
        """The stage of the method that called the caller of this function."""
        caller = inspect.currentframe().f_back.f_back.f_code.co_name
        if caller not in self.stages:
            raise ValueError(f"TrainerMemoryTracker was called from {caller}; valid callers: {sorted(self.stages)}")
        return self.stages[caller]

    def start(self) -> None:
        """Begin measuring the caller's stage (a stage started inside another one is part of the outer one)."""
        if not self.skip_memory_metrics:
            self._tracker.start(self.derive_stage())

    def stop(self, stage: str) -> None:
        """End ``stage`` (nothing when another stage is being measured)."""
        if not self.skip_memory_metrics:
            self._stopped[stage] = self._tracker.stop(stage)

    def update_metrics(self, stage: str, metrics: dict) -> None:
        """Add ``stage``'s memory keys (``{stage}_mem_cpu_alloc_delta`` ...) to ``metrics``."""
        if not self.skip_memory_metrics:
            metrics.update(self._stopped.pop(stage, {}))

    def stop_and_update_metrics(self, metrics: Optional[dict] = None) -> None:
        """End the caller's stage and add its memory keys to ``metrics`` (when given)."""
        if self.skip_memory_metrics:
            return
        stage = self.derive_stage()
        self.stop(stage)
        if metrics is not None:
            self.update_metrics(stage, metrics)
