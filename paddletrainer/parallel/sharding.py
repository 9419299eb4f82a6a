"""Sharding (ZeRO): stage 1 through fleet, stages 2 and 3 through Paddle's group-sharded classes.

* stage 1: ``fleet.distributed_optimizer`` → ``HybridParallelOptimizer`` → ``DygraphShardingOptimizer``
  (V1): whole parameters are assigned to sharding ranks greedily by size; each rank keeps the optimizer
  state of its own parameters, gradients are reduced to the owner and updated parameters broadcast back.
  V2 (``split_param``) is rejected on CPU by ``init_topology``.
* stage 2: ``GroupShardedOptimizerStage2`` + ``GroupShardedStage2`` on the sharding group (state and
  gradients sharded; dp, if any, all-reduces on top).
* stage 3: ``GroupShardedStage3`` (parameters sharded too: each rank keeps a flat slice of every
  parameter larger than ``segment_size`` elements, gathered on demand in forward/backward).

Paddle's stage 2/3 constructors assume a GPU; on CPU they are built inside
``cpu_backend.group_sharded_construction()``.
"""
from __future__ import annotations

import contextlib

import paddle

from .topology import needs_cpu_backend

__all__ = ["apply_sharding", "check_stage2_offload", "STAGE3_DEFAULT_SEGMENT_SIZE"]

# Parameters with more elements than this are sliced across the sharding group under stage 3; smaller
# ones stay whole (replicated) on every rank. Paddle's default is 2**20; on CPU every slice is padded to a
# 4096-byte boundary (1024 fp32 elements), so slicing tiny tensors only adds padding.
STAGE3_DEFAULT_SEGMENT_SIZE = 2**20


def _construction_scope():
    if not needs_cpu_backend():
        return contextlib.nullcontext()
    from . import cpu_backend

    return cpu_backend.group_sharded_construction()


def check_stage2_offload(dp_degree: int, *, fp16_parameters: bool) -> None:
    """Raise unless Paddle's stage-2 offload can run: it keeps fp32 masters of *half-precision* parameters
    on the host (it asserts AMP O2 fp16/bf16 weights) and refuses a dp group next to the sharding group."""
    if dp_degree > 1:
        raise ValueError(f"sharding 'stage2 offload' cannot be combined with data parallel (dp degree {dp_degree}); "
                         "use 'stage3 offload', or stage2 without offload")
    if not fp16_parameters:
        raise ValueError("sharding 'stage2 offload' needs fp16/bf16 parameters (--fp16/--bf16 with --fp16_opt_level O2), "
                         "which a CPU-only Paddle cannot train; use 'stage3 offload', or stage2 without offload")


def _has_half_parameters(model) -> bool:
    return any(p.dtype in (paddle.float16, paddle.bfloat16) for p in model.parameters())


def _device() -> str:
    return paddle.get_device().split(":")[0]


def apply_sharding(model, optimizer, *, topology, stage: int, offload: bool = False,
                   segment_size: int = STAGE3_DEFAULT_SEGMENT_SIZE, wrap_model: bool = True):
    """Shard ``optimizer`` (and, for stage 2/3, ``model``) over the sharding group.

    Args:
        stage: 1, 2 or 3.
        offload: keep the sharded fp32 master weights and optimizer state in host memory (Paddle's
            offload path). Stage 3 runs it on every device (on CPU through ``cpu_backend`` fill 7, with
            host and device the same memory); stage 2 needs fp16/bf16 parameters and no dp, see
            :func:`check_stage2_offload`.
        segment_size: stage 3 slicing threshold in elements (see ``STAGE3_DEFAULT_SEGMENT_SIZE``).
        wrap_model: stage 1 only: also wrap the model with ``fleet.distributed_model`` (``ShardingParallel``,
            which broadcasts the initial parameters). False when another axis already wrapped it.

    Returns ``(model, optimizer)`` as Paddle returns them.
    """
    if topology.sharding_degree == 1:
        raise ValueError("apply_sharding needs sharding_degree > 1")
    if stage == 1:
        from paddle.distributed import fleet

        if offload:
            raise ValueError("sharding stage1 has no offload; use stage2/stage3 offload")
        if wrap_model:
            model = fleet.distributed_model(model)
        return model, fleet.distributed_optimizer(optimizer)
    if stage not in (2, 3):
        raise ValueError(f"sharding stage must be 1, 2 or 3, got {stage}")
    if topology.pp_degree > 1:
        raise ValueError(f"sharding stage{stage} cannot be combined with pipeline parallel (use stage1)")
    if stage == 3 and topology.tp_degree > 1:
        raise ValueError("sharding stage3 cannot be combined with tensor parallel (use stage1 or stage2)")
    if offload and stage == 2:
        check_stage2_offload(topology.dp_degree, fp16_parameters=_has_half_parameters(model))
    if offload and needs_cpu_backend():
        from . import cpu_backend

        if not cpu_backend.is_installed():  # without fill 7 Paddle's offload moves free the only copy
            raise RuntimeError("sharding offload on CPU needs paddletrainer's CPU backend: create the topology "
                               "with paddletrainer.parallel.init_topology before apply_sharding")
    from paddle.distributed.fleet.meta_parallel.sharding.group_sharded_optimizer_stage2 import (
        GroupShardedOptimizerStage2,
    )
    from paddle.distributed.fleet.meta_parallel.sharding.group_sharded_stage2 import GroupShardedStage2
    from paddle.distributed.fleet.meta_parallel.sharding.group_sharded_stage3 import GroupShardedStage3

    group, dp_group, device = topology.sharding_group, topology.dp_group, _device()
    with _construction_scope():
        if stage == 2:
            optimizer = GroupShardedOptimizerStage2(params=optimizer._parameter_list, optim=optimizer, group=group,
                                                    offload=offload, dp_group=dp_group, device=device)
            model = GroupShardedStage2(model, optimizer, group=group, sync_buffers=True, dp_group=dp_group,
                                       device=device)
        else:
            model = GroupShardedStage3(model, optimizer=optimizer, group=group, sync_buffers=True,
                                       segment_size=segment_size, offload=offload, dp_group=dp_group,
                                       device=device, exclude_layer=["GroupNorm"])
    return model, optimizer
