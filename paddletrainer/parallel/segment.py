"""Sequence-segment parallel (PaddleNLP's ``sep_parallel_degree``, DeepSpeed's Ulysses): the sep axis's wrap
function and the sequence cut.

The ranks of a sep group read the same samples (``splits_data=False``); each keeps one contiguous segment of
every sequence. The model carries the rest: PaddleNLP's Llama (``config.sep_parallel_degree``) turns q/k/v from
``[b, s/sep, h]`` into ``[b, s, h/sep]`` with an all-to-all (``ReshardLayer``), attends over whole sequences with
1/sep of the heads, turns the output back, and its criterion all-gathers the per-token losses over the sep
group (``ConcatMaskedLoss``), so every sep rank's loss is the whole sequence's mean and its backward keeps only
its segment's share. Gradients are then *summed* over sep (unscaled; divided by dp only): Paddle's
``HybridParallelOptimizer`` does it in the step's gradient sync (``fused_allreduce_gradients`` over the sep or
fused dp×sep group).

* :func:`shard_sequence`: the Trainer's cut, applied to each micro-batch after the layout-free global order
  chose its samples (so the order depends only on seed and global batch). PaddleNLP cuts with
  ``split_inputs_sequence_dim``; ours refuses what Llama ignores under sep instead of dropping it silently:
  ``attention_mask`` (the sep attention builds its own causal mask), custom ``position_ids`` (rebuilt as
  ``arange(seq_length)``) and packed-sequence indices.
* :func:`gather_sequence`: logits of the segments back into whole sequences, for evaluation and prediction.
* :func:`apply_segment_parallel`: fleet's ``SegmentParallel`` wrapper (broadcasts the initial parameters over
  sep, sharding and dp) when no other axis wrapper does, and PaddleNLP 3.0.0b4's all-to-all argument order fix
  (:func:`~.cpu.all_to_all.install_paddlenlp_reshard_order_fix`, needed on every device).

On a CPU build gloo has no all-to-all: the CPU backend installs the exact fill of :mod:`.cpu.all_to_all`.
"""
from __future__ import annotations

from typing import Any, Dict

import paddle
import paddle.distributed as dist

from .cpu.all_to_all import install_paddlenlp_reshard_order_fix

__all__ = ["IGNORED_UNDER_SEP", "apply_segment_parallel", "gather_sequence", "has_sep_path", "shard_sequence"]

# batch keys PaddleNLP's Llama ignores under sep (see the module docstring): refused, never dropped
IGNORED_UNDER_SEP = ("attention_mask", "position_ids", "attn_mask_startend_row_indices")


def has_sep_path(model) -> bool:
    """Whether ``model`` has PaddleNLP's sep attention (a ``ReshardLayer``, built when its config's
    ``sep_parallel_degree`` > 1): a model without one would run each segment as a whole sequence."""
    return any(type(m).__name__ == "ReshardLayer" for m in model.sublayers(include_self=True))


def shard_sequence(inputs: Dict[str, Any], degree: int, rank: int) -> Dict[str, Any]:
    """This sep rank's segment of a micro-batch: every ``[batch, seq]`` tensor cut into ``degree`` contiguous
    pieces along the sequence, piece ``rank`` kept. One-line ``ValueError`` for a key the model would ignore
    under sep, a tensor that is not 2-D, or a sequence length ``degree`` does not divide."""
    if degree == 1:
        return inputs
    out = {}
    for key, value in inputs.items():
        if key in IGNORED_UNDER_SEP and value is not None:
            raise ValueError(f"sep_parallel_degree={degree}: the batch has {key!r}, which PaddleNLP's sep attention "
                             f"ignores (causal mask and positions 0..seq-1 only); drop that column (packed or "
                             f"padded sequences are not supported under sep)")
        if value is None or not isinstance(value, paddle.Tensor):
            out[key] = value
            continue
        if value.ndim != 2:
            raise ValueError(f"sep_parallel_degree={degree}: batch key {key!r} has shape {list(value.shape)}; under "
                             f"sep every batch tensor must be [batch, sequence]")
        length = int(value.shape[1])
        if length % degree:
            raise ValueError(f"sep_parallel_degree={degree} does not divide the sequence length {length} of batch "
                             f"key {key!r}: pad or cut sequences to a multiple of {degree}")
        piece = length // degree
        out[key] = value[:, rank * piece:(rank + 1) * piece]
    return out


@paddle.no_grad()
def gather_sequence(value, group):
    """Whole sequences from every sep rank's segment (``[batch, seq/sep, ...]`` → ``[batch, seq, ...]``, in
    sep-rank order); tuples/lists element-wise; non-tensors and tensors without a sequence axis unchanged."""
    if isinstance(value, (tuple, list)):
        return type(value)(gather_sequence(v, group) for v in value)
    if not isinstance(value, paddle.Tensor) or value.ndim < 2:
        return value
    pieces = []
    dist.all_gather(pieces, value, group=group)
    return paddle.concat(pieces, axis=1)


def apply_segment_parallel(model, *, topology, wrapped: bool):
    """sep > 1: PaddleNLP's all-to-all argument order fixed, and the model wrapped in fleet's
    ``SegmentParallel`` unless ``wrapped`` (the tensor-parallel or sharding wrapper already broadcasts over
    sep). The gradient sum over sep is the optimizer's (``HybridParallelOptimizer``)."""
    if topology.sep_degree == 1:
        return model
    install_paddlenlp_reshard_order_fix()
    if wrapped:
        return model
    from paddle.distributed import fleet
    from paddle.distributed.fleet.meta_parallel import SegmentParallel

    model = fleet.distributed_model(model)
    if not isinstance(model, SegmentParallel):
        raise RuntimeError(f"fleet.distributed_model returned {type(model).__name__}, expected SegmentParallel")
    return model
