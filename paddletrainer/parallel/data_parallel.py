"""Data parallel: plain ``paddle.DataParallel`` outside hybrid layouts, and the ``no_sync`` context."""
from __future__ import annotations

import contextlib

import paddle

from .sharding import is_stage2_model, stage2_no_sync

__all__ = ["apply_data_parallel", "no_sync"]


def apply_data_parallel(model, *, topology, find_unused_parameters: bool = False):
    """Wrap ``model`` in ``paddle.DataParallel`` over the dp group (plain data parallel only).

    In hybrid layouts dp is not a model wrapper: ``HybridParallelOptimizer`` all-reduces the dp
    gradients at step time (see :mod:`paddletrainer.parallel.apply`), so this is called only when
    dp is the sole axis. Gradients are averaged over the dp ranks during the backward pass.
    """
    if topology.dp_degree == 1:
        return model
    if topology.use_hybrid:
        raise ValueError("apply_data_parallel wraps plain data parallel only; hybrid layouts sync dp in the optimizer")
    return paddle.DataParallel(model, find_unused_parameters=find_unused_parameters)


def no_sync(model):
    """Context manager that skips the gradient all-reduce of the next backward passes.

    Use it around every micro-batch but the last of a gradient-accumulation step. It skips the
    reduction of the wrappers that synchronise during backward: ``paddle.DataParallel`` and sharding
    stage 2 (:func:`~.sharding.stage2_no_sync`: one reduction per optimizer step instead of one per
    micro-batch). Fleet's hybrid optimizer synchronises at step time anyway; sharding stage 3 still reduces
    every backward (its hooks also release the gathered parameters; the sum of per-micro-batch reductions
    equals the reduction of the sum, so only traffic, not correctness, depends on it): nothing to skip.
    """
    if isinstance(model, paddle.DataParallel):
        return model.no_sync()
    if is_stage2_model(model):
        return stage2_no_sync(model)
    return contextlib.nullcontext()
