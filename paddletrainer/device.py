"""Which Paddle build and device this is: the one place that decides "CPU-only build" (AMP policy, the CPU
backend) and "on a CUDA device" (memory counters, timer synchronisation)."""
import paddle

__all__ = ["has_accelerator", "on_cuda_device"]


def has_accelerator() -> bool:
    """True on a Paddle build with CUDA, XPU or a custom device: reduced-precision kernels and the device's
    own collectives exist. False on a CPU-only build, where AMP is a dry run at most and the parallel
    package installs its gloo fills (``parallel.cpu_backend``)."""
    if paddle.is_compiled_with_cuda() or paddle.is_compiled_with_xpu():
        return True
    return bool(paddle.device.get_all_custom_device_type())


def on_cuda_device() -> bool:
    """True when tensors go to a CUDA GPU: its memory counters exist and its work runs asynchronously (timers
    synchronise it)."""
    return paddle.is_compiled_with_cuda() and paddle.get_device().startswith("gpu")
