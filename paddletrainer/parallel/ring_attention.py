"""Ring attention for the CPU build: context parallel's attention kernel where PaddleNLP's needs a GPU.

PaddleNLP 3.0.0b4's ``RingFlashAttention`` runs ``_C_ops.flash_attn`` forward (no CPU kernel) and
``paddlenlp_ops.flash_attn_bwd`` backward (a GPU custom op), and passes K/V with ``batch_isend_irecv``, which
deadlocks on gloo (both ranks block in their first send). :class:`RingAttention` is a drop-in with the same
``apply(query, key, value, group=None, fixed_seed_offset=None, attn_mask=None, dropout=0.0, is_causal=False,
training=True)`` and ``[batch, seq/cp, heads, head_dim]`` tensors, built from plain math:

* per block, attention ``softmax(q kᵀ/√d) v`` with its log-sum-exp, in float32 (float64 inputs stay float64);
* blocks merge by the online softmax: ``lse = logaddexp(lse_a, lse_b)``,
  ``out = out_a·exp(lse_a − lse) + out_b·exp(lse_b − lse)`` — the result equals attention over the union;
* PaddleNLP's load-balanced layout: the sequence is cut into ``2·cp`` chunks and rank ``r`` holds chunks
  ``r`` and ``2·cp−1−r`` (:func:`split_load_balanced`); under causal attention a (query chunk ``a``, key
  chunk ``b``) pair is skipped when ``a < b``, fully visible when ``a > b`` and causal when ``a == b``, so
  every rank does the same work at every step;
* the backward recomputes each block's probabilities from the saved final log-sum-exp (flash attention's
  backward); the key/value gradients travel the ring with their K/V and one last hop brings them home;
* K/V move one hop per step with blocking send/recv, even ranks sending first and odd ranks receiving
  first: gloo's send blocks until the peer posts its receive, and this order resolves the ring from any even
  rank (``rotation="p2p"``, the default: two K/V blocks in memory per rank). It needs an even ring size:
  Paddle's gloo pairs a send only with the receive at the same position of the peer's sequence of p2p
  operations on the group (measured on 3 ranks: rank 0's first operation, a send to rank 2, never met rank 2's
  receive from rank 0 issued as its second operation — TIMEOUT — with no circular wait), so every send must
  sit at its receiver's position; even/odd ordering does that on an even ring (2 and 4 ranks run) but cannot
  on an odd cycle (a 3-rank ring timed out in ``recv`` while its peer was in the matching ``send``). ``rotation="allgather"``
  all-gathers K/V once (and all-reduces their gradients) and runs on any ring size, trading memory (every
  rank holds all K/V) for fewer, larger collectives.

Packed sequences (``startend_row_indices``, FlashMask's document ends of the whole sequence): a chunk pair whose
keys all belong to documents ended before the query chunk starts is skipped like a causal future pair; the others
are masked per document (:class:`_Documents`).

GQA (fewer K/V heads than query heads) is served by repeating each K/V head over its query group.
Dropout and an explicit ``attn_mask`` are refused, as PaddleNLP refuses dropout (Llama passes neither).
"""
from __future__ import annotations

import math

import paddle
import paddle.distributed as dist
from paddle.autograd import PyLayer

from .flashmask import masked_block, masked_block_grads, merge, normalize_startend, visible

__all__ = [
    "RingAttention",
    "ring_attention",
    "chunk_ids",
    "split_load_balanced",
    "undo_load_balanced",
    "load_balanced_position_ids",
    "split_batch_load_balanced",
    "ROTATIONS",
]

ROTATIONS = ("p2p", "allgather")


# --------------------------------------------------------------------------------------------------
# PaddleNLP's load-balanced (head/tail) sequence layout
# --------------------------------------------------------------------------------------------------
def chunk_ids(rank: int, degree: int) -> tuple:
    """The two of ``2·degree`` sequence chunks rank ``rank`` holds: ``(rank, 2·degree − 1 − rank)``."""
    if not 0 <= rank < degree:
        raise ValueError(f"rank {rank} is not in a context-parallel group of {degree}")
    return rank, 2 * degree - 1 - rank


