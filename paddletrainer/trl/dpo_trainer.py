"""``DPOTrainer`` (PaddleNLP's name, constructor and logged metrics) on paddletrainer's Trainer.

Each micro-batch: the reference log-probs of its pairs (the frozen ``ref_model``, the policy with its LoRA
switched off, or zeros when ``reference_free``) under ``no_grad``, then the policy's, then
``DPOCriterion`` — where PaddleNLP computes them, inside ``compute_loss``. The preference loss is a mean over
pairs, so ``count_loss_items`` counts pairs: with ``loss_average="global_batch"`` an optimizer step's loss is
the mean over every pair of its global batch, whatever the micro-batching and data ranks. The metrics
(rewards/chosen, rewards/rejected, rewards/accuracies, rewards/margins, logps/chosen, logps/rejected, the loss
terms) are means over the pairs seen since the last log, summed over the data ranks when they are logged.

Under pipeline parallel (``trl.dpo_pipeline``) the Pipe model's last stage computes the loss: an optimizer step
runs the reference's forward through the pipeline over the step's micro-batches, then the policy's 1F1B with
those log-probs as labels; the Trainer's per-micro-batch pair weights apply to the last stage's losses as to any
pipeline loss. The last stage holds the metrics' sums; at a log they are summed over the pipeline group too.
Under sep each rank holds a segment of every row; the criterion sums each pair's log-probs over the sep group.
"""
from __future__ import annotations

import contextlib
from collections import defaultdict
from typing import Any, Dict, Optional

import paddle
import paddle.nn.functional as F
from paddle.distributed import fleet

from ..parallel import pipeline
from ..parallel.collectives import sum_over_data_group
from ..parallel.layout import Layout
from ..parallel.packed_attention import install_packed_attention
from ..parallel.segment import has_sep_path
from ..trainer import Trainer
from . import dpo_pipeline
from .dpo_criterion import DPO_LOSS_TYPES, REFERENCE_FREE_LOSS_TYPES, DPOCriterion, odds_ratio

__all__ = ["DPOTrainer", "disable_dropout_in_model"]

PAIR_LABELS = ["chosen_labels", "rejected_labels", "response_indexs"]
MODEL_INPUTS = ("input_ids", "position_ids")
MASK_INPUTS = ("attention_mask", "attn_mask_start_row_indices", "attn_mask_startend_row_indices")


def disable_dropout_in_model(model: paddle.nn.Layer) -> None:
    """Set the rate of every dropout layer of ``model`` to 0 (the log-probs of policy and reference must be
    deterministic for their difference to mean anything)."""
    for layer in model.sublayers(include_self=True):
        if isinstance(layer, paddle.nn.Dropout):
            layer.p = 0


def check_dpo_setup(dpo_config, ref_model, layout: Optional[Layout] = None,
                    model_with_dpo_criterion: bool = False) -> None:
    """Refuse a DPO setup PaddleNLP refuses, and the layouts this trainer does not run (``layout``: the arguments'
    resolved one, None before there are arguments), before any group exists."""
    if dpo_config is None:
        raise ValueError("DPOTrainer needs dpo_config (a paddletrainer.trl.DPOConfig)")
    if dpo_config.loss_type not in DPO_LOSS_TYPES:
        raise ValueError(f"DPOConfig.loss_type={dpo_config.loss_type!r} is unknown; valid: {', '.join(DPO_LOSS_TYPES)}")
    if dpo_config.reference_free:
        if ref_model is not None:
            raise ValueError("DPOConfig.reference_free=True takes no ref_model")
        if dpo_config.loss_type not in REFERENCE_FREE_LOSS_TYPES:
            raise ValueError(f"DPOConfig.loss_type={dpo_config.loss_type!r} needs a reference; reference_free "
                             f"works with {', '.join(REFERENCE_FREE_LOSS_TYPES)}")
    elif ref_model is not None:
        if dpo_config.loss_type in ("or", "simpo"):
            raise ValueError(f"DPOConfig.loss_type={dpo_config.loss_type!r} takes no ref_model: set reference_free=True")
    elif not dpo_config.lora:
        raise ValueError("DPOTrainer needs ref_model, or DPOConfig.reference_free=True, or DPOConfig.lora=True")
    if layout is None:
        return
    if layout.cp > 1:
        raise ValueError("DPOTrainer does not run with context_parallel_degree > 1 yet; use data, tensor, "
                         "pipeline, sharding or sep (sep_parallel_degree) parallel")
    if layout.pp > 1 and layout.sep > 1:
        raise ValueError("DPOTrainer does not run with pipeline_parallel_degree > 1 and sep_parallel_degree > 1 "
                         "together yet; use one of them")
    if model_with_dpo_criterion and layout.sep > 1:
        raise ValueError("model_with_dpo_criterion=True does not run with sep_parallel_degree > 1 (the model's "
                         "criterion would sum log-probs of one segment only); leave it False")


