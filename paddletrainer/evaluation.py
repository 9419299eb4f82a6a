"""Evaluation bookkeeping: this rank's prediction-step outputs, combined over the data ranks in dataset order.

The Trainer's ``evaluation_loop`` runs the prediction steps (its override points); :class:`EvalAccumulator`
collects what they return and :meth:`EvalAccumulator.finish` turns it into an ``EvalLoopOutput``:

* loss: ``sum(loss_b · size_b) / sum(size_b)`` over every batch of every data rank (one all-reduce);
* predictions and labels: each data rank saw batch k of every global batch, so gathering interleaves them
  back, (k, rank 0), (k, rank 1), ..., and trims the wrap-around padding of the last global batch;
* metrics: ``compute_metrics`` on the gathered arrays, keys prefixed with ``metric_key_prefix``.
"""
from __future__ import annotations

from typing import Callable, Dict, List, Optional

import numpy as np
import paddle

from .data import IterableDatasetShard, gather_in_dataset_order, sum_over_data_ranks
from .trainer_utils import EvalLoopOutput, EvalPrediction, has_length

__all__ = ["EvalAccumulator", "num_eval_samples", "to_numpy"]


def to_numpy(value):
    """Tensors (or nested tuples/lists of them) as NumPy arrays."""
    if isinstance(value, (tuple, list)):
        return type(value)(to_numpy(v) for v in value)
    if isinstance(value, paddle.Tensor):
        return value.numpy()
    return np.asarray(value)


def num_eval_samples(dataloader, num_batches: int, batch_size: int, data_world_size: int) -> int:
    """The dataset's length when it has one, else what the data ranks read (a stream has no padding to trim)."""
    dataset = dataloader.dataset
    if has_length(dataset) and not isinstance(dataset, IterableDatasetShard):
        return len(dataset)
    return num_batches * batch_size * data_world_size


class EvalAccumulator:
    """Collects ``(loss, logits, labels)`` of this rank's evaluation batches."""

    def __init__(self) -> None:
        self.batches = 0
        self._loss_sum, self._loss_count = 0.0, 0
        self._preds: List = []
        self._labels: List = []

    def add(self, loss, logits, labels, batch_size: int) -> None:
        """One batch: ``loss`` (its mean, or None), ``logits`` and ``labels`` (None when absent)."""
        self.batches += 1
        if loss is not None:
            self._loss_sum += float(loss) * batch_size
            self._loss_count += batch_size
        if logits is not None:
            self._preds.append(to_numpy(logits))
        if labels is not None:
            self._labels.append(to_numpy(labels))

    def finish(self, topology, num_samples: int, compute_metrics: Optional[Callable] = None,
               metric_key_prefix: str = "eval") -> EvalLoopOutput:
        """Combine every data rank's batches (collective over the data group: call it on every rank)."""
        loss_sum, loss_count = sum_over_data_ranks([self._loss_sum, self._loss_count], topology)
        preds = gather_in_dataset_order(self._preds, topology, num_samples) if self._preds else None
        labels = gather_in_dataset_order(self._labels, topology, num_samples) if self._labels else None
        metrics: Dict[str, float] = {}
        if compute_metrics is not None and preds is not None and labels is not None:
            metrics = dict(compute_metrics(EvalPrediction(predictions=preds, label_ids=labels)))
        if loss_count > 0:
            metrics["loss"] = loss_sum / loss_count
        prefix = f"{metric_key_prefix}_"
        metrics = {(k if k.startswith(prefix) else prefix + k): v for k, v in metrics.items()}
        return EvalLoopOutput(predictions=preds, label_ids=labels, metrics=metrics, num_samples=num_samples)
