"""The model options PaddleNLP's llm scripts read from their training arguments (PaddleNLP 3.0.0b4's
``LlmMetaConfig``: fused kernels, the parallel degrees a model is built for, recompute) and ``llmmetaclass``,
which gives an arguments class each of them it lacks. The scripts copy these values to the model config
(``LlmMetaConfig.set_llm_config``); the Trainer itself reads only the ones ``TrainingArguments`` already has.
"""
from __future__ import annotations

from dataclasses import field
from typing import List, Optional

__all__ = ["LLM_META_OPTIONS", "llmmetaclass"]

# (name, type, default, help), in PaddleNLP's order: op fusion, hybrid parallel, recompute.
LLM_META_OPTIONS = (
    ("use_flash_attention", bool, False, "Use flash attention."),
    ("use_fused_rms_norm", bool, False, "Use the fused RMSNorm kernel."),
    ("use_fused_rope", bool, False, "Use the fused rotary-embedding kernel."),
    ("use_fused_linear", bool, False, "Use fused linear layers (GPT)."),
    ("use_fused_dropout_add", bool, False, "Use the fused dropout + residual add (GPT)."),
    ("use_fused_linear_cross_entropy", bool, False, "Fuse the output projection with the cross entropy."),
    ("tensor_parallel_degree", int, 1, "Tensor parallel degree."),
    ("tensor_parallel_rank", int, 0, "Tensor parallel rank."),
    ("tensor_parallel_output", bool, True, "Keep the logits split over the tensor parallel ranks."),
    ("pipeline_parallel_degree", int, 1, "Pipeline parallel degree."),
    ("virtual_pp_degree", int, 1, "Model chunks per pipeline stage (interleaved pipeline)."),
    ("no_recompute_layers", Optional[List[int]], None, "Layers never recomputed."),
    ("pp_recompute_interval", int, 1, "Recompute every N layers of a pipeline stage (0: none)."),
    ("sep_parallel_degree", int, 1, "Sequence (segment) parallel degree."),
    ("context_parallel_degree", int, 1, "Context parallel degree."),
    ("sequence_parallel", bool, False, "Sequence parallel (with tensor parallel)."),
    ("fuse_sequence_parallel_allreduce", bool, False, "Fuse the sequence parallel allreduce."),
    ("recompute", bool, False, "Recompute activations in the backward pass."),
    ("recompute_granularity", str, "full", "Recompute granularity: full, core_attn or full_attn."),
    ("recompute_use_reentrant", bool, False, "Use the reentrant recompute."),
    ("refined_recompute", str, "", "Refined recompute of single operations."),
    ("offload_recompute_inputs", bool, False, "Offload the recompute inputs to the host."),
)


def llmmetaclass(cls):
    """Give the not-yet-dataclass ``cls`` a field for each ``LLM_META_OPTIONS`` name it has no attribute of
    (its own or inherited), so applied under ``@dataclass`` the options parse from the command line or a JSON
    config with PaddleNLP's defaults; the ones the class has keep its own definition."""
    annotations = cls.__dict__.get("__annotations__", {})
    cls.__annotations__ = annotations
    for name, kind, default, help_text in LLM_META_OPTIONS:
        if not hasattr(cls, name):
            setattr(cls, name, field(default=default, metadata={"help": help_text}))
            annotations[name] = kind
    return cls
