"""Peak memory of this process: device memory on GPU, host resident set size on CPU."""
from __future__ import annotations

import resource
import sys

import paddle

from ..runtime.device import on_cuda_device

__all__ = ["peak_memory_bytes", "memory_logs"]


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
