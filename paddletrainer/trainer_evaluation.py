"""Evaluation bookkeeping: this rank's prediction-step outputs, combined over the data ranks in dataset order.

The Trainer's ``evaluation_loop`` runs the prediction steps (its override points); :class:`EvalAccumulator`
collects what they return and :meth:`EvalAccumulator.finish` turns it into an ``EvalLoopOutput``:

* loss: ``sum(loss_b · n_b) / sum(n_b)`` over every real batch of every data rank (one gather), ``n_b`` the
  items its loss averages over (``Trainer.count_loss_items``: its trained tokens), so the eval loss is the mean
  over every trained token of the eval set, as the training loss is over a global batch (``optim.loss``); with
  ``loss_average="micro_batch"`` ``n_b`` is the batch size (PaddleNLP's mean of batch means, each sample
  weighing its batch's mean). Each sample counts once whatever the eval set's size (``EvalBatchSampler`` never
  pads a batch; a rank's trailing padding batch, see there and ``IterableDatasetShard`` for streams, is left out);
* predictions and labels: each data rank saw batch k of every block, so gathering interleaves them back,
  (k, rank 0), (k, rank 1), ... — the dataset's order;
* metrics: ``compute_metrics`` on the gathered arrays, keys prefixed with ``metric_key_prefix``.
"""
from __future__ import annotations

import logging
import time
from typing import Any, Callable, Dict, List, Optional, Union

import paddle

from .data.gather import gather_in_dataset_order, sum_over_data_ranks
from .data.loader import IterableDatasetShard
from .data.nested import distributed_concat, nested_numpify
from .data.sampling import EvalBatchSampler
from .parallel import pipeline
from .parallel.context import gather_context
from .parallel.packed_attention import install_packed_attention
from .parallel.segment import gather_sequence
from .trainer_utils import EvalLoopOutput, EvalPrediction, PredictionOutput, speed_metrics

__all__ = ["EvalAccumulator", "TrainerEvaluation", "real_batches_of", "labels_of", "predict_batch",
           "run_loop"]

