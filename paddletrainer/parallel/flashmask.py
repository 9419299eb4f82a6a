"""FlashMask attention for builds without its GPU kernel: packed sequences' document masks in O(S·block) memory.

PaddleNLP passes packed rows (several documents concatenated in one sequence) to ``flashmask_attention`` as
``startend_row_indices``: for every key column ``j``, the first query row that may no longer see it (the end of
``j``'s document). Under causal attention query ``i`` sees key ``j`` iff ``j <= i < end[j]``. Paddle's
``flashmask_attention`` has only a GPU kernel; :class:`FlashMaskAttention` computes the same thing with plain
math, one block of keys at a time:

* per key block ``[j0, j1)`` only the query rows ``[j0, max(end[j0:j1]))`` can see a key (causal, and the
  document ends), so each block multiplies just those rows; blocks are merged by the online softmax
  (:func:`merge`), in float32 (float64 inputs stay float64);
* memory per head is the output, its log-sum-exp and one ``rows × block`` score tile, never an ``S × S`` mask;
* the backward recomputes each tile's probabilities from the saved log-sum-exp (flash attention's backward).

:func:`visible` is the mask itself, shared with the ring attention of context parallel, which applies it to
its chunk pairs by their global positions. :func:`normalize_startend` accepts PaddleNLP's three shapes,
``[B, S]``, ``[B, 1, S]`` and ``[B, 1, S, 1]``; per-head indices and the two-column (bidirectional) form are
refused by name.
"""
from __future__ import annotations

import math

import numpy as np
import paddle
from paddle.autograd import PyLayer

__all__ = ["FlashMaskAttention", "flashmask_attention", "normalize_startend", "visible", "merge", "DEFAULT_KEY_BLOCK"]

DEFAULT_KEY_BLOCK = 128
MASKED = -1e30  # finite: a tile whose row sees no key gets weight exp(MASKED - lse) = 0 in the merge, never NaN


def normalize_startend(indices) -> paddle.Tensor:
    """``[B, S]`` int64 end rows from PaddleNLP's ``[B, S]``, ``[B, 1, S]`` or ``[B, 1, S, 1]`` forms."""
    shape = list(indices.shape)
    if len(shape) == 4 and shape[3] != 1:
        raise ValueError(f"attn_mask_startend_row_indices of shape {shape}: only the causal one-column form "
                         f"[B, 1, S, 1] is supported on this build (start and end rows are not)")
    if len(shape) in (3, 4) and shape[1] != 1:
        raise ValueError(f"attn_mask_startend_row_indices of shape {shape}: per-head indices are not supported "
                         f"on this build; pass one row of indices per sample ([B, S] or [B, 1, S])")
    if len(shape) not in (2, 3, 4):
        raise ValueError(f"attn_mask_startend_row_indices must be [B, S], [B, 1, S] or [B, 1, S, 1]; got {shape}")
    return indices.reshape([shape[0], shape[-2] if len(shape) == 4 else shape[-1]]).astype("int64")


def visible(q_pos, k_pos, k_end) -> paddle.Tensor:
    """``[B, 1, len(q_pos), len(k_pos)]`` bool: query at position ``q_pos[i]`` sees key ``k_pos[j]`` (causal and
    inside the key's document: ``k_pos[j] <= q_pos[i] < k_end[b, j]``). ``q_pos``/``k_pos`` 1-D int64,
    ``k_end`` ``[B, len(k_pos)]``."""
    rows = q_pos.reshape([1, 1, -1, 1])
    causal = k_pos.reshape([1, 1, 1, -1]) <= rows
    return paddle.logical_and(causal, rows < k_end.unsqueeze([1, 2]))


def merge(out, lse, block_out, block_lse):
    """The online-softmax merge of two partial attentions over disjoint key sets."""
    if out is None:
        return block_out, block_lse
    new_lse = paddle.maximum(lse, block_lse)
    new_lse = new_lse + paddle.log(paddle.exp(lse - new_lse) + paddle.exp(block_lse - new_lse))
    out = out * paddle.exp(lse - new_lse).unsqueeze(-1) + block_out * paddle.exp(block_lse - new_lse).unsqueeze(-1)
    return out, new_lse


def masked_scores(q, k, scale, keep):
    """``q kᵀ · scale`` with the entries ``keep`` is False at set to :data:`MASKED` (heads-major tensors)."""
    scores = paddle.matmul(q, k, transpose_y=True) * scale
    return paddle.where(keep, scores, paddle.full_like(scores, MASKED))


def masked_block(q, k, v, scale, keep):
    """Attention of query tile ``q`` over key tile ``k, v`` under ``keep``: ``(out, lse)``."""
    scores = masked_scores(q, k, scale, keep)
    lse = paddle.logsumexp(scores, axis=-1)
    return paddle.matmul(paddle.exp(scores - lse.unsqueeze(-1)), v), lse


def masked_block_grads(q, k, v, out_grad, lse, delta, scale, keep):
    """Flash attention's backward of one tile from the final ``lse``: ``(dq, dk, dv)`` contributions."""
    probs = paddle.exp(masked_scores(q, k, scale, keep) - lse.unsqueeze(-1))
    dv = paddle.matmul(probs, out_grad, transpose_x=True)
    d_scores = probs * (paddle.matmul(out_grad, v, transpose_y=True) - delta.unsqueeze(-1)) * scale
    return paddle.matmul(d_scores, k), paddle.matmul(d_scores, q, transpose_x=True), dv