def set_lora_enabled(model, enabled: bool) -> None:
    """Switch every LoRA layer of ``model`` (a layer with a ``disable_lora`` flag) on or off."""
    for layer in model.sublayers(include_self=True):
        if hasattr(layer, "disable_lora") and hasattr(layer, "lora_A"):
            layer.disable_lora = not enabled


@contextlib.contextmanager
def policy_as_reference(model):
    """``model`` without its LoRA and in eval mode, as the reference of a LoRA policy; LoRA and the training mode
    are restored after."""
    was_training = model.training
    set_lora_enabled(model, False)
    model.eval()
    try:
        yield model
    finally:
        set_lora_enabled(model, True)
        if was_training:
            model.train()


class DPOTrainer(Trainer):
    """Direct preference optimisation of ``model`` against ``ref_model`` (PaddleNLP's ``DPOTrainer``).

    Args:
        model: the policy (a causal LM returning logits).
        data_collator: builds batches of packed pairs (``preference_collate_fn``).
        dpo_criterion: a :class:`DPOCriterion`; built from ``model.config`` and ``dpo_config`` when None.
        ref_model: the frozen reference (None with ``reference_free`` or ``lora``).
        dpo_config: a :class:`~paddletrainer.trl.DPOConfig`.
        disable_dropout: zero every dropout of policy and reference.
        padding_value: the pad id of the batches (kept for PaddleNLP's signature).
        model_with_dpo_criterion: the model computes the criterion itself from the label keys (under pipeline
            parallel the last stage always does: its loss function is set to the criterion).
        ignore_eos_token: leave the first rejected position out of its log-prob.
        **kwargs: the Trainer's (``args``, ``train_dataset``, ``eval_dataset``, ``tokenizer``, ...).
    """

    def __init__(self, model, data_collator, dpo_criterion=None, ref_model=None, dpo_config=None,
                 disable_dropout: bool = True, padding_value: int = 0, model_with_dpo_criterion: bool = False,
                 ignore_eos_token: bool = False, **kwargs):
        args = kwargs.get("args")
        check_dpo_setup(dpo_config, ref_model, args.parallel_config.layout if args is not None else None,
                        model_with_dpo_criterion)
        if dpo_criterion is not None and not isinstance(dpo_criterion, DPOCriterion):
            raise ValueError(f"dpo_criterion must be None or a DPOCriterion, got {type(dpo_criterion).__name__}")
        if kwargs.get("compute_metrics") is not None:
            raise ValueError("DPOTrainer logs its own metrics: compute_metrics must be None")
        super().__init__(model, data_collator=data_collator, **kwargs)
        self.dpo_config = dpo_config
        self.model_with_dpo_criterion = model_with_dpo_criterion
        self.dpo_criterion = None if model_with_dpo_criterion and not self._is_pipeline else (
            dpo_criterion or DPOCriterion(self.model.config, dpo_config=dpo_config, ignore_eos_token=ignore_eos_token,
                                          use_infohub=self._is_pipeline))
        if self.dpo_criterion is not None and self.topology.sep_degree > 1:
            self.dpo_criterion.sequence_group = self.topology.sep_group
        self.ref_model = None if dpo_config.reference_free else ref_model
        self._reference_pipeline = None  # the ref model wrapped for the pipeline, at its first use
        if self._is_pipeline:
            dpo_pipeline.install_dpo_criterion(self.model, self.dpo_criterion)
            if self.ref_model is not None:
                dpo_pipeline.install_dpo_criterion(self.ref_model, self.dpo_criterion)
        if self.ref_model is not None:
            self._prepare_reference_for_sep()
            self.ref_model.eval()
            for param in self.ref_model.parameters():
                param.stop_gradient = True
        if disable_dropout:
            disable_dropout_in_model(model)
            if self.ref_model is not None:
                disable_dropout_in_model(self.ref_model)
        self.padding_value = padding_value
        if not self.args.label_names:  # the pair keys reach compute_loss (remove_unused_columns keeps labels)
            self.label_names = list(PAIR_LABELS)
        self._pair_sums = defaultdict(dict)  # "train"/"eval" -> metric -> summed tensor over pairs
        self._pair_counts = defaultdict(int)
        self._ref_synced_at = 0

    def _prepare_reference_for_sep(self) -> None:
        """Under sep the reference reads the same segments as the policy: it must carry the axis, and it attends
        with the whole rows' mask and positions as the policy does (``parallelize`` installs that on the policy)."""
        if self.topology.sep_degree == 1:
            return
        if not has_sep_path(self.ref_model):
            raise ValueError("sep_parallel_degree > 1: ref_model has no sep attention; build it with its config's "
                             "sep_parallel_degree set, as the policy")
        install_packed_attention(self.ref_model)

    # ------------------------------------------------------------------ override points
    def _sequence_segment(self, inputs: Dict[str, Any]) -> Dict[str, Any]:
        """This sep rank's segment of every row; ``response_indexs`` (one line per pair, not per position) stays
        whole, and the criterion sums each pair's log-probs over the sep group."""
        if self.topology.sep_degree == 1 or "response_indexs" not in inputs:
            return super()._sequence_segment(inputs)
        rest = {k: v for k, v in inputs.items() if k != "response_indexs"}
        return {**super()._sequence_segment(rest), "response_indexs": inputs["response_indexs"]}

    def count_loss_items(self, inputs: Dict[str, Any]):
        """The pairs of ``inputs``: the DPO loss is a mean over pairs."""
        return int(inputs["response_indexs"].shape[0])

    def compute_loss(self, model, inputs: Dict[str, Any], return_outputs: bool = False):
        """The DPO loss of one micro-batch (reference log-probs first, under ``no_grad``); records the metrics."""
        self._maybe_update_reference()
        loss = self.get_batch_metrics(self.ref_model, model, inputs, train_eval="train" if model.training else "eval")
        return (loss, None) if return_outputs else loss

    def prediction_step(self, model, inputs: Dict[str, Any], prediction_loss_only: bool, ignore_keys=None):
        """``(loss, None, None)``: the DPO loss of the batch (its metrics recorded under ``eval_``)."""
        inputs = self._sequence_segment(self._prepare_inputs(inputs))
        with paddle.no_grad(), self.autocast_smart_context_manager():
            loss = self.get_batch_metrics(self.ref_model, model, inputs, train_eval="eval")
        return loss.detach(), None, None

    def _pipeline_forward_backward(self, micro_batches):
        """The reference's log-probs through the pipeline, then the policy's 1F1B with them as labels."""
        self.model_wrapped.train()
        self._maybe_update_reference()
        batches = [self._prepare_inputs(b) for b in micro_batches]
        references = self._pipeline_reference(batches)
        loss = super()._pipeline_forward_backward([dpo_pipeline.with_reference(b, r)
                                                   for b, r in zip(batches, references)])
        self._record_pipeline(batches, references, "train")
        return loss

    def _pipeline_prediction_step(self, inputs, prediction_loss_only):
        """``(loss, None, None)`` under pipeline parallel: the DPO loss of the batch, the same on every pp rank
        (its metrics recorded under ``eval_``)."""
        batch = self._prepare_inputs(inputs)
        with paddle.no_grad(), self.autocast_smart_context_manager():
            references = self._pipeline_reference([batch])
            loss, _ = pipeline.eval_batch(self.model_wrapped, [dpo_pipeline.with_reference(batch, references[0])])
        self._record_pipeline([batch], references, "eval")
        return loss, None, None

    def log(self, logs: Dict[str, float], **kwargs) -> None:
        """Add the recorded DPO metrics (means over the pairs since the last log) to ``logs``."""
        train_eval = "train" if "loss" in logs else "eval"
        logs.update(self._read_metrics(train_eval))
        super().log(logs, **kwargs)

    # ------------------------------------------------------------------ DPO
    def get_batch_metrics(self, ref_model, model, batch, train_eval="train"):
        """The DPO loss of ``batch`` (prepared tensors) and its metrics recorded for ``train_eval``."""
        inputs = {k: batch[k] for k in MODEL_INPUTS}
        mask = next((k for k in MASK_INPUTS if k in batch), None)
        if mask is not None:
            inputs[mask] = batch[mask]
        labels = (batch["chosen_labels"], batch["rejected_labels"], batch["response_indexs"])
        ref_chosen, ref_rejected = self._reference_logps(ref_model, model, inputs, labels)
        if self.model_with_dpo_criterion:
            outputs = model(**inputs, **dict(zip(PAIR_LABELS, labels)), reference_chosen_logps=ref_chosen,
                            reference_rejected_logps=ref_rejected)
        else:
            outputs = self.dpo_criterion(model(**inputs), labels + (ref_chosen, ref_rejected))
        chosen, rejected, sft_loss, dpo_loss, loss = outputs
        self._record(chosen, rejected, ref_chosen, ref_rejected, dpo_loss, sft_loss, train_eval)
        return loss

    def _reference_logps(self, ref_model, model, inputs, labels):
        if self.dpo_config.reference_free:
            return paddle.zeros([1]), paddle.zeros([1])
        as_reference = contextlib.nullcontext(ref_model) if ref_model is not None else policy_as_reference(model)
        with paddle.no_grad(), as_reference as reference:
            if self.model_with_dpo_criterion:
                chosen, rejected = reference(**inputs, **dict(zip(PAIR_LABELS, labels)))
            else:
                chosen, rejected = self.dpo_criterion(reference(**inputs), labels + (None, None))
        return chosen.detach(), rejected.detach()

    def _pipeline_reference(self, batches):
        """Per micro-batch ``(chosen, rejected)`` reference log-probs (on the last stage; zeros elsewhere)."""
        if self.dpo_config.reference_free:
            return dpo_pipeline.zero_reference(batches)
        last = self.topology.is_last_stage
        with paddle.no_grad(), self.autocast_smart_context_manager():
            if self.ref_model is not None:
                if self._reference_pipeline is None:
                    self._reference_pipeline = fleet.distributed_model(self.ref_model)
                return dpo_pipeline.reference_logps(self._reference_pipeline, batches, self.dpo_criterion, last)
            with policy_as_reference(self.model):
                return dpo_pipeline.reference_logps(self.model_wrapped, batches, self.dpo_criterion, last)

    def _record_pipeline(self, batches, references, train_eval) -> None:
        """The metrics of a pipeline pass: the last stage records its criterion's results, every stage the pairs."""
        records = dpo_pipeline.take_records(self.dpo_criterion)
        if not records:
            self._pair_counts[train_eval] += sum(dpo_pipeline.pair_count(b) for b in batches)
            return
        for (chosen, rejected, sft_loss, dpo_loss), (ref_chosen, ref_rejected) in zip(records, references):
            self._record(chosen, rejected, ref_chosen, ref_rejected, dpo_loss, sft_loss, train_eval)

    def _maybe_update_reference(self) -> None:
        """Copy the policy into the reference every ``ref_model_update_steps`` optimizer steps."""
        every, step = self.dpo_config.ref_model_update_steps, self.state.global_step
        if (every > 0 and step > 0 and step % every == 0 and step != self._ref_synced_at
                and self.ref_model is not None and self.model.training):
            self.ref_model.set_state_dict(self.model.state_dict())
            self._ref_synced_at = step

    def _record(self, chosen, rejected, ref_chosen, ref_rejected, dpo_loss, sft_loss, train_eval) -> None:
        beta, pairs = self.dpo_config.beta, int(chosen.shape[0])
        chosen, rejected = chosen.detach().astype("float32"), rejected.detach().astype("float32")
        chosen_rewards, rejected_rewards = beta * (chosen - ref_chosen), beta * (rejected - ref_rejected)
        sums = {
            "rewards/chosen": chosen_rewards.sum(), "rewards/rejected": rejected_rewards.sum(),
            "rewards/accuracies": (chosen_rewards > rejected_rewards).astype("float32").sum(),
            "rewards/margins": (chosen_rewards - rejected_rewards).sum(),
            "logps/rejected": rejected.sum(), "logps/chosen": chosen.sum(),
            f"{self.dpo_config.loss_type}_loss": dpo_loss.detach().astype("float32") * pairs,
            "sft_loss": sft_loss.detach().astype("float32").reshape([]) * pairs,
        }
        if self.dpo_config.loss_type == "or":
            log_odds = odds_ratio(chosen, rejected)
            sums["log_odds_ratio"] = log_odds.sum()
            sums["log_odds_chosen"] = F.log_sigmoid(log_odds).sum()
        store = self._pair_sums[train_eval]
        for key, value in sums.items():
            value = value.reshape([])
            store[key] = value if key not in store else store[key] + value
        self._pair_counts[train_eval] += pairs

    def _metric_names(self):
        names = ["rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins", "logps/rejected",
                 "logps/chosen", f"{self.dpo_config.loss_type}_loss", "sft_loss"]
        return names + (["log_odds_ratio", "log_odds_chosen"] if self.dpo_config.loss_type == "or" else [])

    def _read_metrics(self, train_eval: str) -> Dict[str, float]:
        """The recorded means over the pairs of every data rank, then forgotten (one all-reduce)."""
        store, pairs = self._pair_sums.pop(train_eval, {}), self._pair_counts.pop(train_eval, 0)
        if not pairs:  # the same on every pp rank: they all count the pairs
            return {}
        keys = sorted(self._metric_names())
        if not store:  # a pipeline stage before the last: the last one's sums arrive with the pp sum below
            pairs, store = 0, {key: paddle.zeros([]) for key in keys}
        totals = paddle.stack([store[k] for k in keys] + [paddle.to_tensor(float(pairs))])
        if self._is_pipeline:
            totals = totals.clone()
            paddle.distributed.all_reduce(totals, group=self.topology.pp_group)
        totals = sum_over_data_group(totals, self.topology).numpy()
        prefix = "eval_" if train_eval == "eval" else ""
        return {f"{prefix}{key}": float(totals[i] / max(totals[-1], 1.0)) for i, key in enumerate(keys)}
