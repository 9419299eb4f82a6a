"""The Trainer's checkpoints: which one to resume from, saving ``checkpoint-<step>``, loading one back into the
run (weights, optimizer, schedule, scaler, RNG, state and data position) and the best-model bookkeeping.

A mixin of :class:`~paddletrainer.trainer.Trainer` (like ``evaluation.TrainerEvaluation``): the methods use the
Trainer's ``args``, ``state``, ``model``, ``optimizer``, ``lr_scheduler``, ``scaler``, ``topology`` and its
``_checkpointer`` (the save in flight). The format, the writers and the resharding load live in ``checkpoint``.
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
from typing import Callable, Dict, Iterator, Optional

from . import checkpoint as ckpt
from .callbacks import TrainerState
from .checkpoint.paddlenlp_interop import load_paddlenlp_checkpoint
from .data import resume_position
from .output_lock import OutputDirLock, OutputDirLockedError
from .parallel.collectives import all_gather_object
from .trainer_utils import checkpoint_dir_name, is_paddlenlp_checkpoint, resolve_resume_checkpoint

__all__ = ["TrainerCheckpoints"]

logger = logging.getLogger("paddletrainer.trainer")  # the Trainer's logger: one place to configure or silence


class TrainerCheckpoints:
    """Resume, save and load for the Trainer (see the module docstring)."""

    def _resolve_resume(self, resume_from_checkpoint) -> Optional[str]:
        """The checkpoint to resume from (see ``resolve_resume_checkpoint``: a path, true or auto), or None.

        Half-written ``checkpoint-N.tmp-*`` dirs of a crashed attempt are never resumed; rank 0 deletes those of
        this run's ``output_dir`` here (no save of this job is in flight when train() starts). A resume path
        elsewhere is left alone: another job may be writing beside it.
        """
        value = resume_from_checkpoint if resume_from_checkpoint is not None else self.args.resume_from_checkpoint
        path = resolve_resume_checkpoint(value, self.args.output_dir)
        if self.state.is_world_process_zero and os.path.isdir(self.args.output_dir):
            ckpt.remove_stale_tmp_dirs(self.args.output_dir)
        return path

    @contextlib.contextmanager
    def _output_dir_lock(self) -> Iterator[None]:
        """Hold ``output_dir``'s lock (:mod:`~paddletrainer.output_lock`) for the block, on global rank 0 — the rank
        that publishes, rotates and removes tmp dirs. Every rank learns rank 0's outcome (one gather), so a run
        that finds the directory in use fails on every rank alike; released when the block ends, raising or not."""
        lock = OutputDirLock(self.args.output_dir) if self.topology.rank == 0 else None
        failure = None
        if lock is not None:
            try:
                lock.acquire()
            except Exception as e:  # noqa: BLE001 - e.g. an unwritable output_dir: the other ranks must learn it too
                failure = e
        outcome = f"{type(failure).__name__}: {failure}" if failure is not None else None
        if self.topology.world_size > 1:
            outcome = all_gather_object(outcome)[0]
        if failure is not None:
            raise failure
        if outcome is not None:
            raise OutputDirLockedError(f"rank 0: {outcome}")
        try:
            yield
        finally:
            if lock is not None:
                lock.release()

    def wait_for_checkpoint_snapshot(self) -> None:
        """Return once the async save in flight (``checkpoint_async_save``) has its copy of the weights and optimizer
        states; at once without one. Code that writes them in place between a save and the next optimizer step
        (an ``on_save``/``on_step_begin`` callback) calls it first, or its values leak into the saved step."""
        self._checkpointer.wait_for_snapshot()

    def _update_best(self, metrics: Optional[Dict[str, float]], checkpoint_dir: str) -> None:
        self.state.update_best(metrics, self.args.metric_for_best_model, self.args.greater_is_better, checkpoint_dir)

    def _save_checkpoint(self, metrics: Optional[Dict[str, float]] = None) -> str:
        """Write ``output_dir/checkpoint-<step>``: every rank its own shards, published atomically, then rotate."""
        checkpoint_dir = os.path.join(self.args.output_dir, checkpoint_dir_name(self.state.global_step))
        self._update_best(metrics, checkpoint_dir)
        resume_state = {} if self.args.ignore_save_lr_and_optim else dict(
            optimizer=self.optimizer, lr_scheduler=self.lr_scheduler, scaler=self.scaler)
        return self._checkpointer.save(  # async: copied while the next step runs, see _optimizer_step
            checkpoint_dir, model=self.model, **resume_state, trainer_state=dataclasses.asdict(self.state),
            args=self.args, data_state={"consumed_samples": self.state.consumed_samples}, topology=self.topology,
            async_save=self.args.checkpoint_async_save and not self._stop.stopping,  # the stop save is the last
            save_total_limit=self.args.save_total_limit, best_checkpoint=self.state.best_model_checkpoint)

    @staticmethod
    def _checkpoint_loader(checkpoint_dir: str) -> Callable:
        """Our loader (no pickles), or for a PaddleNLP-written directory the interop loader, the one reader of
        pickles: such a directory is only ever reached through a path the user gave, or through ``true`` in an
        ``output_dir`` holding no checkpoint of ours (see ``get_last_checkpoint``)."""
        if is_paddlenlp_checkpoint(checkpoint_dir):
            logger.warning("%s is a PaddleNLP checkpoint: loading it unpickles its .pdparams/.pdopt files, which "
                           "can run code; load only checkpoints you trust", checkpoint_dir)
            return load_paddlenlp_checkpoint
        return ckpt.load_checkpoint

    def _load_checkpoint(self, checkpoint_dir: str) -> None:
        """Restore weights, optimizer, schedule, scaler, RNG and the data position (any saved layout).

        With ``ignore_load_lr_and_optim`` (PaddleNLP's warm start) only the weights are loaded: the step
        count, data position, optimizer, schedule, scaler and RNG start fresh.
        """
        self._finish_checkpoints()  # a save in flight still reads the tensors this load writes
        load = self._checkpoint_loader(checkpoint_dir)
        if self.args.ignore_load_lr_and_optim:
            load(checkpoint_dir, model=self.model, topology=self.topology, load_rng=False)
            logger.info("Warm start from the weights of %s (ignore_load_lr_and_optim)", checkpoint_dir)
            return
        loaded = load(
            checkpoint_dir,
            model=self.model,
            optimizer=self.optimizer,
            lr_scheduler=self.lr_scheduler,
            scaler=self.scaler,
            topology=self.topology,
        )
        if not loaded.optimizer_restored:
            raise ckpt.CheckpointError(
                f"{checkpoint_dir} holds no optimizer state (saved with ignore_save_lr_and_optim?): resume it with "
                f"--ignore_load_lr_and_optim to start from its weights")
        for warning in loaded.warnings:
            logger.warning("%s: %s", checkpoint_dir, warning)
        restored = TrainerState.from_dict(loaded.trainer_state, source=checkpoint_dir)
        restored.is_local_process_zero = self.state.is_local_process_zero
        restored.is_world_process_zero = self.state.is_world_process_zero
        # the length of this run is this run's: resuming with a larger max_steps extends the training
        restored.max_steps = self.state.max_steps
        restored.num_train_epochs = self.state.num_train_epochs
        if loaded.data_state:
            restored.consumed_samples = int(loaded.data_state["consumed_samples"])
        self.state = restored
        logger.info("Resumed from %s at step %d (%d samples consumed)", checkpoint_dir, self.state.global_step, self.state.consumed_samples)

    def _data_start(self, resume, steps_per_epoch: Optional[int], global_batch: int) -> int:
        """Samples of the global order to skip on (re)start (``data.resume_position``)."""
        return resume_position(self.state.consumed_samples, resume is not None and self.args.ignore_data_skip,
                               steps_per_epoch, global_batch)

    def _finish_checkpoints(self) -> None:
        self._checkpointer.finish()  # an async save is on disk (and published) before train() returns
