"""``parallelize``: which axis functions wrap the model and optimizer, and in which order.

Order (each step names the function that does it):

1. checks: no ``grad_clip`` left on the optimizer or its groups (clipping is done after the gradient sync by
   :func:`~.clipping.clip_gradients` or :func:`~.clipping.clip_grad_norm`, so Paddle never installs its
   GPU-only HybridParallelClipGrad / GroupShardedClipGrad).
1b. every layout, one process included: off a CUDA device, PaddleNLP Llama/Qwen2 attention layers take packed
   rows' document masks (:func:`~.packed_attention.install_packed_attention`; Paddle has no FlashMask kernel
   there).
2. one process → nothing more; plain data parallel → :func:`~.data_parallel.apply_data_parallel` (with expert
   parallel, expert parameters reduced over their edp group: :class:`~.expert.ExpertGradients`).
3. pp > 1 → :func:`~.pipeline.apply_pipeline`. ``PipelineParallel`` carries tp inside the stage and
   ``HybridParallelOptimizer`` carries dp and sharding stage 1 (stage 2/3 with pp are rejected).
4. otherwise tp > 1 → :func:`~.tensor.apply_tensor_parallel` wraps the model first, because the sharding
   wrappers of step 5 must see the ``TensorParallel`` model (its parameters are the tp-local shards). Under
   expert parallel its dp broadcast must not reach the experts (:func:`~.expert.keep_experts`), and
   ``ParallelOptimizer`` reduces them over their edp group after fleet's dp sync of the dense parameters.
5. sharding > 1 → :func:`~.sharding.apply_sharding`: stage 1 wraps the optimizer (and the model, unless tp
   did), stage 2/3 wrap both with the group-sharded classes. Under expert parallel (stage 1 only) the experts are
   kept out of the sharded partition (:func:`~.expert.shard_dense_parameters`) and updated locally.
4b. sep > 1 → :func:`~.segment.apply_segment_parallel` (fleet's ``SegmentParallel`` when neither tp nor sharding
   stage 1 wraps the model; gradients are summed over sep by ``HybridParallelOptimizer``).
4c. cp > 1 → :func:`~.context.apply_context_parallel` (the CPU build's ring attention, and ``SegmentParallel``
   unless tp wraps the model: cp runs on fleet's sep groups, as in PaddleNLP).
6. any hybrid layout left without an optimizer wrapper (tp and/or dp only) → ``fleet.distributed_optimizer``
   (``HybridParallelOptimizer``: dp all-reduce, tp replicated-gradient checks).

The optimizer comes back as a :class:`~.optimizer.ParallelOptimizer` in every case, so the Trainer has one
interface: ``sync_gradients``, ``clip_grad_norm``, then ``optimizer.step()``.

Sequence parallel (a tensor-parallel option, not an axis of its own) registers its gradient hooks first:
:func:`apply_sequence_parallel` (the hooks are in :mod:`.sequence`). Under tp > 1 the model and the option must
agree (:func:`~.sequence.check_sequence_parallel_model`): a model built for sequence parallel without the option
would never sum its norms' gradients over tp, and the ranks would drift apart silently.
"""
from __future__ import annotations

import contextlib
from typing import Optional

from paddle.distributed import fleet

from .config import ParallelConfig, expect_config
from .data_parallel import apply_data_parallel, gradient_buffers
from .expert import ExpertGradients, check_expert_model, expert_parameters, keep_experts, shard_dense_parameters
from .optimizer import HYBRID, LOCAL, STAGE2, STAGE3, ParallelOptimizer
from .pipeline import apply_pipeline
from .context import apply_context_parallel
from .packed_attention import install_packed_attention
from .segment import apply_segment_parallel
from .sequence import check_sequence_parallel_model, register_sequence_parallel_hooks
from .sharding import apply_sharding
from .tensor import apply_tensor_parallel
from ..paddle_contract import optimizer_grad_clip, optimizer_param_groups

