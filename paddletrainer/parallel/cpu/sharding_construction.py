"""Building Paddle's sharding wrappers on its CPU build: stage 2/3 constructors, stage1 V2 comm buffers.

* Stage 2/3 (:func:`group_sharded_construction`): ``GroupShardedOptimizerStage2``, ``GroupShardedStage2`` and
  ``GroupShardedStage3`` assume a GPU in their constructors only; a scope makes those assumptions true while
  ``parallel.sharding`` builds them, and restores Paddle afterwards.
* Stage1 V2 (``split_param``, :func:`install`): ``tensor_fusion_helper.alignment`` gets an entry for the device
  type it reports on CPU ("unknown"), with the GPU's 256 bytes, so the comm buffers (and the slices each rank
  owns) are laid out exactly as on a GPU.

Stage 3 offload's host/device moves are :mod:`.stage3_offload`.
"""
from __future__ import annotations

import contextlib
import inspect

import paddle
from paddle.base import core
from paddle.distributed.fleet.meta_parallel.sharding import (
    group_sharded_optimizer_stage2 as gso2,
    group_sharded_stage3 as gs3,
    group_sharded_storage,
)
from paddle.distributed.fleet.utils import tensor_fusion_helper

from .paddle_checks import Assumption, paddle_source, params_of

__all__ = ["install", "assumptions", "group_sharded_construction", "CPU_FUSION_DEVICE_TYPE"]

CPU_FUSION_DEVICE_TYPE = "unknown"  # what tensor_fusion_helper.get_current_device_type finds for CPUPlace


@contextlib.contextmanager
def group_sharded_construction():
    """Scope in which GroupShardedOptimizerStage2 / GroupShardedStage2 / GroupShardedStage3 can be built.

    Their constructors assume a GPU; during construction only we make these true:

    * ``core.is_compiled_with_cuda()`` → True: passes the asserts "Only GPU and XPU and CustomDevice is
      supported now" (group_sharded_optimizer_stage2.py) and "Only support CUDA / XPU / CustomDevice."
      (group_sharded_stage3.py). Nothing else in construction branches on it for device="cpu".
    * ``paddle.get_device()`` → "cpu:0": the stage-2 optimizer parses a device index from it
      (``int(paddle.get_device().split(":")[1])``) and would raise IndexError on "cpu".
    * ``ParamStorage.add_rank_params(convert_gpu=False)``: with True it calls ``param.cpu()``, which on
      CPU aliases the parameter, then clears it, destroying the weights ("Tensor not initialized yet").

    Training afterwards needs none of these; stage 3 offload needs :mod:`.stage3_offload` (installed with the
    other fills). Gradient clipping is done by :func:`paddletrainer.parallel.clipping.clip_grad_norm`, so
    Paddle's GroupShardedClipGrad (which calls ``.cuda``) is never installed.
    """
    saved_cuda = core.is_compiled_with_cuda
    saved_get_device = paddle.get_device
    saved_add = group_sharded_storage.ParamStorage.add_rank_params

    def add_rank_params(self, trainable_params, param2align, convert_gpu=True):
        return saved_add(self, trainable_params, param2align, convert_gpu=False)

    core.is_compiled_with_cuda = lambda: True
    paddle.get_device = lambda: "cpu:0"
    group_sharded_storage.ParamStorage.add_rank_params = add_rank_params
    try:
        yield
    finally:
        core.is_compiled_with_cuda = saved_cuda
        paddle.get_device = saved_get_device
        group_sharded_storage.ParamStorage.add_rank_params = saved_add


def install() -> None:
    """Give stage1 V2's buffers the GPU's alignment on CPU (called once by :func:`.cpu.install`)."""
    tensor_fusion_helper.alignment.setdefault(CPU_FUSION_DEVICE_TYPE, tensor_fusion_helper.alignment["gpu"])


def assumptions() -> list:
    """What this fill relies on in Paddle (checked by :func:`paddletrainer.parallel.cpu.check_paddle_assumptions`)."""
    return [
        Assumption(lambda: "core.is_compiled_with_cuda()"
                   in inspect.getsource(gso2.GroupShardedOptimizerStage2.__init__),
                   "GroupShardedOptimizerStage2.__init__ no longer asserts is_compiled_with_cuda (drop that part of "
                   "group_sharded_construction?)"),
        Assumption(lambda: "core.is_compiled_with_cuda()" in inspect.getsource(gs3.GroupShardedStage3.__init__),
                   "GroupShardedStage3.__init__ no longer asserts is_compiled_with_cuda (drop that part of "
                   "group_sharded_construction?)"),
        Assumption(lambda: "convert_gpu" in params_of(group_sharded_storage.ParamStorage.add_rank_params),
                   "ParamStorage.add_rank_params lost its convert_gpu argument"),
        Assumption(lambda: "update_scaler" in inspect.getsource(gs3.GroupShardedStage3._redefine_opt_step),
                   "GroupShardedStage3's optimizer step no longer honours update_scaler"),
        Assumption(lambda: "gpu" in tensor_fusion_helper.alignment
                   and '"unknown"' in paddle_source(tensor_fusion_helper.get_current_device_type)
                   and "alignment[get_current_device_type()]"
                   in paddle_source(tensor_fusion_helper.build_reduce_scatter_buffer),
                   "tensor_fusion_helper no longer pads V2 comm buffers by alignment[get_current_device_type()] "
                   "with 'unknown' for a CPU place (review the stage1 V2 alignment entry)"),
    ]
