"""Mixed precision: what the arguments ask for, and how it reaches Paddle.

``AmpConfig.for_device(args.amp_config)`` resolves the settings asked for (``config.builders.AmpSettings``, built by
the arguments) against the device; ``AmpConfig.autocast()``, ``decorate()`` and ``grad_scaler()`` are the only
places AMP touches Paddle, so a test can check exactly which dtype, level, lists and scaler settings
arrive there.

CPU policy. Paddle 3.3.1's CPU build keeps ``auto_cast`` in float32, leaves O2-decorated weights in
float32, gives ``GradScaler`` no scale, and has no bf16 matmul kernel: AMP on CPU would silently train in
fp32 while reporting fp16/bf16. So on CPU ``fp16``/``bf16`` is an error by default; ``amp_on_cpu=
"fp32_dry_run"`` runs the same AMP wiring (auto_cast, decorate, scaler) and warns loudly that the math is
fp32 — useful to dry-run a GPU config on a laptop.

The loss scaler is live in the dry run. ``AmpScaler.__init__`` disables itself unless the dygraph tracer's
expected place is a GPU/XPU/custom place; it reads that place through ``paddle.amp.grad_scaler._dygraph_tracer``
only there. :meth:`AmpConfig.grad_scaler` builds the scaler while that one name returns a tracer whose expected
place *reports* a GPU (:func:`_gpu_looking_tracer`); every tensor the scaler creates still goes to the real
(CPU) place. The scaler then scales, unscales, detects inf/NaN, updates its scale and saves its state exactly
as on a GPU; only the arithmetic is fp32.
"""
from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass, field
from typing import List, Optional

import paddle
from paddle.amp import grad_scaler as paddle_grad_scaler

from ..config.builders import AmpSettings
from ..device import has_accelerator

logger = logging.getLogger(__name__)


def device_supports_amp() -> bool:
    """True where Paddle has reduced-precision kernels (a CUDA, XPU or custom-device build)."""
    return has_accelerator()


@dataclass(frozen=True)
class AmpConfig:
    """Resolved mixed-precision settings (``enabled`` False means plain fp32)."""

    enabled: bool = False
    dtype: str = "float32"  # "float16" | "bfloat16" when enabled
    level: str = "O1"  # "O1" (per-op casting) | "O2" (weights cast, fp32 master weights)
    custom_white_list: List[str] = field(default_factory=list)
    custom_black_list: List[str] = field(default_factory=list)
    use_scaler: bool = False  # dynamic loss scaling: fp16 only (bf16 has fp32's exponent range)
    init_loss_scaling: float = 2.0**15
    master_grad: bool = False
    dry_run: bool = False  # True: wiring runs but the device computes in fp32 (CPU)

    @classmethod
    def for_device(cls, settings: AmpSettings, device_has_amp: Optional[bool] = None) -> "AmpConfig":
        """``settings`` on this device: without reduced-precision kernels, an error unless a dry run was asked for."""
        if not settings.enabled:
            return cls()
        if device_has_amp is None:
            device_has_amp = device_supports_amp()
        if not device_has_amp and not settings.fp32_dry_run:
            flag = "fp16" if settings.dtype == "float16" else "bf16"
            raise ValueError(
                f"{flag}=True needs a GPU/XPU: this Paddle build has no {flag} kernels on CPU; "
                "remove the flag, or pass --amp_on_cpu fp32_dry_run to run the AMP wiring in fp32"
            )
        return cls(
            enabled=True,
            dtype=settings.dtype,
            level=settings.level,
            custom_white_list=list(settings.custom_white_list),
            custom_black_list=list(settings.custom_black_list),
            use_scaler=settings.use_scaler,
            init_loss_scaling=settings.init_loss_scaling,
            master_grad=settings.master_grad,
            dry_run=not device_has_amp,
        )

    def warn_if_dry_run(self) -> None:
        if self.dry_run:
            logger.warning(
                "AMP DRY RUN: %s %s requested on a CPU-only Paddle; auto_cast/decorate/GradScaler are wired as "
                "configured but Paddle computes in float32 here. Losses and speed are NOT those of %s.",
                self.dtype, self.level, self.dtype,
            )

    def autocast(self):
        """The forward-pass context: ``paddle.amp.auto_cast`` with our settings, or a no-op in fp32."""
        if not self.enabled:
            return contextlib.nullcontext()
        return paddle.amp.auto_cast(
            enable=True,
            custom_white_list=self.custom_white_list or None,
            custom_black_list=self.custom_black_list or None,
            level=self.level,
            dtype=self.dtype,
        )

    def decorate(self, model, optimizer):
        """O2: cast weights and give the optimizer fp32 master weights (``paddle.amp.decorate``)."""
        if not self.enabled or self.level != "O2":
            return model, optimizer
        return paddle.amp.decorate(
            models=model, optimizers=optimizer, level="O2", dtype=self.dtype, master_grad=self.master_grad
        )

    def grad_scaler(self) -> Optional[paddle.amp.GradScaler]:
        """A dynamic ``GradScaler`` for fp16 (live in the CPU dry run too), None otherwise.

        Raises RuntimeError if Paddle hands back a disabled scaler: fp16 without loss scaling would train
        silently wrong, so there is no fallback.
        """
        if not (self.enabled and self.use_scaler):
            return None
        context = _gpu_looking_tracer() if self.dry_run else contextlib.nullcontext()
        with context:
            scaler = paddle.amp.GradScaler(init_loss_scaling=self.init_loss_scaling, use_dynamic_loss_scaling=True)
        if not scaler.is_enable():
            raise RuntimeError(
                f"paddle.amp.GradScaler came back disabled on {paddle.get_device()}: fp16 needs a live loss scaler; "
                "run on a GPU/XPU, or with --amp_on_cpu fp32_dry_run on CPU"
            )
        return scaler


class _PlaceReportingGpu:
    """A place that answers ``is_gpu_place()`` with True and forwards everything else to the real place."""

    def __init__(self, place):
        self._place = place

    def is_gpu_place(self) -> bool:
        return True

    def __getattr__(self, name):
        return getattr(self._place, name)


class _TracerWithGpuPlace:
    """The current tracer, with an expected place that reports a GPU (see :func:`_gpu_looking_tracer`)."""

    def __init__(self, tracer):
        self._tracer = tracer
        self._expected_place = _PlaceReportingGpu(tracer._expected_place)

    def __getattr__(self, name):
        return getattr(self._tracer, name)


@contextlib.contextmanager
def _gpu_looking_tracer():
    """While active, ``GradScaler`` construction sees a GPU as the expected place (CPU dry run only).

    Only the name ``paddle.amp.grad_scaler`` looks up in its own module is replaced, and only for the
    constructor call; tensors are still created on the real place.
    """
    real = paddle_grad_scaler._dygraph_tracer
    paddle_grad_scaler._dygraph_tracer = lambda: _TracerWithGpuPlace(real())
    try:
        yield
    finally:
        paddle_grad_scaler._dygraph_tracer = real
