"""What the two axes that split *within* samples share (sep: contiguous segments, :mod:`.segment`; cp: head/tail
chunks, :mod:`.context`): the Trainer's cut of a micro-batch along the sequence, the gather of logits back into
whole sequences, and fleet's ``SegmentParallel`` wrapper both run on (PaddleNLP 3.0.0b4 runs cp on fleet's sep
groups).

Packed rows (several documents in one sequence, PaddleNLP's zero-padding data) travel with the sequence: their
document mask becomes FlashMask's document ends, kept whole on every rank (:func:`documents_of_batch`), because
each rank's attention sees keys of the whole sequence (sep: all positions for its heads; cp: every chunk of the
ring).
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Tuple

import numpy as np
import paddle
import paddle.distributed as dist

from ..device import on_cuda_device

__all__ = ["DOCUMENT_ENDS", "cut_batch", "documents_of_batch", "gather_sequences", "wrap_in_segment_parallel"]

DOCUMENT_ENDS = "attn_mask_startend_row_indices"  # FlashMask's key: every key's document end, kept whole by the cut


def _block_mask_ends(mask: np.ndarray, option: str) -> np.ndarray:
    """``[B, S]`` key ends of a causal ``[B, 1, S, S]`` / ``[B, S, S]`` mask in which every key is seen by a
    contiguous run of rows starting at its own (FlashMask's one-column form: PaddleNLP's zero-padding
    block-diagonal ``attention_mask``, its preference rows' mask); anything else is refused, naming ``option``."""
    keep = mask.reshape([mask.shape[0], mask.shape[-2], mask.shape[-1]]).astype(bool)
    rows = np.arange(keep.shape[-1])
    ends = rows[None, :] + np.tril(keep).sum(axis=1)  # column j is seen by rows j .. end_j - 1
    rebuilt = (rows[None, None, :] <= rows[None, :, None]) & (rows[None, :, None] < ends[:, None, :])
    if not np.array_equal(rebuilt, keep):
        raise ValueError(f"{option}: the batch's attention_mask is not causal with each key seen by a contiguous run "
                         f"of rows from its own (packed documents, preference rows); only such a mask, or "
                         f"attn_mask_startend_row_indices, travels with the sequence here")
    return ends


def _positions_shift_scores(positions: np.ndarray, ends: np.ndarray) -> bool:
    """Whether rope at the sequence index (what the sep/cp attention uses) gives other scores than rope at
    ``positions``: true iff some query sees a key (``j <= i < ends[j]``) whose offset ``position - index``
    differs from its own. Rope sees only position differences, so equal offsets give equal scores. The rows a
    key is seen by are contiguous, so it is enough to test neighbours ``k, k + 1`` whose offsets differ: some key
    ``j <= k`` is seen by both iff the running maximum of the ends up to ``k`` exceeds ``k + 1``."""
    index = np.arange(positions.shape[1])
    offsets = positions - index[None, :]
    changes = offsets[:, 1:] != offsets[:, :-1]
    reach = np.maximum.accumulate(ends, axis=1)[:, :-1]
    return bool(np.any(changes & (reach > index[None, 1:])))


def documents_of_batch(inputs: Dict[str, Any], *, option: str, on_cuda: bool,
                       turns_positions: bool) -> Tuple[Dict[str, Any], set]:
    """A micro-batch made ready for the cut, and the keys the cut keeps whole. A mask that is causal with every
    key seen by a contiguous run of rows from its own (a block-diagonal ``attention_mask`` of packed documents, or
    PaddleNLP's preference rows, where the rejected response sees the prompt but not the chosen one) becomes the
    key ends (:data:`DOCUMENT_ENDS`, ``[B, S]``, kept whole). ``position_ids`` under which rope at the sequence
    index would change a score (:func:`_positions_shift_scores`: positions restarting inside what a query sees)
    are kept whole when the axis ``turns_positions`` (sep: :mod:`.packed_attention` turns the attention's rope to
    them) off a CUDA device, and refused by name elsewhere. A batch without these keys comes back unchanged (no host read); a packed one is
    read on the host once per micro-batch. Also refused by name: a ``[batch, seq]`` padding mask, another mask,
    and packed rows under context parallel on a CUDA device (PaddleNLP's ``RingFlashAttention`` takes no mask)."""
    mask, ends, positions = (inputs.get(key) for key in ("attention_mask", DOCUMENT_ENDS, "position_ids"))
    if mask is None and ends is None and positions is None:
        return inputs, set()
    out, whole = dict(inputs), {DOCUMENT_ENDS}
    out.pop("attention_mask", None)  # the ends carry it (PaddleNLP's Llama uses the ends when both are given)
    if mask is not None and ends is None:
        if mask.ndim == 2:
            raise ValueError(f"{option}: the batch has a [batch, seq] attention_mask (padding); pad on the right and "
                             f"drop it (causal attention never lets a token see the padding after it), or pack "
                             f"documents with attn_mask_startend_row_indices")
        ends = paddle.to_tensor(_block_mask_ends(np.asarray(mask.numpy()), option))
    if ends is not None:
        if option.startswith("context") and on_cuda:
            raise ValueError(f"{option}: packed rows need the document mask inside ring attention, which PaddleNLP's "
                             f"RingFlashAttention does not take; use sep_parallel_degree for packed data on GPU")
        out[DOCUMENT_ENDS] = ends.reshape([ends.shape[0], -1]).astype("int32")
    if positions is not None:
        host_positions = np.asarray(positions.numpy())
        host_ends = (out[DOCUMENT_ENDS].numpy() if ends is not None
                     else np.full(host_positions.shape, host_positions.shape[1], "int64"))
        if _positions_shift_scores(host_positions, host_ends):
            if not turns_positions or on_cuda:
                raise ValueError(f"{option}: position_ids must count up by one across everything a token attends to "
                                 f"(restarting at each packed document is fine); other positions are supported only "
                                 f"with sep_parallel_degree off a CUDA device")
            whole.add("position_ids")
    return out, whole


def cut_batch(inputs: Dict[str, Any], *, option: str, degree: int, pieces: int,
              cut: Callable[[paddle.Tensor], paddle.Tensor], turns_positions: bool) -> Dict[str, Any]:
    """Every ``[batch, seq]`` tensor of ``inputs`` through ``cut`` (this rank's part of the sequence); the document
    ends (:data:`DOCUMENT_ENDS`, made by :func:`documents_of_batch`) and the positions it keeps stay whole
    (``turns_positions``: the axis's attention turns rope to whole positions). Other values unchanged. One-line
    ``ValueError`` naming ``option`` for a tensor that is not 2-D or a sequence length ``pieces`` does not
    divide."""
    out = {}
    batch, whole = documents_of_batch(inputs, option=option, on_cuda=on_cuda_device(),
                                      turns_positions=turns_positions)
    for key, value in batch.items():
        if value is None or not isinstance(value, paddle.Tensor) or key in whole:
            out[key] = value
            continue
        if value.ndim != 2:
            raise ValueError(f"{option}={degree}: batch key {key!r} has shape {list(value.shape)}; every batch "
                             f"tensor must be [batch, sequence]")
        length = int(value.shape[1])
        if length % pieces:
            raise ValueError(f"{option}={degree}: the sequence length {length} of batch key {key!r} does not divide "
                             f"into {pieces} pieces: pad or cut sequences to a multiple of {pieces}")
        out[key] = cut(value)
    return out


@paddle.no_grad()
def gather_sequences(value, group, join: Callable[[List[paddle.Tensor]], paddle.Tensor]):
    """Whole sequences from every rank's part (``[batch, seq/n, ...]`` → ``[batch, seq, ...]``, ``join`` putting
    the all-gathered parts in order); tuples/lists element-wise; non-tensors and tensors without a sequence axis
    unchanged."""
    if isinstance(value, (tuple, list)):
        return type(value)(gather_sequences(v, group, join) for v in value)
    if not isinstance(value, paddle.Tensor) or value.ndim < 2:
        return value
    parts = []
    dist.all_gather(parts, value, group=group)
    return join(parts)


def wrap_in_segment_parallel(model):
    """``model`` in fleet's ``SegmentParallel`` (it broadcasts the initial parameters over the sep group and the
    other data axes)."""
    from paddle.distributed import fleet
    from paddle.distributed.fleet.meta_parallel import SegmentParallel

    model = fleet.distributed_model(model)
    if not isinstance(model, SegmentParallel):
        raise RuntimeError(f"fleet.distributed_model returned {type(model).__name__}, expected SegmentParallel")
    return model
