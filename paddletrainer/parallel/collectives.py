"""Reductions across the parallel groups: loss averaging, object gathering, the global gradient norm, and the
in-place gradient scaling the clip (:mod:`.clipping`) uses."""
from __future__ import annotations

import paddle
import paddle.distributed as dist
from paddle import _C_ops

__all__ = [
    "mean_over_data_group",
    "sum_over_data_group",
    "all_gather_object",
    "all_gather_object_over_data_group",
    "global_grad_norm",
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


def sum_over_data_group(tensor, topology):
    """The sum of ``tensor`` over the data ranks (dp × sharding): one all-reduce, whose result stays on the
    device; ``tensor`` itself (not a copy) with one data rank."""
    if topology.data_group is None or topology.data_world_size == 1:
        return tensor
    out = tensor.detach().clone()
    dist.all_reduce(out, group=topology.data_group)
    return out


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


def _check_group(topology):
    """The group whose ranks together hold every counted gradient once: Paddle's hybrid "check" group (all
    ranks with this rank's dp coordinate: tp × pp × sharding), or None when no reduction is needed."""
    # dp ranks hold identical synchronised gradients, so dp is never summed; the partial sums over tp, pp and
    # sharding are disjoint (see ParallelOptimizer.counted_gradients).
    if topology.layout.ep > 1:  # each ep rank holds other experts: the world (ParallelOptimizer counts once)
        return dist.collective._get_default_group()
    if topology.hcg is None:
        return None
    group = topology.hcg.get_check_parallel_group()
    return group if group is not None and group.nranks > 1 else None


@paddle.no_grad()
def global_grad_norm(optimizer, topology, nonfinite=None):
    """The L2 norm of the full model's gradient (float32 scalar tensor, equal on every rank; never read here).

    ``optimizer`` is a :class:`~paddletrainer.parallel.optimizer.ParallelOptimizer`. Its gradients are first
    synchronised (``optimizer.sync_gradients()``, which does nothing when this step's gradients already are, as
    in the Trainer's loop, which calls it visibly). Each rank sums the squares of the gradients it counts — one
    ``squared_l2_norm`` kernel per gradient, each result cast to float32 before they are added, so bf16/fp16
    squares are summed in float32 — and one all-reduce over the hybrid check group adds those partial sums, so
    the result equals one process's ``sqrt(Σ_p Σ g_p²)`` over all parameters.

    ``nonfinite`` (optional bool tensor): this rank saw an inf/NaN in a gradient it does not count (a
    replicated tp gradient on tp rank > 0, a sharding non-owner's copy). It makes this rank's partial sum
    inf before the reduction, so the norm is non-finite on every rank: one verdict for the whole job
    without an extra collective.
    """
    optimizer.sync_gradients()
    return _global_norm(optimizer.counted_gradients(), topology, nonfinite)


def _squares(grad):
    """``Σ grad²`` as a float32 ``[1]`` tensor, so that the squares of all gradients are summed in float32 (a
    bf16 sum of many squares would drop the small ones). The kernel's output has its input's dtype: fp16 is cast
    before it (fp16 tops out at 65504), bf16 after it (one scalar), except on CPU, whose kernel is float32/64 only."""
    if grad.dtype == paddle.float16 or (grad.dtype == paddle.bfloat16 and grad.place.is_cpu_place()):
        grad = grad.astype("float32")
    square = _C_ops.squared_l2_norm(grad)
    return square if square.dtype == paddle.float32 else square.astype("float32")


def _global_norm(gradients, topology, nonfinite):
    parts = [_squares(grad) for grad, counted in gradients if counted]
    if not parts:
        square_sum = paddle.zeros([1], dtype="float32")
    else:
        square_sum = paddle.add_n(parts) if len(parts) > 1 else parts[0]
    if nonfinite is not None:
        square_sum = paddle.where(nonfinite.reshape([1]), paddle.full([1], float("inf"), dtype="float32"), square_sum)
    group = _check_group(topology)
    if group is not None:
        dist.all_reduce(square_sum, group=group)
    return paddle.sqrt(square_sum).reshape([])


def _scale_in_place(grad, coef, coef_of: dict) -> None:
    """``grad *= coef`` (``coef``: a float32 scalar tensor), with no host read.

    The kernel depends on the device, the product does not. A float32 gradient on CPU, with ``coef`` on CPU
    too, takes the scale kernel: Paddle's CPU broadcasting multiply walks the broadcast index per element and
    is ~7x slower than the vectorised ``x * s`` of ``scale_`` (the clip of the Llama overhead benchmark went
    from 2.9 to 1.5 ms per step), and ``scale_`` may take ``coef`` as a tensor there because reading it is a
    plain memory load. Everywhere else (GPU, or a gradient offloaded to CPU while ``coef`` is on the GPU) it is
    the broadcasting multiply, ``coef`` cast once per gradient dtype (``coef_of`` caches the casts): ``scale_``
    would copy a device ``coef`` to the host, a stall per gradient. Both compute the float32 product
    ``grad * coef``; ``scale_`` adds a bias of +0.0, which can only turn a -0.0 into +0.0.
    """
    if grad.dtype == paddle.float32 and grad.place.is_cpu_place() and coef.place.is_cpu_place():
        _C_ops.scale_(grad, coef, 0.0, True)
        return
    if grad.dtype not in coef_of:
        coef_of[grad.dtype] = coef.astype(grad.dtype)
    grad.multiply_(coef_of[grad.dtype])
