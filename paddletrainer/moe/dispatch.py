"""Token exchange for expert parallel: variable splits, a differentiable all-to-all, the local regrouping.

Each rank sorts its token assignments by global expert. Expert ``g`` lives on ep rank ``g // experts_per_rank``
(the contract's placement), so the sorted rows split into one contiguous piece per ep rank. The per-expert
counts travel first (an equal-split all-to-all of ``num_experts`` integers: every rank learns how many rows of
each of its local experts each peer sends), then the rows themselves (:class:`ExchangeRows`, whose backward is
the reverse all-to-all: each gradient row goes back to the rank its row came from). Rows arrive ordered by
(source rank, local expert); :func:`local_expert_order` regroups them by local expert so every expert runs once
on a contiguous block.

Both exchanges call ``paddle.distributed.alltoall_single``: the device's own kernel, or on Paddle's CPU build the
exact all-gather fill of :mod:`paddletrainer.parallel.cpu.all_to_all` (installed with the other gloo fills).
"""
from __future__ import annotations

import numpy as np
import paddle
import paddle.distributed as dist
from paddle.autograd import PyLayer

__all__ = ["ExchangeRows", "exchange_counts", "local_expert_order"]


@paddle.no_grad()
def exchange_counts(counts, group):
    """``counts[g]`` = rows this rank sends to global expert ``g`` → a ``[ranks, local experts]`` NumPy array:
    entry ``[s, l]`` = rows ep rank ``s`` sends to this rank's local expert ``l``."""
    n = group.nranks
    num_experts = int(counts.shape[0])
    received = paddle.empty_like(counts)
    dist.alltoall_single(received, counts, group=group)
    return received.numpy().reshape([n, num_experts // n])


def _exchange(x, in_splits, out_splits, group):
    rows = int(sum(out_splits))
    out = paddle.empty([rows] + list(x.shape[1:]), dtype=x.dtype)
    dist.alltoall_single(out, x.contiguous(), in_split_sizes=list(in_splits), out_split_sizes=list(out_splits),
                         group=group)
    return out


class ExchangeRows(PyLayer):
    """``ExchangeRows.apply(x, in_splits, out_splits, group)``: rows ``in_splits[j]`` of ``x`` go to ep rank
    ``j``; the result stacks the ``out_splits[k]`` rows that rank ``k`` sent, in rank order. Backward sends each
    gradient row back to where its row came from (splits swapped), so a row's gradient reaches its token's rank
    exactly once."""

    @staticmethod
    def forward(ctx, x, in_splits, out_splits, group):
        ctx.in_splits, ctx.out_splits, ctx.group = list(in_splits), list(out_splits), group
        with paddle.no_grad():
            return _exchange(x, in_splits, out_splits, group)

    @staticmethod
    def backward(ctx, grad):
        with paddle.no_grad():
            return _exchange(grad, ctx.out_splits, ctx.in_splits, ctx.group)


def local_expert_order(received_counts: np.ndarray):
    """Rows arrive grouped by (source rank, local expert); the permutation that groups them by (local expert,
    source rank), and the rows per local expert. ``rows[perm]`` is expert-major; ``grouped[inverse]`` undoes it."""
    ranks, local = received_counts.shape
    starts = np.concatenate([[0], np.cumsum(received_counts.reshape(-1))])[:-1].reshape(ranks, local)
    perm = [np.arange(starts[s, l], starts[s, l] + received_counts[s, l]) for l in range(local)
            for s in range(ranks)]
    perm = np.concatenate(perm).astype("int64") if perm else np.zeros([0], dtype="int64")
    inverse = np.empty_like(perm)
    inverse[perm] = np.arange(perm.shape[0], dtype="int64")
    return perm, inverse, received_counts.sum(axis=0).tolist()
