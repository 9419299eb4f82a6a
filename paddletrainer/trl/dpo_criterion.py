"""The DPO criterion (PaddleNLP's ``DPOCriterion``: name, constructor and call convention): the summed
log-probabilities of each pair's chosen and rejected response, packed in one row, then the preference loss.

A row holds ``prompt · chosen · rejected`` (``preference_data``); ``response_indexs`` has one line per pair,
``[row, chosen_start, rejected_start, end]``. ``chosen_labels``/``rejected_labels`` carry the next token at each
response position and 0 elsewhere. Called with reference log-probs of ``None`` it returns the reference
log-probs; otherwise ``(policy_chosen_logps, policy_rejected_logps, sft_loss, dpo_loss, loss)``.
With ``use_infohub=True`` (the loss function of a Pipe model's last stage, which must return one loss) it keeps
those results in its ``records`` instead (PaddleNLP keeps them in its global ``infohub``) and returns the loss, or
zeros on a reference pass; ``trl.dpo_pipeline`` reads them.
The preference loss is a mean over the micro-batch's pairs (``DPOTrainer.count_loss_items`` counts pairs).
Under sep (``sequence_group`` set) logits and labels hold one segment of each row: the per-token log-probs are
gathered into whole rows (differentiably) before the pairs' sums, so every sep rank computes the whole loss.
"""
from __future__ import annotations

import copy

import paddle
import paddle.distributed as dist
import paddle.nn as nn
import paddle.nn.functional as F

from ..parallel.segment import GatherSequence

__all__ = ["DPOCriterion", "DPO_LOSS_TYPES", "REFERENCE_FREE_LOSS_TYPES", "AVERAGED_LOSS_TYPES"]

DPO_LOSS_TYPES = ("sigmoid", "hinge", "ipo", "kto_pair", "sppo_hard", "nca_pair", "dpop", "or", "simpo")
REFERENCE_FREE_LOSS_TYPES = ("sigmoid", "hinge", "ipo", "or", "simpo")
AVERAGED_LOSS_TYPES = ("ipo", "or", "simpo")  # these compare per-token means of the responses, not sums


def _logsig(x):
    return F.log_sigmoid(x)


def _smoothed(z, smoothing):
    """``-log σ(z)`` with conservative label smoothing (the preference flipped with probability ``smoothing``)."""
    return -_logsig(z) * (1 - smoothing) - _logsig(-z) * smoothing


def preference_loss(cfg, chosen, rejected, ref_chosen, ref_rejected):
    """The per-pair loss of ``cfg.loss_type`` (a 1-D tensor; kto_pair gives two entries per pair)."""
    beta = cfg.beta
    margin = (chosen - rejected) - (ref_chosen - ref_rejected)
    kind = cfg.loss_type
    if kind == "sigmoid":
        return _smoothed(beta * margin, cfg.label_smoothing)
    if kind == "simpo":
        return _smoothed(beta * (margin - cfg.simpo_gamma / beta), cfg.label_smoothing)
    if kind == "hinge":
        return F.relu(1 - beta * margin)
    if kind == "ipo":
        return (margin - 1 / (2 * beta)) ** 2
    if kind == "dpop":
        return -_logsig(beta * margin) + cfg.dpop_lambda * paddle.clip(ref_chosen - chosen, min=0)
    chosen_ratio, rejected_ratio = chosen - ref_chosen, rejected - ref_rejected
    if kind == "kto_pair":  # each half's KL term is estimated on the other half (the KTO report)
        chosen_kl, rejected_kl = chosen_ratio.mean().clip(min=0), rejected_ratio.mean().clip(min=0)
        return paddle.concat([1 - F.sigmoid(beta * (chosen_ratio - rejected_kl)),
                              1 - F.sigmoid(beta * (chosen_kl - rejected_ratio))], 0)
    if kind == "sppo_hard":
        return (chosen_ratio - 0.5 / beta) ** 2 + (rejected_ratio + 0.5 / beta) ** 2
    if kind == "nca_pair":
        return (-_logsig(beta * chosen_ratio) - 0.5 * _logsig(-beta * chosen_ratio)
                - 0.5 * _logsig(-beta * rejected_ratio))
    if kind == "or":
        return -_logsig(odds_ratio(chosen, rejected))
    raise ValueError(f"DPOConfig.loss_type={kind!r} is unknown; valid: {', '.join(DPO_LOSS_TYPES)}")


def odds_ratio(chosen, rejected):
    """ORPO's log odds ratio of the chosen over the rejected response (from mean log-probs)."""
    return (chosen - rejected) - (paddle.log1p(-paddle.exp(chosen)) - paddle.log1p(-paddle.exp(rejected)))