logger = logging.getLogger("paddletrainer.trainer")  # the Trainer's logger: one place to configure or silence


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
        # per batch: (loss·items or None, items, size, logits or None, labels or None)
        self._records: List[tuple] = []

    def add(self, loss, logits, labels, batch_size: int, loss_items: Optional[float] = None) -> None:
        """One batch: ``loss`` (its mean over ``loss_items`` items, default ``batch_size``; or None), ``logits``
        and ``labels`` (None when absent)."""
        self.batches += 1
        if isinstance(self.real_batches, int) and self.batches > self.real_batches:
            return
        items = batch_size if loss_items is None else loss_items
        self._records.append((None if loss is None else float(loss) * items, items, batch_size,
                              None if logits is None else nested_numpify(logits),
                              None if labels is None else nested_numpify(labels)))

    def _counted(self) -> List[tuple]:
        real = self.real_batches() if callable(self.real_batches) else self.real_batches
        return self._records if real is None else self._records[:real]

    def finish(self, topology, compute_metrics: Optional[Callable] = None,
               metric_key_prefix: str = "eval") -> EvalLoopOutput:
        """Combine every data rank's batches (collective over the data group: call it on every rank)."""
        records = self._counted()
        losses = [(weighted, items) for weighted, items, _, _, _ in records if weighted is not None]
        own_preds = [logits for _, _, _, logits, _ in records if logits is not None]
        own_labels = [labels for _, _, _, _, labels in records if labels is not None]
        # the batch counts decide, identically on every rank, which gathers run (a rank may hold no batch)
        loss_sum, loss_count, samples, n_preds, n_labels = sum_over_data_ranks(
            [sum((w for w, _ in losses), 0.0), sum(n for _, n in losses), sum(r[2] for r in records), len(own_preds),
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


def labels_of(inputs: Dict, label_names: List[str]):
    """The batch's label tensor (a tuple for several ``label_names``), or None if any is missing."""
    if not all(inputs.get(k) is not None for k in label_names):
        return None
    labels = [inputs[k] for k in label_names]
    return labels[0] if len(labels) == 1 else tuple(labels)


def predict_batch(model, inputs: Dict, *, compute_loss: Callable, label_names: List[str], autocast,
                  prediction_loss_only: bool, ignore_keys: Optional[List[str]] = None):
    """The body of ``Trainer.prediction_step``: ``(loss, logits, labels)`` of one prepared batch under
    ``autocast`` (a context manager); loss is None without labels, logits None if loss only. With labels the
    loss comes from ``compute_loss(model, inputs, return_outputs=True)`` (the Trainer's override point)."""
    labels = labels_of(inputs, label_names)
    with paddle.no_grad(), autocast:
        if labels is not None:
            loss, outputs = compute_loss(model, dict(inputs), return_outputs=True)
            loss = loss.detach()
            logits = outputs[1:] if isinstance(outputs, (tuple, list)) else outputs
            if isinstance(outputs, dict):
                logits = tuple(v for k, v in outputs.items() if k not in (ignore_keys or []) + ["loss"])
        else:
            loss = None
            outputs = model(**{k: v for k, v in inputs.items() if k not in label_names})
            logits = outputs
            if isinstance(outputs, dict):
                logits = tuple(v for k, v in outputs.items() if k not in (ignore_keys or []))
    if prediction_loss_only:
        return loss, None, None
    if isinstance(logits, (tuple, list)) and len(logits) == 1:
        logits = logits[0]
    return loss, logits, labels


def run_loop(dataloader, step: Callable, *, preprocess_logits: Optional[Callable], after_step: Callable,
             max_eval_iters: Optional[int], topology, compute_metrics: Optional[Callable],
             metric_key_prefix: str, loss_items: Optional[Callable] = None) -> EvalLoopOutput:
    """The body of ``Trainer.evaluation_loop``: ``step(inputs) -> (loss, logits, labels)`` per batch (at most
    ``max_eval_iters`` batches when > 0), ``after_step()`` after each (the ``on_prediction_step`` event), then
    the data ranks combined in dataset order (:meth:`EvalAccumulator.finish`). ``loss_items(inputs)``: the items
    a batch's loss averages over (None: its batch size)."""
    collected = EvalAccumulator(real_batches_of(dataloader))
    for inputs in dataloader:
        bs = int(next(iter(inputs.values())).shape[0])
        loss, logits, batch_labels = step(inputs)
        if logits is not None and preprocess_logits is not None:
            logits = preprocess_logits(logits, batch_labels)
        items = None if loss is None or loss_items is None else loss_items(inputs)
        collected.add(loss, logits, batch_labels, bs, items)
        after_step()
        if max_eval_iters is not None and 0 < max_eval_iters <= collected.batches:
            break
    return collected.finish(topology, compute_metrics, metric_key_prefix)


class TrainerEvaluation:
    """The Trainer's evaluation override points (PaddleNLP's names and signatures): ``evaluate``, ``predict``,
    ``evaluation_loop``, ``prediction_step``, ``_nested_gather``, and the evaluation schedule rule
    ``_apply_minimum_eval_times``. ``Trainer`` inherits them; they use its ``args``, ``topology``, ``state``,
    ``control``, ``callback_handler``, models and data loaders, and the functions above."""

    def evaluate(self, eval_dataset=None, ignore_keys: Optional[List[str]] = None, metric_key_prefix: str = "eval") -> Dict[str, float]:
        """Loss (and ``compute_metrics``) over the eval set; logs the metrics and fires ``on_evaluate``."""
        self._wrap_for_inference()
        dataloader = self.get_eval_dataloader(eval_dataset)
        start = time.time()
        self._memory.start("eval")
        with self._memory.stage_ended_on_error("eval"):
            output = self.evaluation_loop(
                dataloader,
                description="Evaluation",
                prediction_loss_only=True if self.compute_metrics is None else None,
                ignore_keys=ignore_keys,
                metric_key_prefix=metric_key_prefix,
                max_eval_iters=self.args.max_evaluate_steps,
            )
        output.metrics.update(speed_metrics(metric_key_prefix, start, num_samples=output.num_samples))
        output.metrics.update(self._memory.stop("eval"))
        self.log(output.metrics)
        self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control, metrics=output.metrics)
        return output.metrics

    def predict(self, test_dataset, ignore_keys: Optional[List[str]] = None, metric_key_prefix: str = "test") -> PredictionOutput:
        """Predictions (and metrics when labels are present) for ``test_dataset``."""
        self._wrap_for_inference()
        dataloader = self.get_test_dataloader(test_dataset)
        start = time.time()
        self._memory.start("test")
        with self._memory.stage_ended_on_error("test"):
            output = self.evaluation_loop(
                dataloader, description="Prediction", ignore_keys=ignore_keys, metric_key_prefix=metric_key_prefix
            )
        output.metrics.update(speed_metrics(metric_key_prefix, start, num_samples=output.num_samples))
        output.metrics.update(self._memory.stop("test"))
        self.control = self.callback_handler.on_predict(self.args, self.state, self.control, metrics=output.metrics)
        return PredictionOutput(predictions=output.predictions, label_ids=output.label_ids, metrics=output.metrics)

    def _wrap_for_inference(self):
        """Evaluation before/without training still needs the parallel wrappers (an optimizer is not needed), and
        in one process the packed rows' attention that ``parallelize`` installs for training."""
        install_packed_attention(self.model)
        if not self._wrapped and (self.topology.world_size > 1):
            if self.optimizer is None:
                self.create_optimizer_and_scheduler(num_training_steps=max(self.args.max_steps, 1))
            self._wrap_model_and_optimizer()

    def prediction_step(self, model, inputs: Dict[str, Any], prediction_loss_only: bool, ignore_keys: Optional[List[str]] = None):
        """``(loss, logits, labels)`` of one batch; loss is None without labels, logits None if loss only
        (:func:`paddletrainer.trainer_evaluation.predict_batch`; the loss comes from ``compute_loss``)."""
        prepared = self._prepare_inputs(inputs)
        loss, logits, labels = predict_batch(
            model, self._sequence_segment(prepared), compute_loss=self.compute_loss, label_names=self.label_names,
            autocast=self.autocast_smart_context_manager(), prediction_loss_only=prediction_loss_only,
            ignore_keys=ignore_keys)
        if self.topology.sep_degree * self.topology.cp_degree > 1 and logits is not None:
            logits, labels = self._whole_sequences(logits), labels_of(prepared, self.label_names)
        return loss, logits, labels

    def _whole_sequences(self, logits):
        """The logits of this rank's part of each sequence (``_sequence_segment``'s cut) gathered back into whole
        sequences, as one process predicts them: sep's segments in order, cp's chunks put back in sequence order."""
        if self.topology.cp_degree > 1:
            return gather_context(logits, self.topology.cp_group)
        if self.topology.sep_degree > 1:
            return gather_sequence(logits, self.topology.sep_group)
        return logits

    def _pipeline_prediction_step(self, inputs, prediction_loss_only):
        """Under pipeline parallel: ``(loss, logits, labels)`` of one batch, the same on every pp rank.

        The last stage computes logits and loss; both are broadcast over the pipeline group, so
        ``compute_metrics`` sees predictions as without pipeline parallel.
        """
        labels = labels_of(inputs, self.label_names)
        with self.autocast_smart_context_manager():
            batch = self._sequence_segment(self._prepare_inputs(inputs))
            loss, logits = pipeline.eval_batch(self.model_wrapped, [batch], return_logits=not prediction_loss_only)
        if prediction_loss_only:
            return loss, None, None
        return loss, self._whole_sequences(logits), labels

    def evaluation_loop(
        self,
        dataloader,
        description: str = "Evaluation",
        prediction_loss_only: Optional[bool] = None,
        ignore_keys: Optional[List[str]] = None,
        metric_key_prefix: str = "eval",
        max_eval_iters: int = -1,
    ) -> EvalLoopOutput:
        """Run ``prediction_step`` over this rank's share, then combine the data ranks in dataset order
        (see :mod:`paddletrainer.trainer_evaluation`)."""
        if prediction_loss_only is None:
            prediction_loss_only = self.args.prediction_loss_only
        model = self.model_wrapped
        model.eval()
        self.callback_handler.eval_dataloader = dataloader

        def step(inputs):
            if self._is_pipeline:
                return self._pipeline_prediction_step(inputs, prediction_loss_only)
            return self.prediction_step(model, inputs, prediction_loss_only, ignore_keys)

        def after_step():
            self.control = self.callback_handler.on_prediction_step(self.args, self.state, self.control)

        token_mean = self.args.loss_average == "global_batch"  # else PaddleNLP's: each batch's mean per sample
        return run_loop(dataloader, step, preprocess_logits=self.preprocess_logits_for_metrics, after_step=after_step,
                        max_eval_iters=max_eval_iters, topology=self.topology, compute_metrics=self.compute_metrics,
                        metric_key_prefix=metric_key_prefix,
                        loss_items=(lambda inputs: float(self.count_loss_items(inputs))) if token_mean else None)

    def _nested_gather(self, tensors):
        """``tensors`` (nested) from every process, concatenated on axis 0 in rank order (collective when more
        than one process; None stays None)."""
        if tensors is None or self.topology.world_size == 1:
            return tensors
        return distributed_concat(tensors)

    def _apply_minimum_eval_times(self, max_steps: int) -> None:
        """PaddleNLP's ``minimum_eval_times``: lower ``eval_steps`` (to a multiple of 10, at least 10) so that a
        run of ``max_steps`` evaluates at least that many times."""
        args = self.args
        if not args.minimum_eval_times or args.minimum_eval_times <= 0 or not args.eval_steps:
            return
        if max_steps // args.eval_steps < args.minimum_eval_times:
            every = max_steps / args.minimum_eval_times
            args.eval_steps = max(int(every - every % 10), 10)
            logger.info("minimum_eval_times=%d: eval_steps set to %d", args.minimum_eval_times, args.eval_steps)
