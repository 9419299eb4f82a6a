"""Data parallel: plain ``paddle.DataParallel`` outside hybrid layouts, and the ``no_sync`` context."""
from __future__ import annotations

import contextlib

import paddle

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

    Use it around every micro-batch but the last of a gradient-accumulation step. It is a real
    ``no_sync`` only for ``paddle.DataParallel``, the one wrapper that synchronises during backward.
    Every other wrapper either synchronises at step time (fleet's hybrid optimizer) or reduces every
    backward into the owners' gradients (sharding stage 2/3: the sum of per-micro-batch reductions equals
    the reduction of the sum, so correctness does not depend on skipping), so the context does nothing.
    """
    if isinstance(model, paddle.DataParallel):
        return model.no_sync()
    return contextlib.nullcontext()
