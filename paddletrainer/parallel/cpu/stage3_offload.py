"""Sharding stage 3 offload on Paddle's CPU build: host<->device moves that copy instead of aliasing.

``GroupShardedStage3(offload=True)`` keeps each rank's fp32 master slice in host memory and moves the working
copy between host and device around every forward/backward. Its move helpers assume two memories: on a CPU
build ``tensor.cpu()`` returns the *same* tensor, so "copy to host, then free the device tensor" frees the only
copy ("Tensor not initialized yet"), and ``tensor.to("cpu:0")`` is not a valid place. The fill keeps Paddle's
offload control flow (master weights, fp32 host gradients, the optimizer step under ``device_guard``) and only
makes each move a real copy, so the offload path runs on CPU exactly as it would with an accelerator, with
host and "device" being the same memory. Replaced: ``group_sharded_stage3._device2cpu`` / ``_cpu2device`` and
the unsliced-parameter part of ``GroupShardedStage3._clear_gradients``.
"""
from __future__ import annotations

import paddle
from paddle.distributed.fleet.meta_parallel.sharding import group_sharded_stage3 as gs3

from .paddle_checks import Assumption, paddle_source, params_of

__all__ = ["install", "assumptions"]


def _offload_to_host(tensor, convert_dtype=False):
    """Replaces ``group_sharded_stage3._device2cpu``: a host copy of ``tensor``; frees ``tensor`` unless converting.

    Paddle frees only the temporary fp32 cast when ``convert_dtype`` is set (the caller still owns the
    original gradient), and the tensor itself otherwise; the fill frees the same one.
    """
    if convert_dtype:
        return paddle.cast(tensor, "float32")  # a new tensor even for float32 input
    host = tensor.detach().clone()
    tensor._clear_data()
    return host


def _offload_to_device(param):
    """Replaces ``group_sharded_stage3._cpu2device``: a working copy of ``param.fw_storage`` in the training dtype."""
    copy = param.fw_storage.detach().clone()
    dtype = gs3.param2dtype.get(param.name, copy.dtype)
    return copy if copy.dtype == dtype else paddle.cast(copy, dtype)


def _make_clear_gradients(original_clear):
    @paddle.autograd.no_grad()
    def clear_gradients(self):
        if not self._offload:
            return original_clear(self)
        # Paddle's offload branch copies each unsliced parameter back from its host master with
        # ``param.to(device + ":" + id)``, which has no CPU form. Do that branch here (clear the gradient,
        # give the parameter its own copy in the training dtype, rebuild the released gradient buffers),
        # then run Paddle's method as without offload: its sliced-parameter part does not depend on the
        # flag, and its non-offload unsliced part only zeroes the freshly rebuilt (already zero) buffers.
        for param in list(self._unslice_params):
            if self.use_main_grad:
                param.main_grad = None
            else:
                param.clear_gradient(False)
            paddle.cast(param, gs3.param2dtype.get(param.name, param.dtype))._share_buffer_to(param)
        for grad_storage in self._grad_storages.values():
            grad_storage.manual_release()
            grad_storage.rebuild()
        self._offload = False
        try:
            return original_clear(self)
        finally:
            self._offload = True

    clear_gradients.__paddletrainer_fill__ = True
    clear_gradients.__wrapped_paddle__ = original_clear
    return clear_gradients


def install() -> None:
    """Put the copying moves in place (idempotent; called once by :func:`paddletrainer.parallel.cpu.install`)."""
    for name, fill in (("_device2cpu", _offload_to_host), ("_cpu2device", _offload_to_device)):
        if getattr(gs3, name) is not fill:
            fill.__wrapped_paddle__ = getattr(gs3, name)
            setattr(gs3, name, fill)
    original_clear = gs3.GroupShardedStage3._clear_gradients
    if not getattr(original_clear, "__paddletrainer_fill__", False):
        gs3.GroupShardedStage3._clear_gradients = _make_clear_gradients(original_clear)


def assumptions() -> list:
    """What this fill relies on in Paddle (checked by :func:`paddletrainer.parallel.cpu.check_paddle_assumptions`)."""
    return [
        Assumption(lambda: params_of(gs3._device2cpu)[:2] == ["trans_param", "convert_dtype"],
                   "group_sharded_stage3._device2cpu(trans_param, convert_dtype) signature changed"),
        Assumption(lambda: params_of(gs3._cpu2device)[:1] == ["param"],
                   "group_sharded_stage3._cpu2device(param) changed"),
        Assumption(lambda: all(part in paddle_source(gs3._device2cpu) for part in (".cpu()", "_clear_data()")),
                   "group_sharded_stage3._device2cpu no longer copies with .cpu() then frees (drop _offload_to_host?)"),
        Assumption(lambda: "global param2dtype" in paddle_source(gs3.GroupShardedStage3.__init__),
                   "GroupShardedStage3 no longer records parameter dtypes in the module global param2dtype"),
        Assumption(lambda: all(part in paddle_source(gs3.GroupShardedStage3._clear_gradients)
                               for part in ("self._offload", "self._unslice_params", "manual_release", "rebuild",
                                            'self._default_device + ":"')),
                   "GroupShardedStage3._clear_gradients' offload branch changed (review _make_clear_gradients)"),
    ]
