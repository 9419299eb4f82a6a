"""``AutoTrainingArguments``: the argument class of PaddleNLP's auto-parallel scripts, mapped onto our layout.

PaddleNLP 3.0.0b4's auto-parallel scripts parse ``AutoTrainingArguments`` (its ``enable_auto_parallel`` asserted
True) and let Paddle's auto-parallel engine place the model. paddletrainer has no such engine: here the same
degree options (``tensor_parallel_degree``, ``pipeline_parallel_degree``, ``sharding``, ...) build our layout and
the Trainer parallelizes a plain model with it, so ``enable_auto_parallel=True`` is what this class means rather
than an option it acts on. Its own options:

* static-graph fusion passes of the auto-parallel engine (``fused_linear``, ``fused_linear_param_grad_add``,
  ``fuse_allreduce_split_to_reducescatter``, ``eliminate_transpose``): they change speed, not results, and a
  dygraph run has no pass pipeline, so they are accepted with a warning that they have no effect;
* options with behaviour we do not have are refused by name when set: ``use_intermediate_api``,
  ``refined_ops_patterns``, ``save_model_with_sharding_tensor_fusion``, ``load_model_with_sharding_tensor_fusion``
  and ``job_schedule_profiler_start``/``_end``.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import ClassVar, Optional

from .training_args import TrainingArguments

logger = logging.getLogger(__name__)

__all__ = ["AutoTrainingArguments"]

# option -> why it is refused when set (its "off" value is the PaddleNLP default)
_REFUSED = {
    "use_intermediate_api": "it builds the model with Paddle's auto-parallel intermediate API, which needs "
                            "the auto-parallel engine; build a plain model and set the degree options",
    "refined_ops_patterns": "refined recompute of the auto-parallel engine; use refined_recompute",
    "save_model_with_sharding_tensor_fusion": "checkpoints here are always sharded per rank and load into any "
                                              "layout; drop the option",
    "load_model_with_sharding_tensor_fusion": "checkpoints here are always sharded per rank and load into any "
                                              "layout; drop the option",
    "job_schedule_profiler_start": "the auto-parallel engine's job-schedule profiler; use Paddle's profiler",
    "job_schedule_profiler_end": "the auto-parallel engine's job-schedule profiler; use Paddle's profiler",
}
_STATIC_PASSES = ("fused_linear", "fused_linear_param_grad_add", "fuse_allreduce_split_to_reducescatter",
                  "eliminate_transpose")


def _help(text: str) -> dict:
    return {"help": text}


@dataclass
class AutoTrainingArguments(TrainingArguments):
    """PaddleNLP's ``AutoTrainingArguments`` (every option name), trained on our layout (see the module doc)."""

    # read by compat.refuse_unsupported_parallel: enable_auto_parallel=True maps onto our layout here
    auto_parallel_on_our_layout: ClassVar[bool] = True

    fused_linear: bool = field(default=False, metadata=_help(
        "Auto-parallel static pass (fused matmul + bias add); no effect here (dygraph), with a warning."))
    fused_linear_param_grad_add: bool = field(default=False, metadata=_help(
        "Auto-parallel static pass (fused gradient accumulation); no effect here (dygraph), with a warning."))
    fuse_allreduce_split_to_reducescatter: bool = field(default=False, metadata=_help(
        "Auto-parallel static pass; no effect here (dygraph), with a warning."))
    eliminate_transpose: bool = field(default=False, metadata=_help(
        "Auto-parallel static pass; no effect here (dygraph), with a warning."))
    use_intermediate_api: bool = field(default=False, metadata=_help(
        "Paddle's auto-parallel intermediate API: refused when True."))
    refined_ops_patterns: Optional[str] = field(default=None, metadata=_help(
        "Auto-parallel refined recompute patterns: refused when set (use refined_recompute)."))
    load_model_with_sharding_tensor_fusion: bool = field(default=False, metadata=_help(
        "Refused when True: checkpoints here load into any layout."))
    save_model_with_sharding_tensor_fusion: bool = field(default=False, metadata=_help(
        "Refused when True: checkpoints here are sharded per rank."))
    job_schedule_profiler_start: int = field(default=-1, metadata=_help(
        "The auto-parallel engine's profiler: refused unless -1."))
    job_schedule_profiler_end: int = field(default=-1, metadata=_help(
        "The auto-parallel engine's profiler: refused unless -1."))

    def __post_init__(self):
        if not self.enable_auto_parallel:
            raise ValueError("AutoTrainingArguments needs enable_auto_parallel=True (as in PaddleNLP); "
                             "use TrainingArguments for a script without it")
        for option, why in _REFUSED.items():
            value = getattr(self, option)
            if value not in (None, False, -1):
                raise ValueError(f"{option}={value!r} is not supported by paddletrainer: {why}")
        super().__post_init__()
        on = [p for p in _STATIC_PASSES if getattr(self, p)]
        if on:
            logger.warning("%s: static-graph passes of Paddle's auto-parallel engine, no effect in paddletrainer's "
                           "dygraph training", ", ".join(f"{p}=True" for p in on))
