"""``SFTConfig`` and ``SFTTrainer``: supervised fine-tuning of a causal LM with PaddleNLP's names, options and
defaults (``paddlenlp.trl``). The trainer tokenizes a text dataset (``dataset_text_field`` or a
``formatting_func``) when it is not tokenized yet, logs the perplexity next to each loss, and predicts either
the argmax tokens or, with ``do_generation``, sampled continuations. The loss is the Trainer's: with
``loss_average="global_batch"`` the mean over every trained token of the global batch on any layout.
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional

import numpy as np
import paddle

from ..config.llm_meta import llmmetaclass
from ..optim.loss import IGNORE_INDEX
from ..trainer import Trainer
from ..training_args import TrainingArguments
from .dpo_config import benchmark_overrides

__all__ = ["SFTConfig", "SFTTrainer", "DataCollatorForSeq2Seq"]


def _help(text: str) -> dict:
    return {"help": text}


@dataclass
@llmmetaclass
class SFTConfig(TrainingArguments):
    """``TrainingArguments`` of a fine-tuning run (PaddleNLP's ``SFTConfig``: learning rate 2e-5,
    ``max_seq_length`` 2048, ``dataset_text_field`` "text", the benchmark switches), with the model options
    ``llmmetaclass`` adds (``use_flash_attention``, ``virtual_pp_degree``, ``recompute_granularity`` ...)."""

    benchmark: bool = field(default=False, metadata=_help("Benchmark run: train only, no save, no evaluation."))
    autotuner_benchmark: bool = field(default=False, metadata=_help("Benchmark run for the autotuner (5 steps)."))
    decay_steps: int = field(default=0, metadata=_help("The steps that control the learning-rate decay."))
    tensor_parallel_output: Optional[bool] = field(default=False, metadata=_help("Keep logits vocabulary-parallel."))
    unified_checkpoint: bool = field(default=False, metadata=_help("Save in PaddleNLP's unified checkpoint layout."))
    unified_checkpoint_config: Optional[str] = field(default="", metadata=_help("Unified checkpoint options."))
    dataset_text_field: str = "text"
    learning_rate: float = 2.0e-5
    max_seq_length: int = field(default=2048, metadata=_help("The longest tokenized example (and packed row)."))
    dataset_num_proc: Optional[int] = None
    dataset_batch_size: int = 1000
    model_init_kwargs: Optional[Dict[str, Any]] = None
    dataset_kwargs: Optional[Dict[str, Any]] = None
    eval_packing: Optional[bool] = None
    use_ssa: bool = field(default=False, metadata=_help("Shifted sparse attention (LongLoRA)."))
    ssa_group_size_ratio: float = field(default=0.25, metadata=_help("The group ratio of shifted sparse attention."))

    def __post_init__(self):
        if self.autotuner_benchmark:
            self.max_steps, self.report_to = 5, []
            benchmark_overrides(self, logging_every_step=False)
        if self.benchmark:
            self.report_to = []
            benchmark_overrides(self, logging_every_step=False)
        super().__post_init__()


class DataCollatorForSeq2Seq:
    """Pads ``input_ids`` (and ``attention_mask``/``position_ids`` when present) with the tokenizer's pad id
    and ``labels`` with ``label_pad_token_id`` to the longest example (rounded up to ``pad_to_multiple_of``)."""

    def __init__(self, tokenizer, label_pad_token_id: int = IGNORE_INDEX, pad_to_multiple_of: Optional[int] = None,
                 return_tensors: str = "np"):
        self.tokenizer, self.label_pad_token_id = tokenizer, label_pad_token_id
        self.pad_to_multiple_of, self.return_tensors = pad_to_multiple_of, return_tensors

    def __call__(self, features: List[Dict[str, Any]]) -> Dict[str, np.ndarray]:
        length = max(len(f["input_ids"]) for f in features)
        if self.pad_to_multiple_of:
            length = -(-length // self.pad_to_multiple_of) * self.pad_to_multiple_of
        left = getattr(self.tokenizer, "padding_side", "right") == "left"
        pads = {"input_ids": self.tokenizer.pad_token_id or 0, "labels": self.label_pad_token_id,
                "attention_mask": 0, "position_ids": 0}
        batch = {}
        for key, pad in pads.items():
            if key not in features[0]:
                continue
            rows = []
            for f in features:
                values, gap = list(f[key]), [pad] * (length - len(f[key]))
                rows.append(gap + values if left else values + gap)
            batch[key] = np.array(rows, dtype="int64")
        return batch


def _load_model(name_or_path: str, init_kwargs: Dict[str, Any]):
    """``AutoModelForCausalLM.from_pretrained`` (PaddleNLP, an optional dependency, imported when asked for)."""
    from paddlenlp.transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(name_or_path, **init_kwargs)


def _load_tokenizer(name_or_path: str):
    from paddlenlp.transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(name_or_path)
    if getattr(tokenizer, "pad_token", None) is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def _as_sft_config(args):
    if args is None:
        warnings.warn("No `SFTConfig` passed, using `output_dir=tmp_trainer`.")
        return SFTConfig(output_dir="tmp_trainer")
    if not isinstance(args, SFTConfig):
        return SFTConfig(**{k: getattr(args, k) for k in args.to_dict() if hasattr(args, k)})
    return args


class SFTTrainer(Trainer):
    """Supervised fine-tuning (PaddleNLP's ``SFTTrainer``): ``model`` an instantiated causal LM or a name to load,
    ``args`` an :class:`SFTConfig` (a plain ``TrainingArguments`` is converted), ``do_generation`` with
    ``gen_args`` (``top_k``, ``top_p``) and ``data_args`` (``max_length``) makes ``predict`` sample
    continuations; ``formatting_func`` turns a batch of raw examples into texts to tokenize."""

    def __init__(self, model=None, criterion=None, args=None, data_collator=None, train_dataset=None,
                 eval_dataset=None, tokenizer=None, compute_metrics=None, callbacks=None, optimizers=(None, None),
                 preprocess_logits_for_metrics=None, do_generation: bool = False, gen_args=None, data_args=None,
                 formatting_func: Optional[Callable] = None):
        if do_generation and (gen_args is None or data_args is None):
            raise ValueError("SFTTrainer(do_generation=True) needs gen_args and data_args")
        self.do_generation, self.gen_args, self.data_args = do_generation, gen_args, data_args
        args = _as_sft_config(args)
        if args.model_init_kwargs is not None and not isinstance(model, str):
            raise ValueError("SFTConfig.model_init_kwargs applies to a model given by name; this model is built")
        if isinstance(model, str):
            name, model = model, _load_model(model, dict(args.model_init_kwargs or {}))
            tokenizer = tokenizer if tokenizer is not None else _load_tokenizer(name)
        if tokenizer is None:
            raise ValueError("SFTTrainer needs a tokenizer")
        self.dataset_num_proc, self.dataset_batch_size = args.dataset_num_proc, args.dataset_batch_size
        kwargs = dict(args.dataset_kwargs or {})
        train_dataset = self._prepare_dataset(train_dataset, tokenizer, args, formatting_func, **kwargs)
        if isinstance(eval_dataset, dict):
            eval_dataset = {k: self._prepare_dataset(v, tokenizer, args, formatting_func, **kwargs)
                            for k, v in eval_dataset.items()}
        else:
            eval_dataset = self._prepare_dataset(eval_dataset, tokenizer, args, formatting_func, **kwargs)
        super().__init__(model=model, criterion=criterion, args=args,
                         data_collator=data_collator or DataCollatorForSeq2Seq(tokenizer), train_dataset=train_dataset,
                         eval_dataset=eval_dataset, tokenizer=tokenizer, compute_metrics=compute_metrics,
                         callbacks=callbacks, optimizers=optimizers,
                         preprocess_logits_for_metrics=preprocess_logits_for_metrics)

    def _prepare_dataset(self, dataset, tokenizer, args, formatting_func, add_special_tokens=True,
                         skip_prepare_dataset=False):
        """A Hugging Face dataset of texts tokenized into ``input_ids``/``attention_mask``/``labels`` (the next
        token, -100 at padding and at the end); a tokenized or a Paddle dataset as it is."""
        if dataset is None or skip_prepare_dataset:
            return dataset
        columns = getattr(dataset, "column_names", None)
        if columns and "input_ids" in columns:
            return dataset
        if not hasattr(dataset, "map") or columns is None and not hasattr(dataset, "features"):
            return dataset
        text_field = args.dataset_text_field

        def tokenize(batch):
            texts = batch[text_field] if formatting_func is None else formatting_func(batch)
            if not isinstance(texts, list):
                raise ValueError("formatting_func must return a list of strings (one per example)")
            out = tokenizer(texts, add_special_tokens=add_special_tokens, truncation=True, padding=False,
                            max_length=args.max_seq_length, return_length=False)
            pad = tokenizer.pad_token_id
            labels = [[IGNORE_INDEX if t == pad else t for t in ids[1:]] + [IGNORE_INDEX] for ids in out["input_ids"]]
            return {"input_ids": out["input_ids"], "attention_mask": out["attention_mask"], "labels": labels}

        remove = columns if args.remove_unused_columns else None
        map_kwargs = {"batched": True, "remove_columns": remove, "batch_size": self.dataset_batch_size}
        if type(dataset).__name__ == "Dataset":
            map_kwargs["num_proc"] = self.dataset_num_proc
        return dataset.map(tokenize, **map_kwargs)

    def prediction_step(self, model, inputs, prediction_loss_only: bool, ignore_keys=None):
        """The loss only; else the argmax token of each position (``keepdim``), or with ``do_generation``
        sampled continuations padded with -100."""
        if prediction_loss_only or self.topology.pp_degree > 1:
            return super().prediction_step(model, inputs, prediction_loss_only, ignore_keys)
        if not self.do_generation:
            loss, logits, labels = super().prediction_step(model, inputs, prediction_loss_only, ignore_keys)
            if isinstance(logits, (list, tuple)):
                logits = logits[0]
            return loss, logits.argmax(axis=-1, keepdim=True), labels
        return None, self._generate(model, self._prepare_inputs(inputs)), inputs.get("labels")

    def _generate(self, model, inputs):
        model.eval()
        tok = self.tokenizer
        with paddle.no_grad():
            tokens = model.generate(
                input_ids=inputs["input_ids"], attention_mask=inputs.get("attention_mask"),
                position_ids=inputs.get("position_ids"),
                max_length=max(self.data_args.max_length - inputs["input_ids"].shape[-1], 1),
                decode_strategy="sampling", top_k=self.gen_args.top_k, top_p=self.gen_args.top_p,
                bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                use_cache=True)[0]
        rows = [[t for t in row.tolist() if t != tok.pad_token_id] for row in tokens.numpy()]
        width = max(len(r) for r in rows)
        return paddle.to_tensor([r + [IGNORE_INDEX] * (width - len(r)) for r in rows])

    def log(self, logs: Dict[str, float], **kwargs) -> None:
        """Add the perplexity (``ppl``/``eval_ppl``: exp of the loss) to ``logs``."""
        for loss_key, ppl_key in (("loss", "ppl"), ("eval_loss", "eval_ppl")):
            if loss_key in logs:
                logs[ppl_key] = math.exp(logs[loss_key]) if logs[loss_key] < 700 else float("inf")
        super().log(logs, **kwargs)