def _tiles(ends: np.ndarray, length: int, block: int):
    """``(j0, j1, r1)`` per key block: keys ``[j0, j1)`` are seen only by query rows ``[j0, r1)``."""
    for j0 in range(0, length, block):
        j1 = min(j0 + block, length)
        r1 = int(min(length, max(ends[:, j0:j1].max(), j0 + 1)))
        yield j0, j1, r1


def _repeat(t, groups):
    return t if groups == 1 else paddle.repeat_interleave(t, groups, axis=1)


def _fold(t, groups):
    if groups == 1:
        return t
    b, h, s, d = t.shape
    return t.reshape([b, h // groups, groups, s, d]).sum(axis=2)


def _heads_major(t, dtype):
    return paddle.transpose(t.astype(dtype), [0, 2, 1, 3]).contiguous()


def _seq_major(t, dtype):
    return paddle.transpose(t, [0, 2, 1, 3]).astype(dtype).contiguous()


def _forward_tiles(q, k, v, end, ends_host, scale, block):
    """Every tile merged into ``(out, lse)`` of the whole query (heads-major, compute dtype)."""
    b, h, s, d = q.shape
    out = paddle.zeros([b, h, s, d], dtype=q.dtype)
    lse = paddle.full([b, h, s], MASKED, dtype=q.dtype)
    positions = paddle.arange(s, dtype="int64")
    for j0, j1, r1 in _tiles(ends_host, s, block):
        keep = visible(positions[j0:r1], positions[j0:j1], end[:, j0:j1])
        tile_out, tile_lse = masked_block(q[:, :, j0:r1], k[:, :, j0:j1], v[:, :, j0:j1], scale, keep)
        merged_out, merged_lse = merge(out[:, :, j0:r1], lse[:, :, j0:r1], tile_out, tile_lse)
        out[:, :, j0:r1] = merged_out
        lse[:, :, j0:r1] = merged_lse
    return out, lse


class FlashMaskAttention(PyLayer):
    """``FlashMaskAttention.apply(query, key, value, startend_row_indices, key_block=128)``: causal attention
    restricted to each key's document. ``[batch, seq, heads, head_dim]`` tensors (fewer key/value heads than
    query heads are repeated over their query group); ``startend_row_indices`` in one of
    :func:`normalize_startend`'s shapes. Returns the output in the query's dtype and layout."""

    @staticmethod
    def forward(ctx, query, key, value, startend_row_indices, key_block=DEFAULT_KEY_BLOCK):
        end = normalize_startend(startend_row_indices)
        if end.shape != [query.shape[0], key.shape[1]] or query.shape[1] != key.shape[1]:
            raise ValueError(f"flashmask attention: startend_row_indices {list(startend_row_indices.shape)} do "
                             f"not match query {list(query.shape)} / key {list(key.shape)}")
        if query.shape[2] % key.shape[2]:
            raise ValueError(f"flashmask attention: {query.shape[2]} query heads are not a multiple of "
                             f"{key.shape[2]} key/value heads")
        dtype = paddle.float64 if query.dtype == paddle.float64 else paddle.float32
        groups = query.shape[2] // key.shape[2]
        q = _heads_major(query, dtype)
        k, v = (_repeat(_heads_major(t, dtype), groups) for t in (key, value))
        scale = 1.0 / math.sqrt(query.shape[-1])
        ends_host = end.numpy()
        out, lse = _forward_tiles(q, k, v, end, ends_host, scale, key_block)
        ctx.save_for_backward(q, k, v, out, lse, end)
        ctx.ends_host, ctx.scale, ctx.block, ctx.groups = ends_host, scale, key_block, groups
        ctx.dtypes = (query.dtype, key.dtype, value.dtype)
        return _seq_major(out, query.dtype)

    @staticmethod
    def backward(ctx, out_grad):
        q, k, v, out, lse, end = ctx.saved_tensor()
        grad = _heads_major(out_grad, q.dtype)
        delta = (grad * out).sum(axis=-1)
        dq, dk, dv = paddle.zeros_like(q), paddle.zeros_like(k), paddle.zeros_like(v)
        positions = paddle.arange(q.shape[2], dtype="int64")
        for j0, j1, r1 in _tiles(ctx.ends_host, q.shape[2], ctx.block):
            keep = visible(positions[j0:r1], positions[j0:j1], end[:, j0:j1])
            dq_t, dk_t, dv_t = masked_block_grads(q[:, :, j0:r1], k[:, :, j0:j1], v[:, :, j0:j1],
                                                  grad[:, :, j0:r1], lse[:, :, j0:r1], delta[:, :, j0:r1],
                                                  ctx.scale, keep)
            dq[:, :, j0:r1] = dq[:, :, j0:r1] + dq_t
            dk[:, :, j0:j1] = dk_t
            dv[:, :, j0:j1] = dv_t
        grads = (dq, _fold(dk, ctx.groups), _fold(dv, ctx.groups))
        return tuple(_seq_major(g, dtype) for g, dtype in zip(grads, ctx.dtypes))


def flashmask_attention(query, key, value, startend_row_indices, key_block=DEFAULT_KEY_BLOCK):
    """Functional form of :class:`FlashMaskAttention`."""
    return FlashMaskAttention.apply(query, key, value, startend_row_indices, key_block)