def split_load_balanced(tensor, rank: int, degree: int, axis: int = -1):
    """Rank ``rank``'s part of ``tensor`` along ``axis`` (the sequence): chunks :func:`chunk_ids` of ``2·degree``
    equal chunks, concatenated. The length along ``axis`` must divide by ``2·degree``."""
    length = int(tensor.shape[axis])
    if length % (2 * degree):
        raise ValueError(f"sequence length {length} must divide by 2 x context parallel degree = {2 * degree}")
    if degree == 1:
        return tensor
    chunks = paddle.split(tensor, 2 * degree, axis=axis)
    first, second = chunk_ids(rank, degree)
    return paddle.concat([chunks[first], chunks[second]], axis=axis)


def undo_load_balanced(parts: list, axis: int = -1):
    """The full sequence from every rank's :func:`split_load_balanced` part (``parts[r]`` from rank ``r``)."""
    degree = len(parts)
    chunks = [None] * (2 * degree)
    for rank, part in enumerate(parts):
        first, second = chunk_ids(rank, degree)
        chunks[first], chunks[second] = paddle.split(part, 2, axis=axis)
    return paddle.concat(chunks, axis=axis)


def load_balanced_position_ids(seq_length: int, rank: int, degree: int, batch_size: int = 1):
    """Position ids ``[batch_size, seq_length/degree]`` of rank ``rank``'s two chunks of a ``seq_length``
    sequence (what Llama's rope needs under context parallel)."""
    positions = paddle.arange(seq_length, dtype="int64").unsqueeze(0)
    return split_load_balanced(positions, rank, degree).expand([batch_size, seq_length // degree])


def split_batch_load_balanced(batch: dict, rank: int, degree: int) -> dict:
    """Rank ``rank``'s share of a batch of ``[batch, seq]`` tensors (``input_ids``, ``labels``,
    ``position_ids`` ...), each cut along its last axis by :func:`split_load_balanced`. Only 2-D tensors are
    accepted: anything else has no agreed sequence axis, so it is refused rather than passed through whole."""
    out = {}
    for name, value in batch.items():
        if value is None:
            out[name] = None
            continue
        if not paddle.is_tensor(value) or value.ndim != 2:
            raise ValueError(f"context parallel splits [batch, seq] tensors; batch field {name!r} is "
                             f"{type(value).__name__} with shape {getattr(value, 'shape', None)}")
        out[name] = split_load_balanced(value, rank, degree, axis=-1)
    return out


# --------------------------------------------------------------------------------------------------
# Block math (heads-major layout [b, h, s, d] inside; compute dtype float32, or float64 for float64 input)
# --------------------------------------------------------------------------------------------------
def _compute_dtype(dtype):
    return paddle.float64 if dtype == paddle.float64 else paddle.float32


def _scores(q, k, scale, causal):
    scores = paddle.matmul(q, k, transpose_y=True) * scale
    if causal:  # a diagonal chunk pair: query i sees keys 0..i of the same chunk
        n = scores.shape[-1]
        keep = paddle.tril(paddle.ones([n, n], dtype="bool"))
        scores = paddle.where(keep, scores, paddle.full_like(scores, float("-inf")))
    return scores


def block_attention(q, k, v, scale, causal):
    """Attention of query block ``q`` over key/value block ``k, v`` (``[b, h, s, d]``, compute dtype):
    returns ``(out [b, h, sq, d], lse [b, h, sq])``."""
    scores = _scores(q, k, scale, causal)
    lse = paddle.logsumexp(scores, axis=-1)
    return paddle.matmul(paddle.exp(scores - lse.unsqueeze(-1)), v), lse


def _pair_kind(q_chunk: int, k_chunk: int, is_causal: bool):
    """None (skip: every key is in the query chunk's future), "full" or "causal"."""
    if not is_causal or q_chunk > k_chunk:
        return "full"
    return "causal" if q_chunk == k_chunk else None


class _Documents:
    """Packed sequences' document ends (``[B, S]``, the whole sequence's, on every rank): which query chunk
    sees which key chunk. A pair the causal order or the documents empty is skipped (the ends are read on the
    host once per call); any other pair gets the mask of :func:`.flashmask.visible` at the chunks' global
    positions, so the per-document attention (and with it rope's per-document positions, which enter the
    scores only as differences within a document) is the one-process result."""

    def __init__(self, end, n_chunks):
        self.end, self.ends_host = end, end.numpy()
        self.chunk = int(end.shape[1]) // n_chunks

    def positions(self, chunk):
        return paddle.arange(chunk * self.chunk, (chunk + 1) * self.chunk, dtype="int64")

    def keep(self, q_chunk, k_chunk):
        """None (skip the pair) or the ``[B, 1, chunk, chunk]`` mask of query chunk ``q_chunk`` over keys of
        ``k_chunk``."""
        if k_chunk > q_chunk:
            return None
        keys = slice(k_chunk * self.chunk, (k_chunk + 1) * self.chunk)
        if self.ends_host[:, keys].max() <= q_chunk * self.chunk:  # every key's document ends before the queries
            return None
        return visible(self.positions(q_chunk), self.positions(k_chunk), self.end[:, keys])


def _tile(q_chunk, k_chunk, is_causal, documents):
    """How a (query chunk, key chunk) pair is computed: None (skipped), ``("mask", keep)`` or ``("causal",
    flag)``."""
    if documents is not None:
        keep = documents.keep(q_chunk, k_chunk)
        return None if keep is None else ("mask", keep)
    kind = _pair_kind(q_chunk, k_chunk, is_causal)
    return None if kind is None else ("causal", kind == "causal")


def _tile_attention(q, k, v, scale, tile):
    if tile[0] == "mask":
        return masked_block(q, k, v, scale, tile[1])
    return block_attention(q, k, v, scale, tile[1])


def _tile_grads(q, k, v, out_grad, lse, delta, scale, tile):
    if tile[0] == "mask":
        return masked_block_grads(q, k, v, out_grad, lse, delta, scale, tile[1])
    return _block_grads(q, k, v, out_grad, lse, delta, scale, tile[1])


def _repeat_heads(t, groups):
    return t if groups == 1 else paddle.repeat_interleave(t, groups, axis=1)


def _fold_heads(t, groups):
    """The gradient of :func:`_repeat_heads`: sum each K/V head's query group."""
    if groups == 1:
        return t
    b, h, s, d = t.shape
    return t.reshape([b, h // groups, groups, s, d]).sum(axis=2)


# --------------------------------------------------------------------------------------------------
# Moving K/V around the ring
# --------------------------------------------------------------------------------------------------
def ring_shift(tensors: list, group) -> list:
    """Send ``tensors`` to the next rank of ``group`` and return the ones the previous rank sent.

    Blocking gloo send/recv in a ring-safe order: even ranks send first, odd ranks receive first (two ranks
    that both send first block forever; see module). Messages to one peer match in order.
    """
    n, r = group.nranks, group.rank
    nxt, prv = (r + 1) % n, (r - 1) % n
    sent = [t.contiguous() for t in tensors]
    received = [paddle.empty_like(t) for t in sent]
    process_group = group.process_group

    def send():
        for t in sent:
            process_group.send(t, nxt, True).wait()

    def recv():
        for t in received:
            process_group.recv(t, prv, True).wait()

    for step in ((send, recv) if r % 2 == 0 else (recv, send)):
        step()
    return received


def _all_blocks(t, group) -> list:
    gathered = []
    dist.all_gather(gathered, t.contiguous(), group=group)
    return gathered


# --------------------------------------------------------------------------------------------------
# Forward and backward over the ring
# --------------------------------------------------------------------------------------------------
class _Ring:
    """One rank's view of a ring attention call: its chunk ids, and K/V blocks step by step."""

    def __init__(self, group, rotation):
        if rotation not in ROTATIONS:
            raise ValueError(f"ring attention rotation must be one of {ROTATIONS}, got {rotation!r}")
        self.group, self.rotation = group, rotation
        self.n, self.rank = group.nranks, group.rank
        if rotation == "p2p" and self.n % 2 and self.n > 1:  # one rank exchanges nothing
            raise ValueError(f"ring attention: rotation='p2p' needs an even ring size on gloo, got {self.n} "
                             f"(an odd ring cannot pair every send with its receive; use rotation='allgather')")

    def owner(self, step):
        """The rank whose K/V block this rank works on at ``step``."""
        return (self.rank - step) % self.n

    def blocks(self, tensors):
        """Yield ``(step, tensors of owner(step))`` for every step; p2p shifts after each step but the last."""
        if self.rotation == "allgather" and self.n > 1:
            gathered = [_all_blocks(t, self.group) for t in tensors]
            for step in range(self.n):
                yield step, [g[self.owner(step)] for g in gathered]
            return
        current = list(tensors)
        for step in range(self.n):
            yield step, current
            if step < self.n - 1:
                current = ring_shift(current, self.group)


def _local_chunks(t, n_chunks):
    return paddle.split(t, n_chunks, axis=2)  # [b, h, s, d]: the sequence axis is 2


def ring_forward(q, k, v, ring, scale, is_causal, documents=None):
    """Per query chunk, the merged ``(out, lse)`` over every K/V block of the ring (heads-major, compute dtype)."""
    groups = q.shape[1] // k.shape[1]
    q_chunks = _local_chunks(q, 2)
    mine = chunk_ids(ring.rank, ring.n)
    acc = [(None, None), (None, None)]
    for step, (k_block, v_block) in ring.blocks([k, v]):
        theirs = chunk_ids(ring.owner(step), ring.n)
        k_chunks = _local_chunks(_repeat_heads(k_block, groups), 2)
        v_chunks = _local_chunks(_repeat_heads(v_block, groups), 2)
        for a, q_chunk in enumerate(mine):
            for b, k_chunk in enumerate(theirs):
                tile = _tile(q_chunk, k_chunk, is_causal, documents)
                if tile is not None:
                    out, lse = _tile_attention(q_chunks[a], k_chunks[b], v_chunks[b], scale, tile)
                    acc[a] = merge(*acc[a], out, lse)
    return acc


def _block_grads(q, k, v, out_grad, lse, delta, scale, causal):
    """Flash attention's backward of one block from the final ``lse``: ``(dq, dk, dv)`` contributions."""
    probs = paddle.exp(_scores(q, k, scale, causal) - lse.unsqueeze(-1))
    dv = paddle.matmul(probs, out_grad, transpose_x=True)
    d_scores = probs * (paddle.matmul(out_grad, v, transpose_y=True) - delta.unsqueeze(-1)) * scale
    return paddle.matmul(d_scores, k), paddle.matmul(d_scores, q, transpose_x=True), dv


def ring_backward(q, k, v, outs, lses, out_grads, ring, scale, is_causal, documents=None):
    """``(dq, dk, dv)`` of this rank's local q/k/v (heads-major, compute dtype)."""
    groups = q.shape[1] // k.shape[1]
    q_chunks = _local_chunks(q, 2)
    deltas = [(g * o).sum(axis=-1) for g, o in zip(out_grads, outs)]
    mine = chunk_ids(ring.rank, ring.n)
    dq = [paddle.zeros_like(c) for c in q_chunks]
    travelling = [paddle.zeros_like(k), paddle.zeros_like(v)]  # p2p: the grads of the block at hand
    held = [[paddle.zeros_like(k), paddle.zeros_like(v)] for _ in range(ring.n)]  # allgather: every block's
    riding = travelling if ring.rotation == "p2p" else []
    for step, (k_block, v_block, *arrived) in ring.blocks([k, v, *riding]):
        theirs = chunk_ids(ring.owner(step), ring.n)
        k_rep, v_rep = _repeat_heads(k_block, groups), _repeat_heads(v_block, groups)
        k_chunks, v_chunks = _local_chunks(k_rep, 2), _local_chunks(v_rep, 2)
        dk_rep, dv_rep = [paddle.zeros_like(c) for c in k_chunks], [paddle.zeros_like(c) for c in v_chunks]
        for a, q_chunk in enumerate(mine):
            for b, k_chunk in enumerate(theirs):
                tile = _tile(q_chunk, k_chunk, is_causal, documents)
                if tile is None:
                    continue
                dq_ab, dk_ab, dv_ab = _tile_grads(q_chunks[a], k_chunks[b], v_chunks[b], out_grads[a], lses[a],
                                                  deltas[a], scale, tile)
                dq[a], dk_rep[b], dv_rep[b] = dq[a] + dq_ab, dk_rep[b] + dk_ab, dv_rep[b] + dv_ab
        dk_block = _fold_heads(paddle.concat(dk_rep, axis=2), groups)
        dv_block = _fold_heads(paddle.concat(dv_rep, axis=2), groups)
        if ring.rotation == "allgather":
            held[ring.owner(step)] = [dk_block, dv_block]
        else:  # add to the grads riding with this block; blocks() passes them on with it
            arrived[0].add_(dk_block)
            arrived[1].add_(dv_block)
            travelling = arrived
    return paddle.concat(dq, axis=2), *_home_grads(ring, travelling, held)


def _home_grads(ring, travelling, held):
    """This rank's own dk/dv: p2p — one last hop brings the block's grads back to its owner (the next rank);
    allgather — sum every rank's contribution to every block and keep this rank's."""
    if ring.n == 1:
        return tuple(travelling) if ring.rotation == "p2p" else tuple(held[0])
    if ring.rotation == "p2p":
        return tuple(ring_shift(travelling, ring.group))
    stacked = [paddle.stack([h[i] for h in held]) for i in range(2)]
    for t in stacked:
        dist.all_reduce(t, group=ring.group)
    return stacked[0][ring.rank], stacked[1][ring.rank]


# --------------------------------------------------------------------------------------------------
# The PyLayer (RingFlashAttention's interface)
# --------------------------------------------------------------------------------------------------
def _heads_major(t, dtype):
    return paddle.transpose(t.astype(dtype), [0, 2, 1, 3]).contiguous()


def _seq_major(t, dtype):
    return paddle.transpose(t, [0, 2, 1, 3]).astype(dtype).contiguous()


def _default_group():
    from paddle.distributed import fleet

    return fleet.get_hybrid_communicate_group().get_sep_parallel_group()


def _check_call(query, key, value, attn_mask, dropout, ring_size):
    if dropout > 0.0:
        raise NotImplementedError("ring attention: dropout is not supported (PaddleNLP's RingFlashAttention "
                                  "refuses it too)")
    if attn_mask is not None:
        raise ValueError("ring attention on CPU takes no attn_mask (causal or full attention only; PaddleNLP's "
                         "Llama passes none under context parallel)")
    if query.ndim != 4 or key.shape != value.shape or key.shape[0] != query.shape[0] \
            or key.shape[1] != query.shape[1] or key.shape[3] != query.shape[3]:
        raise ValueError(f"ring attention: query/key/value must be [batch, seq, heads, head_dim] with equal batch, "
                         f"seq and head_dim; got {list(query.shape)}, {list(key.shape)}, {list(value.shape)}")
    if query.shape[2] % key.shape[2]:
        raise ValueError(f"ring attention: {query.shape[2]} query heads are not a multiple of {key.shape[2]} "
                         f"key/value heads")
    if query.shape[1] % 2:
        raise ValueError(f"ring attention: the local sequence ({query.shape[1]}) must hold two equal chunks "
                         f"(the load-balanced layout); the global length must divide by 2 x {ring_size}")


def _documents(startend_row_indices, query, ring_size, is_causal):
    """The packed sequences' :class:`_Documents` (None without indices): the indices cover the whole sequence,
    ``ring_size`` times the local one, and only with causal attention (FlashMask's causal form)."""
    if startend_row_indices is None:
        return None
    end = normalize_startend(startend_row_indices)
    if not is_causal or end.shape != [query.shape[0], query.shape[1] * ring_size]:
        raise ValueError(f"ring attention: startend_row_indices {list(startend_row_indices.shape)} must be the "
                         f"whole sequences' [batch, {query.shape[1] * ring_size}] document ends, with "
                         f"is_causal=True")
    return _Documents(end, 2 * ring_size)


class RingAttention(PyLayer):
    """Ring attention over ``group`` (default: fleet's sep group, as PaddleNLP) for load-balanced sequences.

    ``RingAttention.apply(query, key, value, group=None, fixed_seed_offset=None, attn_mask=None, dropout=0.0,
    is_causal=False, training=True, rotation="p2p", startend_row_indices=None)``: the arguments of PaddleNLP's
    ``RingFlashAttention`` (``fixed_seed_offset`` and ``training`` only matter for dropout, which is refused) plus
    ``rotation`` (see module) and packed sequences' document ends (FlashMask's ``[B, S]`` or ``[B, 1, S]`` of the
    whole sequence, every rank the same). Tensors are ``[batch, seq/cp, heads, head_dim]``, each rank holding its
    :func:`split_load_balanced` part; returns the attention output in the query's dtype and layout.
    """

    @staticmethod
    def forward(ctx, query, key, value, group=None, fixed_seed_offset=None, attn_mask=None, dropout=0.0,
                is_causal=False, training=True, rotation="p2p", startend_row_indices=None):
        group = _default_group() if group is None else group
        ring = _Ring(group, rotation)
        _check_call(query, key, value, attn_mask, dropout, ring.n)
        documents = _documents(startend_row_indices, query, ring.n, is_causal)
        dtype = _compute_dtype(query.dtype)
        q, k, v = (_heads_major(t, dtype) for t in (query, key, value))
        scale = 1.0 / math.sqrt(query.shape[-1])
        acc = ring_forward(q, k, v, ring, scale, is_causal, documents)
        outs, lses = [a[0] for a in acc], [a[1] for a in acc]
        ctx.save_for_backward(q, k, v, *outs, *lses)
        ctx.ring, ctx.scale, ctx.is_causal, ctx.documents = ring, scale, is_causal, documents
        ctx.dtypes = (query.dtype, key.dtype, value.dtype)
        return _seq_major(paddle.concat(outs, axis=2), query.dtype)

    @staticmethod
    def backward(ctx, out_grad):
        q, k, v, out0, out1, lse0, lse1 = ctx.saved_tensor()
        grads = _local_chunks(_heads_major(out_grad, q.dtype), 2)
        dq, dk, dv = ring_backward(q, k, v, [out0, out1], [lse0, lse1], grads, ctx.ring, ctx.scale, ctx.is_causal,
                                   ctx.documents)
        return tuple(_seq_major(g, dtype) for g, dtype in zip((dq, dk, dv), ctx.dtypes))


def ring_attention(query, key, value, group=None, is_causal=True, rotation="p2p"):
    """Functional form of :class:`RingAttention` (causal by default, as Llama calls it)."""
    return RingAttention.apply(query, key, value, group=group, is_causal=is_causal, rotation=rotation)
