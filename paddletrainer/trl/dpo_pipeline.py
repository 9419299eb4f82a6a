"""DPO under pipeline parallel, where PaddleNLP runs it: the Pipe model's last stage computes the DPO loss.

The last stage's loss function is a :class:`DPOCriterion` with ``use_infohub=True`` (the criterion a PaddleNLP
``...Pipe`` model picks when its config has ``dpo_config``); :func:`install_dpo_criterion` puts it there and
splits DPO micro-batches as PaddleNLP's ``prepare_pipeline_dpo_inputs_func`` does (model inputs to the first
stage; the pair labels and the reference log-probs to the last). An optimizer step is then two pipeline passes:
the reference's forward over the step's micro-batches (the frozen reference model through the pipeline, the
policy with its LoRA off, or zeros when reference-free), whose log-probs the last stage keeps, then the policy's
1F1B with those log-probs as labels. The other stages hold placeholders of the same shape: they never read labels.
"""
from __future__ import annotations

from typing import Dict, List, Tuple

import paddle

from ..parallel import pipeline
from ..parallel.wrappers import unwrap_model

__all__ = ["install_dpo_criterion", "dpo_pipeline_inputs", "with_reference", "reference_logps",
           "take_records", "zero_reference", "pair_count", "REFERENCE_KEYS"]

FIRST_STAGE_KEYS = ("input_ids", "attention_mask", "attn_mask_startend_row_indices", "position_ids")
PAIR_KEYS = ("chosen_labels", "rejected_labels", "response_indexs")
REFERENCE_KEYS = ("reference_chosen_logps", "reference_rejected_logps")


def dpo_pipeline_inputs(batch: Dict) -> list:
    """``[first-stage inputs, last-stage labels]`` of a DPO micro-batch: the present model inputs, in the order
    PaddleNLP's Pipe embedding takes them, and ``(chosen_labels, rejected_labels, response_indexs,
    reference_chosen_logps, reference_rejected_logps)`` (the reference entries None on the reference's pass)."""
    first = tuple(batch[key] for key in FIRST_STAGE_KEYS if key in batch)
    return [first, tuple(batch.get(key) for key in PAIR_KEYS + REFERENCE_KEYS)]


def install_dpo_criterion(model, criterion) -> None:
    """Make ``criterion`` (``use_infohub=True``) the loss function of the ``PipelineLayer`` in ``model`` and split
    its dict micro-batches with :func:`dpo_pipeline_inputs`. Kept in a list, as the layer keeps its own: a
    criterion set as an attribute would become a sublayer of the model."""
    if not getattr(criterion, "use_infohub", False):
        raise ValueError("under pipeline parallel the DPO criterion is the last stage's loss function: build it "
                         "with DPOCriterion(..., use_infohub=True)")
    layers = unwrap_model(model)
    layers._loss_fn = [criterion]
    layers._prepare_pipeline_inputs_func = dpo_pipeline_inputs


def pair_count(batch: Dict) -> int:
    """The pairs of a prepared micro-batch (one ``response_indexs`` line each)."""
    return int(batch["response_indexs"].shape[0])


def with_reference(batch: Dict, reference: Tuple) -> Dict:
    """``batch`` with its pairs' reference log-probs ``(chosen, rejected)`` under :data:`REFERENCE_KEYS`."""
    return {**batch, **dict(zip(REFERENCE_KEYS, reference))}


def take_records(criterion) -> list:
    """What ``criterion`` recorded since the last call (on the last stage; empty elsewhere), then forgotten."""
    records, criterion.records = criterion.records, []
    return records


def reference_logps(reference_model, batches: List[Dict], criterion, last_stage: bool) -> List[Tuple]:
    """``[(chosen, rejected)]`` per micro-batch: the reference's log-probs of each pair, from one forward pass of
    ``reference_model`` (a ``PipelineParallel`` whose last stage's loss function is ``criterion``) over
    ``batches``. The last stage holds the values; the other stages get zeros of the same shape."""
    take_records(criterion)
    pipeline.eval_batch(reference_model, [with_reference(b, (None, None)) for b in batches])
    if not last_stage:
        return zero_reference(batches)
    records = take_records(criterion)
    if len(records) != len(batches):
        raise RuntimeError(f"the reference pass recorded {len(records)} micro-batches of {len(batches)}")
    return records


def zero_reference(batches: List[Dict]) -> List[Tuple]:
    """Log-probs of 0 for every pair: reference-free DPO's reference, and what a stage before the last holds."""
    return [(paddle.zeros([pair_count(b)]), paddle.zeros([pair_count(b)])) for b in batches]
