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
  ``split_inputs_sequence_dim``, and its sep attention then drops a mask and rebuilds positions as
  ``arange(seq_length)``. Ours keeps packed rows exact: the document mask travels whole to every rank
  (:func:`.sequence_cut.documents_of_batch`: FlashMask's document ends, a block-diagonal ``attention_mask``
  turned into them), the attention of :mod:`.packed_attention` applies it to the rank's heads over the whole
  sequence, and per-document ``position_ids`` give the same scores as the whole sequence's (rope sees only
  differences inside a document). A ``[batch, seq]`` padding mask and positions that do not count up inside a
  document stay refused by name.
* :func:`gather_sequence`: logits of the segments back into whole sequences, for evaluation and prediction;
  :class:`GatherSequence` the same with a backward (each rank keeps its segment's gradient), for a loss of
  whole sequences computed on every sep rank (DPO's per-response log-prob sums cross the segments).
* :func:`apply_segment_parallel`: fleet's ``SegmentParallel`` wrapper (broadcasts the initial parameters over
  sep, sharding and dp) when no other axis wrapper does, and PaddleNLP 3.0.0b4's all-to-all argument order fix
  (:func:`~.cpu.all_to_all.install_paddlenlp_reshard_order_fix`, needed on every device).

On a CPU build gloo has no all-to-all: the CPU backend installs the exact fill of :mod:`.cpu.all_to_all`.
"""
from __future__ import annotations

from typing import Any, Dict

import paddle
import paddle.distributed as dist
from paddle.autograd import PyLayer

from .cpu.all_to_all import install_paddlenlp_reshard_order_fix
from .sequence_cut import cut_batch, gather_sequences, wrap_in_segment_parallel

__all__ = ["GatherSequence", "apply_segment_parallel", "gather_sequence", "has_sep_path", "shard_sequence"]

def has_sep_path(model) -> bool:
    """Whether ``model`` has PaddleNLP's sep attention (a ``ReshardLayer``, built when its config's
    ``sep_parallel_degree`` > 1): a model without one would run each segment as a whole sequence."""
    return any(type(m).__name__ == "ReshardLayer" for m in model.sublayers(include_self=True))


def shard_sequence(inputs: Dict[str, Any], degree: int, rank: int) -> Dict[str, Any]:
    """This sep rank's segment of a micro-batch: every ``[batch, seq]`` tensor cut into ``degree`` contiguous
    pieces along the sequence, piece ``rank`` kept (refusals: :func:`.sequence_cut.cut_batch`)."""
    if degree == 1:
        return inputs

    def segment(value):
        piece = int(value.shape[1]) // degree
        return value[:, rank * piece:(rank + 1) * piece]

    # packed_attention turns the attention's rope to whole position_ids under sep, so they may restart anywhere
    return cut_batch(inputs, option="sep_parallel_degree", degree=degree, pieces=degree, cut=segment,
                     turns_positions=True)


def gather_sequence(value, group):
    """Whole sequences from every sep rank's segment (``[batch, seq/sep, ...]`` → ``[batch, seq, ...]``, in
    sep-rank order)."""
    return gather_sequences(value, group, lambda parts: paddle.concat(parts, axis=1))


class GatherSequence(PyLayer):
    """``[batch, seq/sep, ...]`` segments → whole ``[batch, seq, ...]`` sequences on every rank of ``group``; the
    backward keeps this rank's segment of the gradient (every rank computes the same whole-sequence loss, and the
    optimizer sums the parameter gradients over sep)."""

    @staticmethod
    def forward(ctx, segment, group):
        parts = []
        dist.all_gather(parts, segment, group=group)
        ctx.group_rank, ctx.pieces = group.rank, group.nranks
        return paddle.concat(parts, axis=1)

    @staticmethod
    def backward(ctx, grad):
        return paddle.split(grad, ctx.pieces, axis=1)[ctx.group_rank]


def apply_segment_parallel(model, *, topology, wrapped: bool):
    """sep > 1: PaddleNLP's all-to-all argument order fixed, and the model wrapped in fleet's
    ``SegmentParallel`` unless ``wrapped`` (the tensor-parallel or sharding wrapper already broadcasts over
    sep). The gradient sum over sep is the optimizer's (``HybridParallelOptimizer``)."""
    if topology.sep_degree == 1:
        return model
    install_paddlenlp_reshard_order_fix()
    return model if wrapped else wrap_in_segment_parallel(model)
