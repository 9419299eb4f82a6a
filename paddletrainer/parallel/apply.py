"""``parallelize``: which axis functions wrap the model and optimizer, and in which order.

Order (each step names the function that does it):

1. checks: no ``grad_clip`` on the optimizer (clipping is :func:`~.collectives.clip_grad_norm`'s job, so
   Paddle never installs its GPU-only HybridParallelClipGrad / GroupShardedClipGrad).
2. one process → nothing; plain data parallel → :func:`~.data_parallel.apply_data_parallel`.
3. pp > 1 → :func:`~.pipeline.apply_pipeline`. ``PipelineParallel`` carries tp inside the stage and
   ``HybridParallelOptimizer`` carries dp and sharding stage 1 (stage 2/3 with pp are rejected).
4. otherwise tp > 1 → :func:`~.tensor.apply_tensor_parallel` wraps the model first, because the sharding
   wrappers of step 5 must see the ``TensorParallel`` model (its parameters are the tp-local shards).
5. sharding > 1 → :func:`~.sharding.apply_sharding`: stage 1 wraps the optimizer (and the model, unless tp
   did), stage 2/3 wrap both with the group-sharded classes.
6. any hybrid layout left without an optimizer wrapper (tp and/or dp only) → ``fleet.distributed_optimizer``
   (``HybridParallelOptimizer``: dp all-reduce, tp replicated-gradient checks).

The optimizer comes back as a :class:`~.optimizer.ParallelOptimizer` in every case, so the Trainer has one
interface: ``clip_grad_norm`` then ``optimizer.step()``.
"""
from __future__ import annotations

from typing import Optional

from .data_parallel import apply_data_parallel
from .optimizer import HYBRID, LOCAL, STAGE2, STAGE3, ParallelOptimizer
from .pipeline import apply_pipeline
from .sharding import STAGE3_DEFAULT_SEGMENT_SIZE, apply_sharding
from .tensor import apply_tensor_parallel

__all__ = ["parallelize"]


def _check_optimizer(optimizer) -> None:
    if getattr(optimizer, "_grad_clip", None) is not None:
        raise ValueError(
            "build the optimizer without grad_clip: paddletrainer clips with "
            "paddletrainer.parallel.clip_grad_norm(model, optimizer, topology, max_norm), which computes the norm "
            "across tp/pp/sharding ranks (Paddle's hybrid clip classes are GPU-only)"
        )


def _register_sequence_parallel_hooks(model, args) -> None:
    """Sequence parallel: parameters replicated across tp ranks (norms) see only their rank's part of the
    sequence, so their gradients are all-reduced over the tp group after the step's last micro-batch
    (Paddle's hooks, as PaddleNLP registers them). On CPU sequence parallel is refused before this runs."""
    from paddle.distributed.fleet.utils.sequence_parallel_utils import register_sequence_parallel_allreduce_hooks

    register_sequence_parallel_allreduce_hooks(model, args.gradient_accumulation_steps,
                                               bool(getattr(args, "fuse_sequence_parallel_allreduce", False)))


def _find_unused_parameters(model, args) -> bool:
    """``args.ddp_find_unused_parameters``; unset, PaddleNLP's default: True unless a layer uses recompute
    (searching for unused parameters breaks recomputed backward passes)."""
    chosen = getattr(args, "ddp_find_unused_parameters", None)
    if chosen is not None:
        return bool(chosen)
    return not any(getattr(layer, "enable_recompute", False) for layer in model.sublayers(include_self=True))


def parallelize(model, optimizer, topology, args, *, stage3_segment_size: Optional[int] = None):
    """Wrap ``model`` and ``optimizer`` for ``topology``; returns ``(model, ParallelOptimizer)``.

    ``args`` supplies ``sharding_stage`` (0..3), ``sharding_offload``, ``virtual_pp_degree`` and
    ``sharding_stage3_segment_size``
    (under sharding stage 3, parameters with more elements than this are sliced across the sharding group;
    the keyword ``stage3_segment_size`` overrides it). The model must already be built
    for the layout: tp-split layers when tp > 1 (PaddleNLP models do this from their config), a
    ``PipelineLayer`` when pp > 1. See the module docstring for the order of the axis functions.
    """
    _check_optimizer(optimizer)
    if topology.tp_degree > 1 and getattr(args, "sequence_parallel", False):
        _register_sequence_parallel_hooks(model, args)
    if topology.world_size == 1:
        return model, ParallelOptimizer(optimizer, mode=LOCAL, topology=topology)
    if not topology.use_hybrid:
        model = apply_data_parallel(model, topology=topology, find_unused_parameters=_find_unused_parameters(model, args))
        return model, ParallelOptimizer(optimizer, mode=LOCAL, topology=topology)

    from paddle.distributed import fleet

    stage = int(getattr(args, "sharding_stage", 0) or 0) if topology.sharding_degree > 1 else 0
    if topology.sharding_degree > 1 and stage == 0:
        stage = 1  # a sharding degree without a stage: PaddleNLP's default is stage1
    offload = bool(getattr(args, "sharding_offload", False))
    if stage3_segment_size is None:
        stage3_segment_size = getattr(args, "sharding_stage3_segment_size", STAGE3_DEFAULT_SEGMENT_SIZE)

    if topology.pp_degree > 1:
        if stage > 1:
            raise ValueError(f"sharding stage{stage} cannot be combined with pipeline parallel (use stage1)")
        model, optimizer = apply_pipeline(model, optimizer, topology=topology,
                                          virtual_pp_degree=args.virtual_pp_degree)
        return model, ParallelOptimizer(optimizer, mode=HYBRID, topology=topology, model=model)

    model = apply_tensor_parallel(model, topology=topology)
    if stage in (2, 3):
        model, optimizer = apply_sharding(model, optimizer, topology=topology, stage=stage, offload=offload,
                                          segment_size=stage3_segment_size)
        mode = STAGE2 if stage == 2 else STAGE3
        return model, ParallelOptimizer(optimizer, mode=mode, topology=topology, model=model)
    if stage == 1:
        model, optimizer = apply_sharding(model, optimizer, topology=topology, stage=1,
                                          wrap_model=topology.tp_degree == 1)
    else:
        optimizer = fleet.distributed_optimizer(optimizer)
    return model, ParallelOptimizer(optimizer, mode=HYBRID, topology=topology, model=model)
