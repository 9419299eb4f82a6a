"""Small ``Trainer`` methods that PaddleNLP scripts call or override, kept out of ``trainer.py``.

``Trainer`` inherits them; they only read the Trainer's ``args``, ``topology`` and ``state``.
"""
from __future__ import annotations

from typing import Optional

from . import checkpoint as ckpt
from .data import IterableDatasetShard
from .nested import distributed_concat
from .trainer_utils import has_length

__all__ = ["PaddleNLPHooks"]


class PaddleNLPHooks:
    """``is_world_process_zero``, ``is_local_process_zero``, ``num_examples``, ``_nested_gather``,
    ``_rotate_checkpoints`` with PaddleNLP's signatures."""

    def is_world_process_zero(self) -> bool:
        """Whether this is the global rank 0 process (the one that writes logs and shared files)."""
        return self.topology.rank == 0

    def is_local_process_zero(self) -> bool:
        """Whether this is rank 0 on its node."""
        return self.topology.local_rank == 0

    def num_examples(self, dataloader) -> int:
        """Samples in ``dataloader``'s dataset (a sharded stream: its whole stream's length), else the loader's
        batches × ``per_device_train_batch_size``."""
        dataset = getattr(dataloader, "dataset", None)
        if isinstance(dataset, IterableDatasetShard):
            dataset = dataset.dataset
        return len(dataset) if dataset is not None and has_length(dataset) else \
            len(dataloader) * self.args.per_device_train_batch_size

    def _nested_gather(self, tensors):
        """``tensors`` (nested) from every process, concatenated on axis 0 in rank order (collective when more
        than one process; None stays None)."""
        if tensors is None or self.topology.world_size == 1:
            return tensors
        return distributed_concat(tensors)

    def _rotate_checkpoints(self, use_mtime: bool = False, output_dir: Optional[str] = None) -> None:
        """Delete the oldest complete checkpoints beyond ``save_total_limit`` (never the best nor the newest;
        main process only). Age is the step number in the name, so ``use_mtime`` has no effect."""
        if self.args.save_total_limit and self.args.save_total_limit > 0 and self.args.should_save:
            ckpt.rotate_checkpoints(output_dir or self.args.output_dir, self.args.save_total_limit,
                                    self.state.best_model_checkpoint)
