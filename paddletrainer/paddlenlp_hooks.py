"""``Trainer`` methods that PaddleNLP scripts call or override and that are not part of the training loop:
process identity, result files and tables, model export, token counts, checkpoint rotation.

``Trainer`` inherits them; they read the Trainer's ``args``, ``topology``, ``state`` and ``model``.
"""
from __future__ import annotations

import logging
import os
import shutil
from typing import Any, Dict, Optional

import paddle

from . import checkpoint as ckpt
from .checkpoint import peft
from .data import IterableDatasetShard, forward_argument_names, sum_over_data_ranks
from .metrics import results
from .nested import distributed_concat
from .trainer_utils import PREFIX_CHECKPOINT_DIR, has_length

logger = logging.getLogger(__name__)

__all__ = ["PaddleNLPHooks"]


class PaddleNLPHooks:
    """``is_world_process_zero``, ``is_local_process_zero``, ``num_examples``, ``_nested_gather``,
    ``_rotate_checkpoints``, ``log_trained_tokens``, ``save_model``, ``export_model``, ``metrics_format``,
    ``log_metrics``, ``save_metrics``, ``save_state`` with PaddleNLP's signatures."""

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

    def log_trained_tokens(self) -> None:
        """Log the tokens trained so far in this ``train()`` over all data ranks (at each save and at the end;
        collective over the data group). Sets ``trained_effective_tokens`` and ``trained_tokens``."""
        if not self.args.count_trained_tokens:
            return
        effective, total = sum_over_data_ranks(list(self._loop.tokens.totals()), self.topology)
        self.trained_effective_tokens, self.trained_tokens = int(effective), int(total)
        if self.args.should_log:
            logger.info("Update to now, trained_effective_tokens: %d, trained_tokens: %d",
                        self.trained_effective_tokens, self.trained_tokens)

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

    def save_model(self, output_dir: Optional[str] = None) -> None:
        """Write a ``from_pretrained``-loadable directory (merged weights, config, tokenizer) to ``output_dir``.

        Works on every layout: each rank contributes its shards to a weights-only checkpoint, which the
        main process merges into full tensors. A ``paddlenlp.peft.LoRAModel`` gets what
        ``LoRAModel.from_pretrained(base, output_dir)`` reads, as PaddleNLP saves it: ``lora_config.json``, the
        config and the adapters only (safetensors, merged over tensor-parallel ranks; ``checkpoint.peft``).
        """
        output_dir = output_dir or self.args.output_dir
        staging = os.path.join(output_dir, f".{PREFIX_CHECKPOINT_DIR}-export")
        # the Trainer's checkpointer: an async save in flight is published first (this save clears tmp dirs)
        self._checkpointer.save(staging, model=self.model, topology=self.topology, save_rng=False, args=self.args)
        if self.args.should_save:
            if peft.peft_type(self.model) is not None:
                peft.export_adapters(staging, output_dir)
            else:
                ckpt.export_for_from_pretrained(staging, output_dir, require_config=False)
            shutil.rmtree(staging, ignore_errors=True)
            if self.tokenizer is not None and hasattr(self.tokenizer, "save_pretrained"):
                self.tokenizer.save_pretrained(output_dir)
            with open(os.path.join(output_dir, "training_args.json"), "w") as f:
                f.write(self.args.to_json_string())

    def export_model(self, input_spec=None, output_dir: Optional[str] = None) -> str:
        """``paddle.jit.save`` an inference model (``do_export``); the spec is read from one eval batch if absent."""
        output_dir = output_dir or os.path.join(self.args.output_dir, "export")
        if input_spec is None:
            dataset = self.eval_dataset if self.eval_dataset is not None else self.train_dataset
            batch = next(iter(self.get_eval_dataloader(dataset)))
            names = [n for n in (forward_argument_names(self.model) or batch) if n in batch and n not in self.label_names]
            input_spec = [
                paddle.static.InputSpec(shape=[None] + list(batch[n].shape[1:]), dtype=str(batch[n].dtype).split(".")[-1], name=n)
                for n in names
            ]
        self.model.eval()
        path = os.path.join(output_dir, "inference")
        if self.args.should_save:
            paddle.jit.save(self.model, path, input_spec=input_spec)
        return path

    def metrics_format(self, metrics: Dict[str, float]) -> Dict[str, Any]:
        """Metrics rounded for display (floats to 4 decimals; runtimes as h:mm:ss)."""
        return results.format_metrics(metrics)

    def log_metrics(self, split: str, metrics: Dict[str, float]) -> None:
        """Print ``metrics`` as an aligned table on the main process."""
        if self.args.should_log:
            results.print_metrics(split, metrics)

    def save_metrics(self, split: str, metrics: Dict[str, float], combined: bool = True) -> None:
        """Write ``<split>_results.json`` (and merge into ``all_results.json``) in output_dir."""
        if self.args.should_save:
            results.save_metrics(self.args.output_dir, split, metrics, combined)

    def save_state(self) -> None:
        """Write ``trainer_state.json`` in output_dir."""
        if self.args.should_save:
            os.makedirs(self.args.output_dir, exist_ok=True)
            self.state.save_to_json(os.path.join(self.args.output_dir, "trainer_state.json"))
