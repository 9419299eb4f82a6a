"""The options of a DPO run with PaddleNLP's names, fields and defaults (its ``llm/alignment/dpo/dpo_argument.py``):
``DPOConfig`` (the loss), ``DPOTrainingArguments`` (the Trainer's, plus the benchmark switches),
``DPODataArgument`` and ``DPOModelArgument`` (what ``run_dpo.py`` reads).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from ..trainer_utils import IntervalStrategy
from ..training_args import TrainingArguments
from .dpo_criterion import DPO_LOSS_TYPES

__all__ = ["DPOConfig", "DPOTrainingArguments", "DPODataArgument", "DPOModelArgument"]


def _help(text: str) -> dict:
    return {"help": text}


def benchmark_overrides(args, logging_every_step: bool) -> None:
    """PaddleNLP's ``benchmark``/``autotuner_benchmark`` modes: train only, save and evaluate nothing."""
    args.do_train, args.do_export, args.do_predict, args.do_eval = True, False, False, False
    args.overwrite_output_dir, args.load_best_model_at_end = True, False
    args.save_strategy = args.evaluation_strategy = IntervalStrategy.NO.value
    if logging_every_step and not args.disable_tqdm:
        args.logging_steps, args.logging_strategy = 1, IntervalStrategy.STEPS.value


@dataclass
class DPOTrainingArguments(TrainingArguments):
    """``TrainingArguments`` of a DPO run: ``unified_checkpoint`` on by default, and the benchmark switches."""

    unified_checkpoint: bool = field(default=True, metadata=_help("Save in PaddleNLP's unified checkpoint layout."))
    unified_checkpoint_config: Optional[str] = field(default="", metadata=_help("Unified checkpoint options."))
    autotuner_benchmark: bool = field(default=False, metadata=_help("Benchmark run for the autotuner (5 steps)."))
    benchmark: bool = field(default=False, metadata=_help("Benchmark run: train only, no save, no evaluation."))

    def __post_init__(self):
        if self.autotuner_benchmark:
            self.num_train_epochs, self.max_steps, self.report_to = 1, 5, []
            benchmark_overrides(self, logging_every_step=True)
        if self.benchmark:
            benchmark_overrides(self, logging_every_step=True)
        if self.max_steps > 0:
            self.num_train_epochs = 1
        super().__post_init__()


@dataclass
class DPOConfig:
    """The DPO loss: ``loss_type`` (sigmoid, hinge, ipo, kto_pair, sppo_hard, nca_pair, dpop, or, simpo),
    ``beta``, ``label_smoothing`` (sigmoid, simpo), the weights of the preference and SFT terms, and the reference:
    a frozen model, the policy with its LoRA switched off (``lora``), or none (``reference_free``)."""

    beta: float = field(default=0.1, metadata=_help("The beta of the DPO loss."))
    simpo_gamma: float = field(default=0.5, metadata=_help("The gamma of the SimPO loss."))
    label_smoothing: float = field(default=0.0, metadata=_help("Label smoothing of the sigmoid/simpo losses."))
    loss_type: str = field(default="sigmoid", metadata=_help("DPO loss type: " + ", ".join(DPO_LOSS_TYPES)))
    pref_loss_ratio: float = field(default=1.0, metadata=_help("Weight of the preference loss."))
    sft_loss_ratio: float = field(default=0.0, metadata=_help("Weight of the SFT loss on the chosen responses."))
    dpop_lambda: float = field(default=50, metadata=_help("The lambda of the DPOP loss."))
    ref_model_update_steps: int = field(default=-1, metadata=_help("Copy the policy into the reference every N steps."))
    reference_free: bool = field(default=False, metadata=_help("No reference model (log-probs of 0)."))
    lora: bool = field(default=False, metadata=_help("The policy is a LoRA model: its base is the reference."))


@dataclass
class DPODataArgument:
    """Where the preference pairs are and how long a packed row may be."""

    train_dataset_path: str = field(default="./data/train.jsonl", metadata=_help("The train set (JSON lines)."))
    dev_dataset_path: str = field(default="./data/dev.jsonl", metadata=_help("The dev set (JSON lines)."))
    max_seq_len: int = field(default=4096, metadata=_help("Maximum length of a packed row."))
    max_prompt_len: int = field(default=2048, metadata=_help("Maximum prompt length."))
    greedy_zero_padding: bool = field(default=False, metadata=_help("Greedy zero padding of the train stream."))
    lazy: bool = field(default=False, metadata=_help("An iterable dataset instead of a map-style one."))


@dataclass
class DPOModelArgument:
    """The model of a DPO run (PaddleNLP's ``DPOModelArgument``)."""

    model_name_or_path: str = field(default=None, metadata=_help("Pretrained model name or local directory."))
    tokenizer_name_or_path: Optional[str] = field(default=None, metadata=_help("Tokenizer, if not the model's."))
    use_flash_attention: bool = field(default=False, metadata=_help("Use flash attention."))
    recompute_granularity: str = field(default="full", metadata=_help("full, full_attn or core_attn."))
    flash_mask: bool = field(default=False, metadata=_help("Use FlashMask row indices instead of a dense mask."))
    virtual_pp_degree: int = field(default=1, metadata=_help("Virtual pipeline degree."))
    sequence_parallel: bool = field(default=False, metadata=_help("Sequence parallel (with tensor parallel)."))
    tensor_parallel_output: bool = field(default=True, metadata=_help("Keep the logits vocabulary-parallel."))
    weight_quantize_algo: str = field(default=None, metadata=_help("nf4 or weight_only_int8."))
    lora_rank: int = field(default=8, metadata=_help("LoRA rank."))
    lora_path: str = field(default=None, metadata=_help("A LoRA state dict to start from."))
    rslora: bool = field(default=False, metadata=_help("Use RsLoRA."))
    lora_plus_scale: float = field(default=1.0, metadata=_help("LoRA+ scale of B."))
    lora_alpha: int = field(default=-1, metadata=_help("LoRA alpha."))
    rslora_plus: bool = field(default=False, metadata=_help("RsLoRA with LoRA+."))
    use_quick_lora: bool = field(default=True, metadata=_help("Quick LoRA."))
