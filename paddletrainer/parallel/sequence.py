"""Sequence parallel (Megatron-style, under tensor parallel): the gradient hooks of its replicated parameters.

With ``sequence_parallel`` a PaddleNLP model built with ``config.sequence_parallel`` splits the activations
between the tensor-parallel layers along the sequence (``ScatterOp`` / ``AllGatherOp`` / ``ReduceScatterOp``,
``Column/RowSequenceParallelLinear``), so a parameter replicated across the tp group (the norms, the row
layers' biases — Paddle marks them ``sequence_parallel``) gets from each rank the gradient of only that
rank's part of the sequence. The sum over the tp group is the full gradient; Paddle's backward hooks
all-reduce it after the step's last micro-batch, as PaddleNLP's Trainer registers them. On a CPU build the
reduce-scatter those ops need comes from :mod:`paddletrainer.parallel.cpu.reduce_scatter`.
"""
from __future__ import annotations

from paddle.distributed import fleet
from paddle.distributed.fleet.utils import sequence_parallel_utils as spu

__all__ = ["check_sequence_parallel_model", "register_sequence_parallel_hooks"]


def check_sequence_parallel_model(model, enabled: bool) -> None:
    """Raise ``ValueError`` unless ``model`` (under tp > 1) and the ``sequence_parallel`` option agree: the model
    has parameters Paddle marks sequence-parallel exactly when the option is on."""
    marked = any(spu.is_sequence_parallel_parameter(p) for p in model.parameters())
    if marked and not enabled:
        raise ValueError("sequence_parallel is off but the model has sequence-parallel parameters (built with "
                         "config.sequence_parallel): pass --sequence_parallel, or build the model without it")
    if enabled and not marked:
        raise ValueError("sequence_parallel is on but the model has no sequence-parallel parameter: set "
                         "config.sequence_parallel on the model too, or drop --sequence_parallel")


def register_sequence_parallel_hooks(model, accumulation_steps: int, fused: bool) -> None:
    """Register the tp all-reduce of every ``sequence_parallel`` parameter's gradient (after ``accumulation_steps``
    backward passes); ``fused`` (``fuse_sequence_parallel_allreduce``) all-reduces them as one coalesced buffer.

    The unfused hooks are Paddle's own (``register_sequence_parallel_allreduce_hooks``). Paddle 3.3.1's fused
    hook (``create_fused_allreduce_gradient_hook``) takes a ``grad`` argument, but ``_register_backward_hook``
    calls hooks without arguments, so with the flag on the first backward fails ("GradNodePyLayer_...: Get
    backward function failed") on every device; here the same hook is called through a zero-argument adapter.

    Requirement: every trainable sequence-parallel parameter gets a gradient in every micro-batch. Paddle's
    hooks do not know the step; they count backward calls — the unfused hook each parameter's own, all-reducing
    at every ``accumulation_steps``-th; the fused hook all parameters' together, all-reducing when the count
    reaches ``accumulation_steps × len(params)``. A parameter left out of one micro-batch's backward (a layer
    skipped by a condition, a frozen branch) shifts that count: the all-reduce then runs in a later step or
    mid-accumulation, nothing fails, and the tp ranks' replicated weights drift apart.
    """
    if accumulation_steps <= 0 or fleet.get_hybrid_communicate_group().get_model_parallel_world_size() <= 1:
        return
    if not fused:
        spu.register_sequence_parallel_allreduce_hooks(model, accumulation_steps, False)
        return
    params = [p for p in model.parameters() if spu.is_sequence_parallel_parameter(p) and not p.stop_gradient]
    hook = spu.create_fused_allreduce_gradient_hook(params, accumulation_steps)
    for param in params:
        param._register_backward_hook(lambda: hook(None))
