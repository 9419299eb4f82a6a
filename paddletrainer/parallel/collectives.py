"""Reductions across the parallel groups: loss averaging, object gathering, the global gradient norm."""
from __future__ import annotations

import paddle
import paddle.distributed as dist

__all__ = [
    "mean_over_data_group",
    "all_gather_object",
    "all_gather_object_over_data_group",
    "global_grad_norm",
    "clip_grad_norm",
]


def mean_over_data_group(tensor, topology):
    """The mean of ``tensor`` over the data ranks (dp × sharding); a new tensor, the input is untouched.

    Each data rank computes its loss on its own samples; tp and pp ranks of one data rank already agree
    (the pipeline broadcasts the loss from its last stage), so only the data group is averaged.
    """
    out = tensor.detach().clone()
    group = topology.data_group
    if group is None or topology.data_world_size == 1:
        return out
    dist.all_reduce(out, group=group)
    return out / topology.data_world_size


def all_gather_object(obj, group=None) -> list:
    """Every member's ``obj`` (picklable), in group-rank order; ``[obj]`` without a process group."""
    if dist.get_world_size() == 1 or (group is not None and group.nranks == 1):
        return [obj]
    gathered = []
    dist.all_gather_object(gathered, obj, group=group)
    return gathered


def all_gather_object_over_data_group(obj, topology) -> list:
    """:func:`all_gather_object` over the data group (dp × sharding), ordered by ``data_rank``."""
    if topology.data_world_size == 1:
        return [obj]
    return all_gather_object(obj, group=topology.data_group)


def _norm_groups(topology):
    # The partial sums are disjoint across tp, pp and sharding (see ParallelOptimizer.counted_gradients);
    # dp ranks hold identical synchronised gradients, so dp is never summed.
    return [g for g in (topology.tp_group, topology.pp_group, topology.sharding_group) if g is not None]


@paddle.no_grad()
def global_grad_norm(optimizer, topology, nonfinite=None):
    """The L2 norm of the full model's gradient (float32 scalar tensor, equal on every rank).

    ``optimizer`` is a :class:`~paddletrainer.parallel.optimizer.ParallelOptimizer`; its gradients are
    synchronised first. Each rank sums the squares of the gradients it counts; those partial sums are
    added over the tp, pp and sharding groups, so the result equals one process's
    ``sqrt(Σ_p Σ g_p²)`` over all parameters.

    ``nonfinite`` (optional bool tensor): this rank saw an inf/NaN in a gradient it does not count (a
    replicated tp gradient on tp rank > 0, a sharding non-owner's copy). It makes this rank's partial sum
    inf before the reduction, so the norm is non-finite on every rank: one verdict for the whole job
    without an extra collective.
    """
    optimizer.sync_gradients()
    square_sum = paddle.zeros([], dtype="float32")
    for grad, counted in optimizer.counted_gradients():
        if counted:
            g = grad if grad.dtype == paddle.float32 else grad.astype("float32")  # no copy for fp32 grads
            square_sum = square_sum + paddle.sum(paddle.square(g))
    if nonfinite is not None:
        square_sum = paddle.where(nonfinite.reshape([]), paddle.full([], float("inf"), dtype="float32"), square_sum)
    for group in _norm_groups(topology):
        dist.all_reduce(square_sum, group=group)
    return paddle.sqrt(square_sum)


@paddle.no_grad()
def clip_grad_norm(model, optimizer, topology, max_norm: float | None, nonfinite=None):
    """Synchronise gradients, clip them to ``max_norm`` by global norm, and return the pre-clip norm.

    The arithmetic is that of ``paddle.nn.ClipGradByGlobalNorm``: every gradient is multiplied by
    ``max_norm / max(norm, max_norm)`` (so nothing changes when the norm is below ``max_norm``).
    ``max_norm`` None or <= 0 only measures. Call between the last backward and ``optimizer.step()``.
    ``model`` is accepted for symmetry with the training step; the optimizer knows the parameters.
    ``nonfinite``: see :func:`global_grad_norm`.
    """
    del model
    norm = global_grad_norm(optimizer, topology, nonfinite)
    if max_norm is None or max_norm <= 0:
        return norm
    limit = paddle.full([], float(max_norm), dtype="float32")
    coef = limit / paddle.maximum(norm, limit)
    # Multiply unconditionally (by exactly 1.0 when under the limit) rather than test `coef < 1` on the
    # host: reading it would stall the device every step.
    for grad, _ in optimizer.counted_gradients():
        grad.multiply_(coef.astype(grad.dtype))
    return norm