__all__ = ["parallelize", "wrap_captures_accumulation"]

_FILE = "paddletrainer/parallel/apply.py"  # named by the private reads it makes through paddle_contract


def _check_optimizer(optimizer) -> None:
    groups = optimizer_param_groups(optimizer, _FILE)
    group_clip = any(isinstance(g, dict) and g.get("grad_clip") is not None for g in groups)
    if optimizer_grad_clip(optimizer, _FILE) is not None or group_clip:
        raise ValueError(
            "take the optimizer's grad_clip off before parallelize: clip = paddletrainer.parallel.clipping."
            "take_gradient_clip(optimizer), then clip_gradients(optimizer, topology, clip) before each step (the "
            "Trainer does this); inside step() the clip would see only this rank's gradients"
        )


def wrap_captures_accumulation(topology, config: ParallelConfig) -> bool:
    """Whether :func:`parallelize` fixes ``config.accumulate_steps`` into the wrapped model: the sequence-parallel
    hooks count that many backward passes per all-reduce (tp > 1 with ``sequence_parallel``). The pipeline's
    count is fixed earlier, in the fleet strategy; the sharding wrappers take the step's end from ``no_sync``."""
    return topology.tp_degree > 1 and bool(config.sequence_parallel)


def apply_sequence_parallel(model, config: ParallelConfig) -> None:
    """Sequence parallel: parameters replicated across tp ranks (norms) see only their rank's part of the
    sequence, so their gradients are all-reduced over the tp group after the step's last micro-batch
    (Paddle's hooks, as PaddleNLP registers them; see :mod:`.sequence`)."""
    register_sequence_parallel_hooks(model, config.accumulate_steps, config.fuse_sequence_parallel_allreduce)


def enable_recompute(model) -> int:
    """Switch on activation recompute in every layer that supports it (PaddleNLP's ``enable_recompute``
    attribute; ``config.recompute`` too when the model has a config). Returns how many layers changed.

    A model with no such layer cannot recompute: that is an error, not a silent no-op.
    """
    layers = [m for m in model.sublayers(include_self=True) if hasattr(m, "enable_recompute")]
    if not layers:
        raise ValueError(
            f"recompute=True but {type(model).__name__} has no layer with an `enable_recompute` attribute; "
            "use a model that supports recompute or drop --recompute"
        )
    for layer in layers:
        layer.enable_recompute = True
    config = getattr(model, "config", None)
    if config is not None and hasattr(config, "recompute"):
        config.recompute = True
    return len(layers)


def _find_unused_parameters(model, chosen: Optional[bool]) -> bool:
    """``ddp_find_unused_parameters``; unset (None), PaddleNLP's default: True unless a layer uses recompute
    (searching for unused parameters breaks recomputed backward passes)."""
    if chosen is not None:
        return bool(chosen)
    return not any(getattr(layer, "enable_recompute", False) for layer in model.sublayers(include_self=True))


