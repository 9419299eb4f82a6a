"""What the two axes that split *within* samples share (sep: contiguous segments, :mod:`.segment`; cp: head/tail
chunks, :mod:`.context`): the Trainer's cut of a micro-batch along the sequence, the gather of logits back into
whole sequences, and fleet's ``SegmentParallel`` wrapper both run on (PaddleNLP 3.0.0b4 runs cp on fleet's sep
groups).
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List

import paddle
import paddle.distributed as dist

__all__ = ["IGNORED_KEYS", "cut_batch", "gather_sequences", "wrap_in_segment_parallel"]

# batch keys PaddleNLP's Llama ignores under sep and cp (it builds a causal mask and positions 0..seq-1 itself) or
# packs sequences with: refused by the cut, never dropped
IGNORED_KEYS = ("attention_mask", "position_ids", "attn_mask_startend_row_indices")


def cut_batch(inputs: Dict[str, Any], *, option: str, degree: int, pieces: int,
              cut: Callable[[paddle.Tensor], paddle.Tensor]) -> Dict[str, Any]:
    """Every ``[batch, seq]`` tensor of ``inputs`` through ``cut`` (this rank's part of the sequence); other values
    unchanged. One-line ``ValueError`` naming ``option`` for a key of :data:`IGNORED_KEYS`, a tensor that is not
    2-D, or a sequence length ``pieces`` does not divide."""
    out = {}
    for key, value in inputs.items():
        if key in IGNORED_KEYS and value is not None:
            raise ValueError(f"{option}={degree}: the batch has {key!r}, which PaddleNLP's Llama ignores or refuses "
                             f"here (causal mask and positions 0..seq-1 only); drop that column (packed or padded "
                             f"sequences are not supported under {option})")
        if value is None or not isinstance(value, paddle.Tensor):
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
