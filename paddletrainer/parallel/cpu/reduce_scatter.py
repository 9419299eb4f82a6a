"""An exact reduce-scatter for gloo, which has none: sequence parallel and sharding stage1 V2 on Paddle's CPU build.

Paddle's gloo process group has no reduce-scatter ("Unimplemented cpu kernel for CReduceScatterOp"; its
``reduce_scatter_tensor`` binding exists but gloo rejects it) and no all-to-all, so Megatron-style sequence
parallel (``sequence_parallel_utils.reduce_scatter`` → ``paddle.distributed.stream.reduce_scatter``) and
sharding stage1 V2 (``tensor_fusion_helper`` → ``paddle.distributed.reduce_scatter``) cannot run on CPU.

The fill builds it from ``all_reduce``, which gloo has: rank ``r`` of an ``n``-rank group sums the whole
input over the group, then keeps its ``r``-th of ``n`` equal chunks of the flattened result. Element ``i``
of that chunk is ``Σ_k x_k[r·m + i]`` — by definition what a reduce-scatter returns — and since every rank
receives the same all-reduced bits, the chunks of all ranks fit together into the same sum, as a
single-process computation of the full (unsplit) sum would produce up to the summation order. The cost is
an all-reduce's traffic, ``2(n-1)/n`` of the input per rank instead of reduce-scatter's ``(n-1)/n``; gloo
offers no cheaper exact primitive (no all-to-all; ``n`` rooted reduces would serialise ``n`` calls).

Everything else sequence parallel needs already runs on gloo: ``ScatterOp`` is a local slice,
``GatherOp``/``AllGatherOp`` call ``ProcessGroup.all_gather(in, out)`` (gloo implements it), and the
allreduce hooks of sequence-parallel parameters call ``all_reduce``. So the fill is the whole of sequence
parallel's CPU support.

Replaced (:func:`install` puts them in place, :func:`assumptions` lists what that relies on in Paddle):

* ``paddle.distributed.communication.stream.reduce_scatter._reduce_scatter_tensor_in_dygraph`` and
  ``._reduce_scatter_in_dygraph`` — the two functions every dygraph reduce-scatter of Paddle ends in
  (``paddle.distributed.stream.reduce_scatter``, ``paddle.distributed.reduce_scatter`` for ops other than
  AVG, ``_reduce_scatter_base``);
* ``paddle.distributed.reduce_scatter`` (public, the name ``tensor_fusion_helper`` looks up): Paddle's handles
  ``ReduceOp.AVG`` by reading ``core.nccl_version()``, which a CPU build does not have.
"""
from __future__ import annotations

import importlib

import paddle
import paddle.distributed as dist
from paddle.distributed import communication
from paddle.distributed.communication.group import _warn_cur_rank_not_in_group
from paddle.distributed.fleet.utils import sequence_parallel_utils

from .blocking import DoneTask, group_or_world
from .paddle_checks import Assumption, paddle_source, params_of

__all__ = ["install", "assumptions", "reduce_scatter", "reduce_scatter_into", "STREAM_MODULE"]

# The module, by name: the package's attribute ``stream.reduce_scatter`` is the function of the same name, which
# shadows the module for ``import ... as`` and ``from ... import``.
STREAM_MODULE = "paddle.distributed.communication.stream.reduce_scatter"
_stream_module = importlib.import_module(STREAM_MODULE)
# The largest all-reduce of a scratch input (see _all_reduce_in_pieces): gloo's working memory is 2/n of this.
ALL_REDUCE_PIECE_BYTES = 16 * 2**20




@paddle.no_grad()
def reduce_scatter_into(out_tensor, in_tensor, op=dist.ReduceOp.SUM, group=None, scratch_input: bool = False):
    """Write into ``out_tensor`` this rank's chunk of ``in_tensor`` reduced over ``group``; exact (see module).

    ``in_tensor`` holds ``group.nranks × out_tensor.numel()`` elements, chunked in memory order as NCCL does
    (for a tensor split along dim 0, chunk ``r`` is rows ``[r·s/n, (r+1)·s/n)``). ``op`` is SUM, AVG (the
    sum divided by ``n``), MAX, MIN or PROD. ``out_tensor`` may be a view into ``in_tensor`` (sharding V2
    reduces a fused gradient buffer into its own slice): the input is copied before the all-reduce, so the
    other ranks' chunks of ``in_tensor`` keep this rank's unreduced values, as with a real reduce-scatter.
    A rank outside ``group`` takes no part: nothing is written (as Paddle's collectives skip such a rank).
    ``scratch_input``: the caller drops ``in_tensor`` afterwards (stage 3's padded gradient), so it is reduced in
    place instead of in a copy (the same sum; one gradient-sized buffer less at the peak). ``out_tensor`` must
    then not alias it.
    """
    group = group_or_world(group)
    n, r = group.nranks, group.rank
    if r < 0:  # not a member: it must neither join the all-reduce nor take some member's chunk
        return
    size = int(out_tensor.numel())
    if int(in_tensor.numel()) != n * size:
        raise ValueError(f"reduce_scatter: input has {int(in_tensor.numel())} elements, expected "
                         f"{n} ranks × {size} (the output's)")
    reduced = in_tensor.detach().flatten()
    average = op == dist.ReduceOp.AVG
    if scratch_input:
        _all_reduce_in_pieces(reduced, dist.ReduceOp.SUM if average else op, group)
    else:
        reduced = reduced.clone()
        dist.all_reduce(reduced, op=dist.ReduceOp.SUM if average else op, group=group)
    chunk = reduced[r * size:(r + 1) * size].reshape(out_tensor.shape)
    if average:
        chunk = chunk / n
    out_tensor.copy_(chunk.astype(out_tensor.dtype), True)  # in place: out may alias a buffer


