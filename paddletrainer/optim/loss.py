"""The loss of one batch from what a model returns (the body of ``Trainer.compute_loss``), and the weights that
make an optimizer step's loss the mean over every trained item of its global batch, whatever the layout.

A model's loss is a mean over its micro-batch's items (PaddleNLP's criteria: the tokens whose label is not the
ignore index). Averaging those means per micro-batch (PaddleNLP's arithmetic, ``loss_average="micro_batch"``)
weighs a micro-batch of 10 trained tokens as much as one of 60. With ``loss_average="global_batch"`` (the
default) micro-batch ``m`` of data rank ``r`` is weighted by its share of the global count ``N``:
``loss_rm · c_rm · A · W / N`` before the usual division by ``A`` (the accumulation steps) and the gradient sync's
mean over the ``W`` data ranks, so the step's loss and gradient are ``Σ_rm loss_rm · c_rm / N``: the mean over
every trained item, as one process holding the whole global batch in one micro-batch computes it.

When every micro-batch holds the same count (pretraining), ``c · A · W`` and ``N`` are the same integer, the
weight is exactly 1.0 and the product changes no bit: the step is the one PaddleNLP's arithmetic gives.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Sequence, Union

import numpy as np
import paddle

from ..parallel.collectives import sum_over_data_group

__all__ = ["IGNORE_INDEX", "LOSS_AVERAGES", "batch_loss", "loss_items", "micro_batch_weights", "scale_micro_batch_loss"]

IGNORE_INDEX = -100  # the label of an untrained position (PaddleNLP's criteria, a model config's ignore_index)
LOSS_AVERAGES = ("global_batch", "micro_batch")  # the values of TrainingArguments.loss_average


def batch_loss(model, inputs: Dict[str, Any], criterion: Optional[Callable], label_names: Sequence[str]):
    """``(loss, outputs)``: the model's own loss (a dict's ``"loss"``, a tuple's first item, or a scalar
    output), or with ``criterion`` ``criterion(logits, labels)`` after popping the label keys from ``inputs``
    (then ``outputs`` is ``(loss, logits)``). Raises unless the loss is a scalar tensor."""
    labels = None
    if criterion is not None:
        present = [n for n in label_names if n in inputs]
        if present:
            labels = inputs.pop(present[0]) if len(present) == 1 else tuple(inputs.pop(n) for n in present)
    outputs = model(**inputs)
    if criterion is not None:
        logits = outputs[0] if isinstance(outputs, (tuple, list)) and len(outputs) == 1 else outputs
        loss = criterion(logits, labels)
        outputs = (loss, logits)
    elif isinstance(outputs, dict):
        if "loss" not in outputs:
            raise ValueError(f"the model returned a dict without 'loss' (keys: {sorted(outputs)}); pass labels or a criterion")
        loss = outputs["loss"]
    elif isinstance(outputs, (tuple, list)):
        loss = outputs[0]
    else:
        loss = outputs
    if not isinstance(loss, paddle.Tensor) or loss.size != 1:
        raise ValueError(
            "the model must return a scalar loss first (or give Trainer a criterion); got "
            f"{type(loss).__name__} of shape {getattr(loss, 'shape', '?')}"
        )
    return loss, outputs


def loss_items(inputs: Dict[str, Any], label_names: Sequence[str], ignore_index: int = IGNORE_INDEX):
    """The items a micro-batch's loss averages over: with one label array, its entries that are not
    ``ignore_index`` (a language model's trained tokens, a classifier's samples); without labels or with several
    label arrays (one loss per sample), the batch size. An int for host arrays, a 0-D int64 tensor counted where
    the labels are for a tensor (no host read)."""
    labels = [inputs.get(name) for name in label_names]
    if len(labels) == 1 and isinstance(labels[0], np.ndarray):
        return int(np.count_nonzero(labels[0] != ignore_index))
    if len(labels) == 1 and isinstance(labels[0], paddle.Tensor):
        return (labels[0] != ignore_index).astype("int64").sum()
    first = next((v for v in inputs.values() if getattr(v, "ndim", 0) >= 1), None)
    if first is None:
        raise ValueError("cannot count the loss items of a batch without labels or any batched array")
    return int(first.shape[0])


def micro_batch_weights(counts: Sequence[Union[int, paddle.Tensor]], accumulation: int, topology) -> List[paddle.Tensor]:
    """The weight of each of this rank's micro-batches in its optimizer step: ``c_m · A · W / N`` (float32, on the
    device), ``N`` the count of the whole global batch — this rank's sum, summed over the data ranks by one
    all-reduce of one number when there are several (collective over the data group; nothing is read on the
    host). Exactly 1.0 for every micro-batch when all counts are equal; 0.0 when the global batch has none."""
    parts = [c.astype("float64").reshape([]) if isinstance(c, paddle.Tensor) else paddle.to_tensor(float(c), dtype="float64")
             for c in counts]
    local = paddle.stack(parts)
    total = sum_over_data_group(local.sum(), topology)
    scale = float(accumulation * topology.data_world_size)
    weights = (local * scale / paddle.maximum(total, paddle.ones_like(total))).astype("float32")
    return list(paddle.unbind(weights))


def scale_micro_batch_loss(loss: paddle.Tensor, weight: Optional[paddle.Tensor], accumulation: int) -> paddle.Tensor:
    """One micro-batch's loss as it enters the backward: times its weight (:func:`micro_batch_weights`; None:
    PaddleNLP's per-micro-batch mean), then divided by the accumulation steps (no op at 1)."""
    if weight is not None:
        loss = loss * weight.astype(loss.dtype)
    return loss / accumulation if accumulation > 1 else loss
