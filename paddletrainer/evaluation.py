"""Evaluation bookkeeping: this rank's prediction-step outputs, combined over the data ranks in dataset order.

The Trainer's ``evaluation_loop`` runs the prediction steps (its override points); :class:`EvalAccumulator`
collects what they return and :meth:`EvalAccumulator.finish` turns it into an ``EvalLoopOutput``:

* loss: ``sum(loss_b · size_b) / sum(size_b)`` over every real batch of every data rank (one gather), so each
  sample counts once whatever the eval set's size (``EvalBatchSampler`` never pads a batch; a rank's
  trailing padding batch, see there and ``IterableDatasetShard`` for streams, is left out);
* predictions and labels: each data rank saw batch k of every block, so gathering interleaves them back,
  (k, rank 0), (k, rank 1), ... — the dataset's order;
* metrics: ``compute_metrics`` on the gathered arrays, keys prefixed with ``metric_key_prefix``.
"""
from __future__ import annotations

from typing import Callable, Dict, List, Optional, Union

import numpy as np
import paddle

from .data import EvalBatchSampler, IterableDatasetShard, gather_in_dataset_order, sum_over_data_ranks
from .trainer_utils import EvalLoopOutput, EvalPrediction

__all__ = ["EvalAccumulator", "real_batches_of", "to_numpy"]


def to_numpy(value):
    """Tensors (or nested tuples/lists of them) as NumPy arrays."""
    if isinstance(value, (tuple, list)):
        return type(value)(to_numpy(v) for v in value)
    if isinstance(value, paddle.Tensor):
        if value.dtype in (paddle.bfloat16, paddle.float16):
            value = value.astype("float32")  # a bf16 tensor's .numpy() is its raw uint16 bits, not its values
        return value.numpy()
    return np.asarray(value)


RealBatches = Union[None, int, Callable[[], Optional[int]]]


def real_batches_of(dataloader) -> RealBatches:
    """How many of the loader's batches hold real samples: an int (``EvalBatchSampler``), a callable read once
    the loop is over (a stream shard, whose count is known only at the stream's end), or None (all of them)."""
    sampler = getattr(dataloader, "batch_sampler", None)
    if isinstance(sampler, EvalBatchSampler):
        return sampler.num_real_batches
    shard = getattr(dataloader, "dataset", None)
    if isinstance(shard, IterableDatasetShard):
        return lambda: shard.num_real_batches
    return None


class EvalAccumulator:
    """Collects ``(loss, logits, labels)`` of this rank's evaluation batches.

    ``real_batches``: batches after the first ``real_batches`` are padding (they ran so that every rank
    runs the same number of forward passes) and are not counted. A callable is asked in :meth:`finish`
    (None from it, or None given: every batch counts).
    """

    def __init__(self, real_batches: RealBatches = None) -> None:
        self.batches = 0
        self.real_batches = real_batches
        # per batch: (loss·size or None, size, logits or None, labels or None)
        self._records: List[tuple] = []

    def add(self, loss, logits, labels, batch_size: int) -> None:
        """One batch: ``loss`` (its mean, or None), ``logits`` and ``labels`` (None when absent)."""
        self.batches += 1
        if isinstance(self.real_batches, int) and self.batches > self.real_batches:
            return
        self._records.append((None if loss is None else float(loss) * batch_size, batch_size,
                              None if logits is None else to_numpy(logits),
                              None if labels is None else to_numpy(labels)))

    def _counted(self) -> List[tuple]:
        real = self.real_batches() if callable(self.real_batches) else self.real_batches
        return self._records if real is None else self._records[:real]

    def finish(self, topology, compute_metrics: Optional[Callable] = None,
               metric_key_prefix: str = "eval") -> EvalLoopOutput:
        """Combine every data rank's batches (collective over the data group: call it on every rank)."""
        records = self._counted()
        losses = [(weighted, size) for weighted, size, _, _ in records if weighted is not None]
        own_preds = [logits for _, _, logits, _ in records if logits is not None]
        own_labels = [labels for _, _, _, labels in records if labels is not None]
        # the batch counts decide, identically on every rank, which gathers run (a rank may hold no batch)
        loss_sum, loss_count, samples, n_preds, n_labels = sum_over_data_ranks(
            [sum((w for w, _ in losses), 0.0), sum(n for _, n in losses), sum(r[1] for r in records), len(own_preds),
             len(own_labels)], topology)
        preds = gather_in_dataset_order(own_preds, topology) if n_preds else None
        labels = gather_in_dataset_order(own_labels, topology) if n_labels else None
        metrics: Dict[str, float] = {}
        if compute_metrics is not None and preds is not None and labels is not None:
            metrics = dict(compute_metrics(EvalPrediction(predictions=preds, label_ids=labels)))
        if loss_count > 0:
            metrics["loss"] = loss_sum / loss_count
        prefix = f"{metric_key_prefix}_"
        metrics = {(k if k.startswith(prefix) else prefix + k): v for k, v in metrics.items()}
        return EvalLoopOutput(predictions=preds, label_ids=labels, metrics=metrics, num_samples=int(samples))