def _all_reduce_in_pieces(flat, op, group) -> None:
    """All-reduce the 1-D ``flat`` in place, :data:`ALL_REDUCE_PIECE_BYTES` at a time.

    Gloo's ring all-reduce allocates working memory of 2/n of its input (two of its n segments), outside
    Paddle's allocator: 125 MiB for stage 3's 125 MiB embedding gradient on 2 ranks, alive beside that gradient
    at the peak of the backward. In pieces it is 2/n of a piece. Every element is still the sum over the
    group's ranks of the same values (on 2 ranks a + b, the same bits; beyond, the ring's summation order,
    which was never the one process's order either)."""
    piece = max(1, ALL_REDUCE_PIECE_BYTES // flat.element_size())
    total = int(flat.numel())
    for start in range(0, total, piece):
        part = flat._slice(start, min(start + piece, total))  # shares flat's memory: reduced where it lies
        dist.all_reduce(part, op=op, group=group)


def _reduce_scatter_tensor_in_dygraph(out_tensor, in_tensor, op, group, sync_op, use_calc_stream,
                                      caller="reduce_scatter"):
    """Replaces ``stream.reduce_scatter._reduce_scatter_tensor_in_dygraph`` (gloo: no reduce_scatter_tensor)."""
    reduce_scatter_into(out_tensor, in_tensor, op, group)
    return None if use_calc_stream else DoneTask()


def _reduce_scatter_in_dygraph(tensor, tensor_list, op, group, sync_op, use_calc_stream):
    """Replaces ``stream.reduce_scatter._reduce_scatter_in_dygraph``: the list form (entry ``r`` goes to rank ``r``)."""
    reduce_scatter_into(tensor, paddle.concat([t.flatten() for t in tensor_list]), op, group)
    return None if use_calc_stream else DoneTask()


def reduce_scatter(tensor, tensor_list, op=dist.ReduceOp.SUM, group=None, sync_op=True):
    """Replaces ``paddle.distributed.reduce_scatter`` (same arguments; ``tensor_list`` may be one tensor).

    Paddle's version rescales AVG through ``core.nccl_version()``, absent on CPU; this one reduces exactly for
    every op and returns a finished task.
    """
    if _warn_cur_rank_not_in_group(group):
        return None
    if paddle.is_tensor(tensor_list):
        return _reduce_scatter_tensor_in_dygraph(tensor, tensor_list, op, group, sync_op, False)
    return _reduce_scatter_in_dygraph(tensor, tensor_list, op, group, sync_op, False)


def install() -> None:
    """Put the fill in place of Paddle's reduce-scatter paths (idempotent; called by :func:`.cpu.install`)."""
    for name, fill in (("_reduce_scatter_tensor_in_dygraph", _reduce_scatter_tensor_in_dygraph),
                       ("_reduce_scatter_in_dygraph", _reduce_scatter_in_dygraph)):
        if getattr(_stream_module, name) is not fill:
            fill.__wrapped_paddle__ = getattr(_stream_module, name)
            setattr(_stream_module, name, fill)
    if dist.reduce_scatter is not reduce_scatter:
        reduce_scatter.__wrapped_paddle__ = dist.reduce_scatter
        dist.reduce_scatter = reduce_scatter
        communication.reduce_scatter = reduce_scatter


def assumptions() -> list:
    """What this fill relies on in Paddle (checked by :func:`paddletrainer.parallel.cpu.check_paddle_assumptions`)."""
    return [
        Assumption(lambda: params_of(_stream_module._reduce_scatter_tensor_in_dygraph)[:6]
                   == ["out_tensor", "in_tensor", "op", "group", "sync_op", "use_calc_stream"],
                   "stream.reduce_scatter._reduce_scatter_tensor_in_dygraph(out_tensor, in_tensor, op, group, sync_op, "
                   "use_calc_stream) signature changed"),
        Assumption(lambda: params_of(_stream_module._reduce_scatter_in_dygraph)[:6]
                   == ["tensor", "tensor_list", "op", "group", "sync_op", "use_calc_stream"],
                   "stream.reduce_scatter._reduce_scatter_in_dygraph(tensor, tensor_list, op, group, sync_op, "
                   "use_calc_stream) signature changed"),
        Assumption(lambda: all(f"{name}(" in paddle_source(_stream_module.reduce_scatter) for name in
                               ("_reduce_scatter_tensor_in_dygraph", "_reduce_scatter_in_dygraph")),
                   "stream.reduce_scatter no longer ends in _reduce_scatter_(tensor_)in_dygraph"),
        Assumption(lambda: params_of(dist.reduce_scatter)[:5] == ["tensor", "tensor_list", "op", "group", "sync_op"],
                   "paddle.distributed.reduce_scatter(tensor, tensor_list, op, group, sync_op) signature changed"),
        Assumption(lambda: "dist.stream.reduce_scatter(" in paddle_source(sequence_parallel_utils.reduce_scatter)
                   and "process_group.all_gather(" in paddle_source(sequence_parallel_utils.all_gather),
                   "sequence_parallel_utils no longer reduce-scatters via dist.stream.reduce_scatter and all-gathers "
                   "via ProcessGroup.all_gather"),
    ]
