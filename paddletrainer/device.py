"""Which Paddle build and device this is: the one place that decides "CPU-only build" (AMP policy, the CPU
backend, the device a run uses) and "on a CUDA device" (memory counters, timer synchronisation)."""
import logging
from typing import Optional

import paddle

__all__ = ["has_accelerator", "on_cuda_device", "resolve_device"]

logger = logging.getLogger(__name__)
_cpu_fallback_warned = False  # one warning per process, however many Trainers it builds


def has_accelerator() -> bool:
    """True on a Paddle build with CUDA, XPU or a custom device: reduced-precision kernels and the device's
    own collectives exist. False on a CPU-only build, where AMP is a dry run at most and the parallel
    package installs its gloo fills (``parallel.cpu``)."""
    if paddle.is_compiled_with_cuda() or paddle.is_compiled_with_xpu():
        return True
    return bool(paddle.device.get_all_custom_device_type())


def on_cuda_device() -> bool:
    """True when tensors go to a CUDA GPU: its memory counters exist and its work runs asynchronously (timers
    synchronise it)."""
    return paddle.is_compiled_with_cuda() and paddle.get_device().startswith("gpu")


def resolve_device(requested: Optional[str]) -> Optional[str]:
    """The device a run asked for as ``device`` (``gpu``, ``gpu:1``, ``xpu``, ``cpu`` ...) uses.

    On a CPU-only build an accelerator request, PaddleNLP's default ``gpu`` included, runs on ``cpu`` with one
    warning per process naming the build (never silently, never an error: the default must work there). Otherwise
    the request comes back unchanged and Paddle's current device is kept, as PaddleNLP's Trainer does.
    """
    if not requested or requested.split(":")[0].lower() == "cpu" or has_accelerator():
        return requested  # None: Paddle's default device
    global _cpu_fallback_warned
    if not _cpu_fallback_warned:
        _cpu_fallback_warned = True
        logger.warning("device=%r: this Paddle build (paddle %s, commit %s) is CPU-only, compiled without CUDA, XPU "
                       "or a custom device; running on cpu (pass --device cpu to silence this)", requested,
                       paddle.__version__, paddle.version.commit[:10])
    return "cpu"