class DPOCriterion(nn.Layer):
    """DPO loss on a causal LM's logits. ``config`` is the model config (``tensor_parallel_output`` and
    ``tensor_parallel_degree`` choose the vocabulary-parallel cross-entropy); ``dpo_config`` a
    :class:`~paddletrainer.trl.DPOConfig` (else ``config.dpo_config``); ``ignore_eos_token`` leaves the first
    position of the rejected response out of its log-prob (PaddleNLP's ``run_dpo.py`` sets it)."""

    def __init__(self, config, dpo_config=None, use_infohub=False, ignore_eos_token=False):
        super().__init__()
        if dpo_config is None and getattr(config, "dpo_config", None) is None:
            raise ValueError("DPOCriterion needs dpo_config (or a model config with dpo_config)")
        self.config = config
        self.dpo_config = dpo_config if dpo_config is not None else copy.deepcopy(config.dpo_config)
        for fused in ("use_fused_head_and_loss_fn", "use_sparse_head_and_loss_fn"):
            if getattr(config, fused, False):
                raise ValueError(f"DPOCriterion takes logits: set the model config's {fused}=False")
        if getattr(config, "tensor_parallel_output", False) and getattr(config, "tensor_parallel_degree", 1) > 1:
            from paddle.distributed.fleet.meta_parallel import ParallelCrossEntropy

            self.logprobs = ParallelCrossEntropy()
        else:
            self.logprobs = nn.CrossEntropyLoss(reduction="none")
        self.use_infohub = use_infohub
        self.records = []  # with use_infohub: one tuple per call, in call order (micro-batch order)
        self.ignore_eos_token = ignore_eos_token
        self.sequence_group = None  # the sep group when logits and labels hold one segment of each sequence

    def _whole_sequences(self, token_logps, chosen_labels):
        """Under sep, the per-token log-probs of every segment (differentiable) and the chosen-token count of the
        whole sequences: each pair's sums cross the segments."""
        chosen_tokens = (chosen_labels != 0).sum().astype("float32")
        if self.sequence_group is None:
            return token_logps, chosen_tokens
        chosen_tokens = chosen_tokens.clone()
        dist.all_reduce(chosen_tokens, group=self.sequence_group)
        return GatherSequence.apply(token_logps, self.sequence_group), chosen_tokens

    def dpo_loss(self, policy_chosen_logps, policy_rejected_logps, reference_chosen_logps, reference_rejected_logps):
        """The micro-batch's preference loss: the mean over its pairs, times ``pref_loss_ratio``."""
        loss = preference_loss(self.dpo_config, policy_chosen_logps, policy_rejected_logps,
                               reference_chosen_logps, reference_rejected_logps)
        return loss.mean() * self.dpo_config.pref_loss_ratio

    def dpo_logps(self, logits, chosen_labels, rejected_labels, response_indexs, average_log_prob=False):
        """``(chosen_logps, rejected_logps, sft_loss)``: each pair's summed (or, with ``average_log_prob``,
        per-token mean) log-prob of its responses, and the chosen responses' token-mean NLL × ``sft_loss_ratio``."""
        if isinstance(logits, (tuple, list)):
            logits = logits[0]
        logits = getattr(logits, "logits", logits).astype("float32")
        labels = chosen_labels + rejected_labels  # the two responses occupy disjoint positions
        if logits.shape[:-1] != labels.shape:
            raise ValueError(f"logits {logits.shape} and labels {labels.shape} differ in batch or sequence length")
        token_logps = -self.logprobs(logits, labels.unsqueeze(2)).squeeze(2)  # [batch, seq]
        token_logps, chosen_tokens = self._whole_sequences(token_logps, chosen_labels)
        if len(response_indexs.shape) == 3:
            response_indexs = response_indexs[0]
        skip = 1 if self.ignore_eos_token else 0
        spans = response_indexs.numpy().tolist()  # a handful of ints per pair: the slicing bounds
        chosen = paddle.stack([token_logps[row, start:mid].sum() for row, start, mid, _ in spans])
        rejected = paddle.stack([token_logps[row, mid + skip:end].sum() for row, _, mid, end in spans])
        sft_loss = -chosen.sum() / chosen_tokens
        if average_log_prob:
            chosen = chosen / paddle.to_tensor([mid - start - skip for _, start, mid, _ in spans], dtype="float32")
            rejected = rejected / paddle.to_tensor([end - mid for _, _, mid, end in spans], dtype="float32")
        return chosen, rejected, sft_loss * self.dpo_config.sft_loss_ratio

    def forward(self, logits, labels):
        """``labels = (chosen_labels, rejected_labels, response_indexs, ref_chosen_logps, ref_rejected_logps)``."""
        chosen_labels, rejected_labels, response_indexs, ref_chosen, ref_rejected = labels
        average = self.dpo_config.loss_type in AVERAGED_LOSS_TYPES
        chosen, rejected, sft_loss = self.dpo_logps(logits, chosen_labels, rejected_labels, response_indexs, average)
        if ref_chosen is None or ref_rejected is None:
            if self.use_infohub:
                self.records.append((chosen.detach(), rejected.detach()))
                return paddle.zeros([1])
            return chosen, rejected
        dpo_loss = self.dpo_loss(chosen, rejected, ref_chosen, ref_rejected)
        if self.use_infohub:
            self.records.append((chosen.detach(), rejected.detach(), sft_loss.detach(), dpo_loss.detach()))
            return dpo_loss + sft_loss
        return chosen, rejected, sft_loss, dpo_loss, dpo_loss + sft_loss
