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

* :func:`shard_context`: the Trainer's cut, after the layout-free global order chose the samples. Packed rows
  keep their documents: the document ends travel whole to every rank (:func:`.sequence_cut.documents_of_batch`;
  Llama refuses an ``attention_mask`` under cp, so a block-diagonal one becomes the ends), and the ring attention
  of :mod:`.packed_attention` masks every chunk pair by the documents and skips the pairs they empty. Llama builds
  the load-balanced positions of the whole sequence itself; per-document ``position_ids`` give the same scores
  (rope sees only differences inside a document), so they are checked, not used. A ``[batch, seq]`` padding mask
  stays refused by name, and so do packed rows under cp on a CUDA device (``RingFlashAttention`` takes no mask).
* :func:`gather_context`: logits of the chunks back into whole sequences in order, for evaluation.
"""
from __future__ import annotations

import importlib.util
from typing import Any, Dict

import paddle

from .ring_attention import RingAttention, split_load_balanced, undo_load_balanced
from .sequence_cut import cut_batch, gather_sequences, wrap_in_segment_parallel

__all__ = ["apply_context_parallel", "gather_context", "has_cp_path", "shard_context"]



def has_cp_path(model) -> bool:
    """Whether ``model`` runs ring attention under cp: PaddleNLP's Llama family (its config has
    ``context_parallel_degree`` and its attention calls ``RingFlashAttention`` when that is > 1)."""
    config = getattr(model, "config", None)
    return config is not None and any(type(m).__name__ == "LlamaAttention" for m in model.sublayers())


def shard_context(inputs: Dict[str, Any], degree: int, rank: int) -> Dict[str, Any]:
    """This cp rank's chunks ``rank`` and ``2·degree−1−rank`` of every ``[batch, seq]`` tensor of a micro-batch
    (refusals: :func:`.sequence_cut.cut_batch`)."""
    if degree == 1:
        return inputs
    return cut_batch(inputs, option="context_parallel_degree", degree=degree, pieces=2 * degree,
                     cut=lambda value: split_load_balanced(value, rank, degree, axis=1), turns_positions=False)


def gather_context(value, group):
    """Whole sequences, in order, from every cp rank's two chunks (``[batch, seq/cp, ...]`` →
    ``[batch, seq, ...]``)."""
    return gather_sequences(value, group, lambda parts: undo_load_balanced(parts, axis=1))


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
    return model if wrapped else wrap_in_segment_parallel(model)
