"""The Trainer's data loaders: the layout-free training order, evaluation in dataset order, streams, columns.

A mixin of :class:`~paddletrainer.trainer.Trainer` (like ``trainer_evaluation.TrainerEvaluation``): the methods use the
Trainer's ``args``, ``topology``, ``model``, ``data_collator``, ``label_names`` and datasets. PaddleNLP's override
points live here: ``get_train_dataloader``, ``get_eval_dataloader``, ``get_test_dataloader``,
``_get_train_sampler``, ``_get_eval_sampler``, ``_remove_unused_columns``, ``num_examples``; ``_plan_epochs`` turns the training
sampler into the run's steps and epochs; ``_sequence_segment`` is this sep/cp rank's part of each sequence;
``count_loss_items`` (an override point of ours) the items a batch's loss averages over, from which
``_micro_batch_loss_weights`` makes a step's loss the mean over its global batch (``optim.loss``). The samplers
themselves are in ``data.sampling``.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Dict, Optional, Tuple

import paddle

from . import checks
from .data.collate import ColumnFilter, forward_argument_names, remove_unused_columns
from .data.loader import DataLoader, IterableDatasetShard
from .data.sampling import EvalBatchSampler, GlobalBatchSampler, WholeStepBatchSampler
from .optim.loss import IGNORE_INDEX, loss_items, micro_batch_weights
from .parallel.context import shard_context
from .parallel.segment import shard_sequence
from .trainer_utils import has_length

__all__ = ["TrainerData"]


class TrainerData:
    """The data loaders of the Trainer (see the module docstring)."""

    def _collator_for(self, model) -> Callable:
        """The data collator; with ``remove_unused_columns`` its *output* keeps only the model's forward arguments
        and the labels. The collator itself gets the dataset's samples untouched (PaddleNLP's contract)."""
        allowed = forward_argument_names(model) if self.args.remove_unused_columns else None
        return self.data_collator if allowed is None else ColumnFilter(self.data_collator, allowed, self.label_names)

    def _loader(self, dataset, batch_sampler=None, batch_size=None) -> paddle.io.DataLoader:
        return DataLoader(dataset, batch_sampler=batch_sampler, batch_size=batch_size or 1, return_list=True,
                          collate_fn=self._collator_for(self.model), num_workers=self.args.dataloader_num_workers)

    def _remove_unused_columns(self, dataset, description: Optional[str] = None):
        """PaddleNLP's hook: a Hugging Face ``datasets.Dataset`` without the columns the model's forward does not
        take (with ``remove_unused_columns``); any other dataset unchanged."""
        allowed = forward_argument_names(self.model) if self.args.remove_unused_columns else None
        return remove_unused_columns(dataset, allowed, self.label_names, description or "training")

    def _get_train_sampler(self) -> Optional[paddle.io.BatchSampler]:
        """The training batch sampler: the layout-free global order (see ``paddletrainer.data``), this rank's share
        of each micro-batch; None for a dataset without length. A subclass may return its own batch sampler
        (PaddleNLP's hook); the loop then follows that sampler's order, cut to whole optimizer steps."""
        if self.train_dataset is None or not has_length(self.train_dataset):
            return None
        args, topo = self.args, self.topology
        return GlobalBatchSampler(len(self.train_dataset), args.per_device_train_batch_size, topo.data_rank,
                                  topo.data_world_size, seed=args.seed if args.data_seed is None else args.data_seed,
                                  shuffle=True,
                                  drop_last=args.dataloader_drop_last, step_span=args.global_batch_size)

    def get_train_dataloader(self) -> paddle.io.DataLoader:
        """This rank's training batches, from ``_get_train_sampler`` (streams: consecutive blocks per data rank)."""
        if self.train_dataset is None:
            raise ValueError("Trainer.train needs a train_dataset")
        checks.check_dataset(self.train_dataset, "train_dataset")
        args, topo = self.args, self.topology
        dataset = self._remove_unused_columns(self.train_dataset, "training")
        if not has_length(dataset):
            if args.max_steps <= 0:
                raise ValueError("an IterableDataset has no length: set max_steps > 0")
            shard = IterableDatasetShard(dataset, args.per_device_train_batch_size, drop_last=True,
                                         num_processes=topo.data_world_size, process_index=topo.data_rank)
            return self._loader(shard, batch_size=args.per_device_train_batch_size)
        sampler = self._get_train_sampler()
        if not isinstance(sampler, GlobalBatchSampler):
            sampler = WholeStepBatchSampler(sampler, args.per_device_train_batch_size, topo.data_world_size,
                                            args.global_batch_size)
        return self._loader(dataset, batch_sampler=sampler)

    def _plan_epochs(self, sampler: Optional[GlobalBatchSampler]) -> Tuple[Optional[int], int, int]:
        """``(steps_per_epoch, max_steps, num_epochs)``: ``max_steps`` when set (epochs enough to reach it), else
        ``num_train_epochs`` of the sampler's whole steps. ``steps_per_epoch`` is None for a stream (no sampler of
        ours), which needs ``max_steps``."""
        args = self.args
        steps_per_epoch = sampler.samples_per_epoch() // sampler.step_span if sampler else None
        if args.max_steps > 0:
            max_steps = args.max_steps
            num_epochs = math.ceil(max_steps / steps_per_epoch) if steps_per_epoch else 1 << 31
        else:
            if steps_per_epoch is None:
                raise ValueError("an IterableDataset needs max_steps > 0")
            num_epochs = math.ceil(args.num_train_epochs)
            max_steps = math.ceil(args.num_train_epochs * steps_per_epoch)
        if steps_per_epoch == 0:
            raise ValueError("the train dataset is smaller than one global batch with dataloader_drop_last=True")
        return steps_per_epoch, max_steps, num_epochs

    def num_examples(self, dataloader) -> int:
        """Samples in ``dataloader``'s dataset (a sharded stream: its whole stream's length), else the loader's
        batches × ``per_device_train_batch_size``."""
        dataset = getattr(dataloader, "dataset", None)
        if isinstance(dataset, IterableDatasetShard):
            dataset = dataset.dataset
        return len(dataset) if dataset is not None and has_length(dataset) else \
            len(dataloader) * self.args.per_device_train_batch_size

    def _get_eval_sampler(self, eval_dataset) -> Optional[paddle.io.BatchSampler]:
        """The evaluation/prediction batch sampler (PaddleNLP's hook): every sample once, gathered back in dataset
        order. A subclass's own sampler is used as is (its gathered predictions follow its order)."""
        return EvalBatchSampler(
            len(eval_dataset), self.args.per_device_eval_batch_size, self.topology.data_rank,
            self.topology.data_world_size)

    def _eval_loader(self, dataset, description: str = "evaluation") -> paddle.io.DataLoader:
        dataset = self._remove_unused_columns(dataset, description)
        if not has_length(dataset):
            shard = IterableDatasetShard(dataset, self.args.per_device_eval_batch_size,
                                         num_processes=self.topology.data_world_size,
                                         process_index=self.topology.data_rank, keep_last=True)
            return self._loader(shard, batch_size=self.args.per_device_eval_batch_size)
        return self._loader(dataset, batch_sampler=self._get_eval_sampler(dataset))

    def get_eval_dataloader(self, eval_dataset=None) -> paddle.io.DataLoader:
        dataset = eval_dataset if eval_dataset is not None else self.eval_dataset
        if dataset is None:
            raise ValueError("Trainer.evaluate needs an eval_dataset")
        checks.check_dataset(dataset, "eval_dataset")
        return self._eval_loader(dataset)

    def get_test_dataloader(self, test_dataset) -> paddle.io.DataLoader:
        return self._eval_loader(test_dataset, "test")

    def _sequence_segment(self, inputs: Dict[str, Any]) -> Dict[str, Any]:
        """Under sep, this rank's segment of every sequence (``parallel.segment.shard_sequence``); under cp its
        head and tail chunks (``parallel.context.shard_context``): the batch's samples were chosen by the
        layout-free order, the same on every sep/cp rank, and counted whole for tokens/s."""
        if self.topology.cp_degree > 1:
            return shard_context(inputs, self.topology.cp_degree, self.topology.cp_rank)
        return shard_sequence(inputs, self.topology.sep_degree, self.topology.sep_rank)

    def count_loss_items(self, inputs: Dict[str, Any]):
        """How many items ``compute_loss`` averages over in ``inputs`` (a whole micro-batch, before any sep/cp
        cut): the labels that are not the ignore index (the model config's ``ignore_index``, else -100), or the
        batch size for a loss per sample (no labels, several label arrays). An int, or a 0-D tensor counted on the
        labels' device. Override it when your ``compute_loss`` averages over something else (e.g. a ``loss_mask``);
        ``loss_average="global_batch"`` then weighs each micro-batch by its share of the global batch's count."""
        ignore_index = getattr(getattr(self.model, "config", None), "ignore_index", IGNORE_INDEX)
        return loss_items(inputs, self.label_names, ignore_index if isinstance(ignore_index, int) else IGNORE_INDEX)

    def _micro_batch_loss_weights(self, micro_batches) -> Optional[list]:
        """Each micro-batch's weight in the step's loss (``optim.loss.micro_batch_weights``: one all-reduce of
        one number over the data ranks, nothing read on the host); None under ``loss_average="micro_batch"``."""
        if self.args.loss_average == "micro_batch":
            return None
        counts = [self.count_loss_items(batch) for batch in micro_batches]
        return micro_batch_weights(counts, len(micro_batches), self.topology)