def parallelize(model, optimizer, topology, config: ParallelConfig, timed=None):
    """Wrap ``model`` and ``optimizer`` for ``topology``; returns ``(model, ParallelOptimizer)``.

    ``config``: the :class:`~.config.ParallelConfig` the topology was built from (``args.parallel_config``; a
    tool builds one, ``ParallelConfig(layout=topology.layout)`` for every option's default). It supplies the
    sharding stage, offload and ``stage3_segment_size``, sequence parallel and the virtual pipeline degree,
    and its construction has checked their combinations: nothing here checks them again. The model must
    already be built for the layout: tp-split layers when tp > 1 (PaddleNLP models do this from their
    config), a ``PipelineLayer`` when pp > 1. See the module docstring for the order of the axis functions.
    ``timed("optimizer")`` (optional) wraps the sharded or hybrid optimizer's construction (startup timing).
    """
    timed = timed or (lambda phase: contextlib.nullcontext())
    expect_config(config, "parallelize")
    if config.layout != topology.layout:
        raise ValueError(f"parallelize: the config's layout {config.layout.describe()} is not the topology's "
                         f"{topology.layout.describe()}; pass the ParallelConfig init_topology was called with")
    _check_optimizer(optimizer)
    if topology.tp_degree > 1:
        check_sequence_parallel_model(model, config.sequence_parallel)
        if wrap_captures_accumulation(topology, config):
            apply_sequence_parallel(model, config)
    # ep > 1 runs with dp, tp, pp and stage 1 (ParallelConfig); under pp a stage may hold no MoE layer. The
    # Trainer ran this before any group too.
    check_expert_model(model, topology.layout.ep, config.sequence_parallel and topology.tp_degree > 1,
                       staged=topology.pp_degree > 1)
    install_packed_attention(model)  # document masks of packed rows where Paddle has no FlashMask kernel
    if topology.world_size == 1:
        return model, ParallelOptimizer(optimizer, mode=LOCAL, topology=topology)
    if not topology.use_hybrid:
        model = apply_data_parallel(model, topology=topology,
                                    find_unused_parameters=_find_unused_parameters(model, config.find_unused_parameters))
        return model, ParallelOptimizer(optimizer, mode=LOCAL, topology=topology, dp_buffers=gradient_buffers(model),
                                        expert_grads=_expert_gradients(model, topology))

    experts = _expert_gradients(model, topology)
    if topology.pp_degree > 1:
        # fleet's dp broadcast skips the experts (no_sync); they are broadcast over their edp group only
        with keep_experts(model, topology):
            model, optimizer = apply_pipeline(model, optimizer, topology=topology,
                                              virtual_pp_degree=config.virtual_pp_degree)
        model = apply_segment_parallel(model, topology=topology, wrapped=True)  # PipelineParallel syncs over sep
        return model, ParallelOptimizer(optimizer, mode=HYBRID, topology=topology, model=model, expert_grads=experts)

    with keep_experts(model, topology):  # TensorParallel broadcasts every parameter over dp
        model = apply_tensor_parallel(model, topology=topology)
    stage = config.sharding_stage  # 0 unless the layout has a sharding group (ParallelConfig's check)
    # sep: no pp and no stage 2/3 here (ParallelConfig); the tp or stage-1 wrapper broadcasts over sep itself
    model = apply_segment_parallel(model, topology=topology, wrapped=topology.tp_degree > 1 or stage == 1)
    # cp: no pp and no sharding here (ParallelConfig); the tp wrapper broadcasts over the sep group cp runs on
    model = apply_context_parallel(model, topology=topology, wrapped=topology.tp_degree > 1)
    if stage in (2, 3):
        with timed("optimizer"):
            model, optimizer = apply_sharding(model, optimizer, topology=topology, config=config)
        mode = STAGE2 if stage == 2 else STAGE3
        return model, ParallelOptimizer(optimizer, mode=mode, topology=topology, model=model)
    local_experts = False
    if stage == 1:
        # experts stay out of the sharded partition and broadcasts; ParallelOptimizer updates them locally
        local_experts = experts is not None
        with shard_dense_parameters(optimizer, experts.parameters if local_experts else []), \
                keep_experts(model, topology), timed("optimizer"):
            model, optimizer = apply_sharding(model, optimizer, topology=topology, config=config,
                                              wrap_model=topology.tp_degree == 1)
    else:
        with timed("optimizer"):
            optimizer = fleet.distributed_optimizer(optimizer)
    return model, ParallelOptimizer(optimizer, mode=HYBRID, topology=topology, model=model, expert_grads=experts,
                                    local_experts=local_experts)


def _expert_gradients(model, topology):
    """Under expert parallel, the expert half of the gradient sync (:class:`~.expert.ExpertGradients`); else None."""
    if topology.layout.ep == 1:
        return None
    return ExpertGradients(expert_parameters(model), group=topology.group("edp"),
                           data_world_size=topology.data_world_size)
