"""Ring context parallel (PaddleNLP's ``context_parallel_degree``): the cp axis's wrap function and the
load-balanced sequence cut.

The ranks of a cp group read the same samples (``splits_data=False``). Every sequence is cut into ``2·cp``
chunks and rank ``r`` keeps chunks ``r`` and ``2·cp−1−r`` (PaddleNLP's head/tail layout: under causal
attention every rank then does the same work). PaddleNLP's Llama (``config.context_parallel_degree``) builds the
matching position ids itself, attends with ring attention over the cp group, and its criterion all-gathers the
per-token losses over the group (``ConcatMaskedLoss``), so every cp rank's loss is the whole sequence's mean.
Gradients are then summed over cp (unscaled) by Paddle's ``HybridParallelOptimizer``, as under sep: PaddleNLP
3.0.0b4 runs cp on fleet's sep groups (``sep_degree = context_parallel_degree``).

Which attention kernel runs: on GPU builds PaddleNLP's ``RingFlashAttention`` (flash-attention kernels and
``paddlenlp_ops.flash_attn_bwd``); on the CPU build, which has neither and whose gloo deadlocks on its
``batch_isend_irecv``, :func:`apply_context_parallel` puts :class:`~.ring_attention.RingAttention` (math
attention per block, ring-safe blocking send/recv) where Llama calls ``RingFlashAttention.apply``. The CPU
runs prove the layout and our kernel, not PaddleNLP's GPU kernel.

* :func:`shard_context`: the Trainer's cut, after the layout-free global order chose the samples; refuses the
  batch keys Llama ignores or refuses under cp (``attention_mask``, custom ``position_ids``, packed-sequence
  indices) instead of dropping them.
* :func:`gather_context`: logits of the chunks back into whole sequences in order, for evaluation.
"""
from __future__ import annotations

import importlib.util
from typing import Any, Dict

import paddle
import paddle.distributed as dist

from .ring_attention import RingAttention, split_load_balanced, undo_load_balanced

__all__ = ["IGNORED_UNDER_CP", "apply_context_parallel", "gather_context", "has_cp_path", "shard_context"]

# batch keys PaddleNLP's Llama ignores (positions are rebuilt per chunk) or refuses (masks) under cp
IGNORED_UNDER_CP = ("attention_mask", "position_ids", "attn_mask_startend_row_indices")


def has_cp_path(model) -> bool:
    """Whether ``model`` runs ring attention under cp: PaddleNLP's Llama family (its config has
    ``context_parallel_degree`` and its attention calls ``RingFlashAttention`` when that is > 1)."""
    config = getattr(model, "config", None)
    return config is not None and any(type(m).__name__ == "LlamaAttention" for m in model.sublayers())


def shard_context(inputs: Dict[str, Any], degree: int, rank: int) -> Dict[str, Any]:
    """This cp rank's chunks ``rank`` and ``2·degree−1−rank`` of every ``[batch, seq]`` tensor of a micro-batch.
    One-line ``ValueError`` for a key Llama ignores under cp, a tensor that is not 2-D, or a sequence length
    ``2·degree`` does not divide."""
    if degree == 1:
        return inputs
    out = {}
    for key, value in inputs.items():
        if key in IGNORED_UNDER_CP and value is not None:
            raise ValueError(f"context_parallel_degree={degree}: the batch has {key!r}, which PaddleNLP's ring "
                             f"attention cannot take (causal attention and positions 0..seq-1 only); drop that "
                             f"column (packed or padded sequences are not supported under context parallel)")
        if value is None or not isinstance(value, paddle.Tensor):
            out[key] = value
            continue
        if value.ndim != 2:
            raise ValueError(f"context_parallel_degree={degree}: batch key {key!r} has shape {list(value.shape)}; "
                             f"under context parallel every batch tensor must be [batch, sequence]")
        if int(value.shape[1]) % (2 * degree):
            raise ValueError(f"context_parallel_degree={degree}: the sequence length {int(value.shape[1])} of batch "
                             f"key {key!r} does not divide by 2 x {degree}: pad or cut sequences to a multiple of "
                             f"{2 * degree}")
        out[key] = split_load_balanced(value, rank, degree, axis=1)
    return out


@paddle.no_grad()
def gather_context(value, group):
    """Whole sequences, in order, from every cp rank's two chunks (``[batch, seq/cp, ...]`` →
    ``[batch, seq, ...]``); tuples/lists element-wise; non-tensors and tensors without a sequence axis
    unchanged."""
    if isinstance(value, (tuple, list)):
        return type(value)(gather_context(v, group) for v in value)
    if not isinstance(value, paddle.Tensor) or value.ndim < 2:
        return value
    parts = []
    dist.all_gather(parts, value, group=group)
    return undo_load_balanced(parts, axis=1)


def install_cpu_ring_attention() -> None:
    """On a build without GPU flash attention: Llama's ``RingFlashAttention`` becomes our
    :class:`RingAttention` (the same ``apply`` arguments). No-op on a CUDA device or without PaddleNLP."""
    if "gpu" in paddle.device.get_device() or importlib.util.find_spec("paddlenlp") is None:
        return
    from paddlenlp.transformers.llama import fusion_ops

    fusion_ops.RingFlashAttention = RingAttention


def apply_context_parallel(model, *, topology, wrapped: bool):
    """cp > 1: the CPU build's ring attention installed (:func:`install_cpu_ring_attention`), and the model
    wrapped in fleet's ``SegmentParallel`` unless ``wrapped`` (the tensor-parallel wrapper already broadcasts
    over the sep group cp runs on). The gradient sum over cp is the optimizer's (``HybridParallelOptimizer``)."""
    if topology.cp_degree == 1:
        return model
    install_cpu_ring_attention()
    if wrapped:
        return model
    from paddle.distributed import fleet
    from paddle.distributed.fleet.meta_parallel import SegmentParallel

    model = fleet.distributed_model(model)
    if not isinstance(model, SegmentParallel):
        raise RuntimeError(f"fleet.distributed_model returned {type(model).__name__}, expected SegmentParallel")
    return model
