"""The Trainer's checkpoints: which one to resume from, saving ``checkpoint-<step>``, loading one back into the
run (weights, optimizer, schedule, scaler, RNG, state and data position), the best-model bookkeeping, rotation,
and PaddleNLP's ``save_model``, ``save_state`` and ``export_model``.

A mixin of :class:`~paddletrainer.trainer.Trainer` (like ``trainer_evaluation.TrainerEvaluation``): the methods use the
Trainer's ``args``, ``state``, ``model``, ``optimizer``, ``lr_scheduler``, ``scaler``, ``topology`` and its
``_checkpointer`` (the save in flight). The format, the writers and the resharding load live in ``checkpoint``.
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import shutil
from typing import Callable, Dict, Iterator, Optional

import paddle

from . import checkpoint as ckpt
from .trainer_callback import TrainerState
from .checkpoint import peft
from .checkpoint.discovery import (ResumeChoice, is_paddlenlp_checkpoint, is_paddlenlp_unified_checkpoint,
                                   newest_sound_checkpoint, remove_stale_tmp_dirs, resolve_resume, saved_global_batch,
                                   set_aside_damaged)
from .checkpoint.placement import (PREFIX_CHECKPOINT_DIR, SCALER_NAME, SCHEDULER_NAME,
                                   TRAINER_STATE_NAME, checkpoint_dir_name, parse_checkpoint_step)
from .checkpoint.read import read_index
from .checkpoint.save import CheckpointStates
from .checkpoint.paddlenlp_interop import load_paddlenlp_checkpoint
from .checkpoint.paddlenlp_unified import load_paddlenlp_unified_checkpoint
from .checkpoint.validate import validate_trainer_state
from .data.collate import forward_argument_names
from .data.sampling import resume_position
from .checkpoint.output_lock import OutputDirLock, OutputDirLockedError
from .parallel.collectives import all_gather_object

__all__ = ["TrainerCheckpoints"]

logger = logging.getLogger("paddletrainer.trainer")  # the Trainer's logger: one place to configure or silence


class TrainerCheckpoints:
    """Resume, save, load and export for the Trainer (see the module docstring)."""

    _named_checkpoint: Optional[str] = None  # the resume path the user gave (set by _resolve_resume)
    _auto_resume: bool = False  # resume_from_checkpoint was "auto" (set by _resolve_resume)

    def _is_named_checkpoint(self, path: str) -> bool:
        return self._named_checkpoint is not None and os.path.realpath(path) == os.path.realpath(self._named_checkpoint)

    def _resolve_resume(self, resume_from_checkpoint) -> Optional[str]:
        """The checkpoint to resume from (:func:`~.checkpoint.discovery.resolve_resume`: a path, true or auto), or
        None; resolved once here, when train() starts.

        ``auto`` passes over a newest checkpoint that is damaged (``checkpoint.discovery.checkpoint_problem``: its
        index unreadable, a file missing or of another size), with a warning naming it, so that an automatic
        restart is not stuck on it; when every checkpoint there is damaged it is an error, not a fresh start.
        Half-written ``checkpoint-N.tmp-*`` dirs of a crashed attempt are never resumed; rank 0 deletes those of
        this run's ``output_dir`` here (no save of this job is in flight when train() starts). A resume path
        elsewhere is left alone: another job may be writing beside it. A damaged checkpoint ``auto`` passed over is
        moved aside to ``checkpoint-N.damaged-<time>`` by rank 0 (:meth:`_set_aside_damaged`).
        """
        value = resume_from_checkpoint if resume_from_checkpoint is not None else self.args.resume_from_checkpoint
        choice: ResumeChoice = resolve_resume(value, self.args.output_dir)
        for bad, problem in choice.skipped:
            self._set_aside_damaged(bad, problem, choice.path)
        # the one checkpoint whose pickles may be read (a PaddleNLP one): the exact path the user gave
        self._named_checkpoint = choice.named
        self._auto_resume = choice.auto
        if self.state.is_world_process_zero and os.path.isdir(self.args.output_dir):
            remove_stale_tmp_dirs(self.args.output_dir)
        return choice.path

    def _set_aside_damaged(self, bad: str, problem: str, resuming_from: str) -> None:
        """Warn that ``auto`` passed over ``bad``; rank 0 renames it ``checkpoint-N.damaged-<time>``: under its name
        it would outrank the sound checkpoints in rotation and be in the way of the save of its step."""
        moved = set_aside_damaged(bad) if self.topology.rank == 0 else None
        logger.warning("resume_from_checkpoint=auto: skipped the damaged checkpoint %s (%s); resuming from %s%s",
                       bad, problem, resuming_from, f"; moved it aside to {moved}" if moved else "")

    def _load_resume_checkpoint(self, checkpoint_dir: str) -> str:
        """:meth:`_load_checkpoint` of the checkpoint to resume from; returns the one loaded.

        With ``resume_from_checkpoint=auto`` a checkpoint that turns out corrupt while it is read (a crc32
        mismatch: :class:`~.checkpoint.CheckpointCorruptError` on any rank) is passed over like a damaged one:
        every rank learns every rank's outcome (one gather), and all fall back to the next older sound checkpoint
        with a warning, as long as that one holds every tensor and state file the failed load may have written
        (so all of it is overwritten again); otherwise the error is raised. Any other failure on a rank is
        raised on every rank."""
        if not self._auto_resume:
            self._load_checkpoint(checkpoint_dir)
            return checkpoint_dir
        passed_over: list = []  # (checkpoint, problem): set aside once every rank is past reading them
        while True:
            try:
                self._load_checkpoint(checkpoint_dir)
                own = None
            except Exception as e:  # noqa: BLE001 - every rank must learn it before any decides
                own = e
            outcome = None if own is None else (isinstance(own, ckpt.CheckpointCorruptError), f"{type(own).__name__}: {own}")
            outcomes = self._every_ranks_outcome(outcome)
            failed = [(r, o) for r, o in enumerate(outcomes) if o is not None]
            if not failed:  # the gather is also what keeps rank 0 from renaming what another rank still reads
                for bad, problem in passed_over:
                    self._set_aside_damaged(bad, problem, checkpoint_dir)
                return checkpoint_dir
            if not all(corrupt for _, (corrupt, _m) in failed):
                if own is not None:
                    raise own
                r, (_c, message) = next((r, o) for r, o in failed if not o[0])
                raise ckpt.CheckpointError(f"rank {r} failed to load {checkpoint_dir}: {message}")
            checkpoint_dir = self._fall_back_from_corrupt(checkpoint_dir, own, failed, passed_over)

    def _every_ranks_outcome(self, outcome) -> list:
        """Every rank's ``outcome`` of a load, in rank order (collective)."""
        return all_gather_object(outcome) if self.topology.world_size > 1 else [outcome]

    def _fall_back_from_corrupt(self, corrupt: str, own: Optional[Exception], failed: list, passed_over: list) -> str:
        """The next older sound checkpoint after ``corrupt`` failed to load on the ``failed`` ranks (``corrupt`` and
        the damaged ones in between are added to ``passed_over``); raises when there is none or it would not
        overwrite all the failed load wrote."""
        reason = "; ".join(f"rank {r}: {message}" for r, (_c, message) in failed)
        step = parse_checkpoint_step(os.path.basename(corrupt))
        fallback, skipped = newest_sound_checkpoint(self.args.output_dir, before=step)
        why_not = None if fallback is None else _not_overwritten(corrupt, fallback)
        if fallback is None or why_not:
            error = ckpt.CheckpointError(
                f"resume_from_checkpoint=auto: {corrupt} is corrupt ({reason}) and "
                + (f"no older sound checkpoint is in {self.args.output_dir}" if fallback is None else
                   f"the next older one, {fallback}, cannot stand in for it: {why_not}")
                + "; the model and optimizer are partly overwritten: restart the run")
            raise error from own
        passed_over += [(corrupt, f"corrupt: {reason}"), *skipped]
        return fallback

    @contextlib.contextmanager
    def _output_dir_lock(self) -> Iterator[None]:
        """Hold ``output_dir``'s lock (:mod:`~paddletrainer.checkpoint.output_lock`) for the block, on global rank 0 — the rank
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
        async_save = self.args.checkpoint_async_save and not self._stop.stopping  # the stop save is the last
        return self._checkpointer.save(checkpoint_dir, async_save=async_save)  # async: see _optimizer_step

    def _checkpoint_states(self) -> CheckpointStates:
        """What the run's :class:`~.checkpoint.Checkpointer` saves (bound to it in ``__init__``, read at each save:
        the model and optimizer are replaced while the Trainer wraps them, the step and data position advance)."""
        resume_state = {} if self.args.ignore_save_lr_and_optim else dict(
            optimizer=self.optimizer, lr_scheduler=self.lr_scheduler, scaler=self.scaler)
        return CheckpointStates(
            model=self.model, **resume_state, trainer_state=dataclasses.asdict(self.state), args=self.args,
            data_state=self._data_state(), topology=self.topology, save_total_limit=self.args.save_total_limit,
            best_checkpoint=self.state.best_model_checkpoint)

    def _data_state(self) -> Dict[str, int]:
        """The layout-free data position, and the global batch it is counted in (a resume keeps it)."""
        return {"consumed_samples": self.state.consumed_samples, "global_batch_size": self.args.global_batch_size}

    def _keep_saved_global_batch(self, checkpoint_dir: Optional[str]) -> None:
        """Resume with the global batch ``checkpoint_dir`` was trained with, never silently another one.

        The data order and the resume point are counted in global batches, so another global batch (an elastic
        launch that came back with fewer data ranks, or changed batch options) would change what is trained on
        and stop short of ``max_steps``. When ``per_device_train_batch_size`` × data ranks divides the saved
        global batch, ``gradient_accumulation_steps`` is set to make it up and a warning says so; otherwise
        (or under pipeline parallel, whose micro-batch count is fixed when the groups are built) a ValueError
        names the ways out. A warm start (``ignore_load_lr_and_optim``) and a PaddleNLP checkpoint keep this
        run's batch: they restore no data position.
        """
        args, topo = self.args, self.topology
        if checkpoint_dir is None or args.ignore_load_lr_and_optim or is_paddlenlp_checkpoint(checkpoint_dir):
            return
        saved, asked = saved_global_batch(checkpoint_dir), args.global_batch_size
        if saved is None or saved == asked:
            return
        per_step = args.per_device_train_batch_size * topo.data_world_size
        asked_text = (f"per_device_train_batch_size={args.per_device_train_batch_size} x gradient_accumulation_steps="
                      f"{args.gradient_accumulation_steps} x {topo.data_world_size} data rank(s) = {asked}")
        if saved % per_step or topo.pp_degree > 1:
            fix = (f"pass --gradient_accumulation_steps {saved // per_step} (pipeline_parallel_degree="
                   f"{topo.pp_degree} fixes it when the groups are built)" if saved % per_step == 0 else
                   f"choose a per_device_train_batch_size and a number of data ranks whose product divides {saved}")
            raise ValueError(
                f"resume_from_checkpoint={checkpoint_dir!r} was trained with a global batch of {saved} samples per "
                f"step, but this run asks for {asked_text}; a resume keeps the global batch (the data position "
                f"and step count are counted in it): {fix}, or start a new run from its weights with "
                f"--ignore_load_lr_and_optim")
        logger.warning(
            "KEEPING THE GLOBAL BATCH of %s: it was trained with %d samples per step, this run asks for %s; "
            "gradient_accumulation_steps %d -> %d", checkpoint_dir, saved, asked_text,
            args.gradient_accumulation_steps, saved // per_step)
        args.gradient_accumulation_steps = saved // per_step

    def _check_wrapped_accumulation(self) -> None:
        """A model wrapped earlier (by ``evaluate``/``predict`` on several processes, or a previous ``train``) whose
        sequence-parallel hooks count another ``gradient_accumulation_steps`` (a resume kept the checkpoint's
        global batch, or a script changed it) would all-reduce its gradients at the wrong micro-batches: refused."""
        wrapped, ga = self._wrapped_accumulation, self.args.gradient_accumulation_steps
        if self._wrapped and wrapped is not None and wrapped != ga:
            raise ValueError(
                f"gradient_accumulation_steps={ga} but this Trainer's model was wrapped for sequence parallel with "
                f"gradient_accumulation_steps={wrapped} (by an earlier evaluate(), predict() or train()): its "
                f"tensor-parallel all-reduce hooks count {wrapped} backward passes per step and would reduce the "
                f"gradients at the wrong micro-batches; build a new Trainer for this train(), or call train() "
                f"before evaluate()")

    def _checkpoint_loader(self, checkpoint_dir: str) -> Callable:
        """Our loader (no pickles), or for the PaddleNLP-written directory the user named as
        ``resume_from_checkpoint`` a PaddleNLP loader: unified (safetensors, any layout) or not (its pickles
        read by an allowlist unpickler; scheduler and RNG pickles of both formats likewise). A directory
        found otherwise (``true``, ``auto``, rollback, the trainer state's ``best_model_checkpoint``) always
        goes to our loader, which refuses pickles."""
        if self._is_named_checkpoint(checkpoint_dir) and is_paddlenlp_unified_checkpoint(checkpoint_dir):
            logger.info("%s is a PaddleNLP unified checkpoint: its safetensors are loaded into this layout; "
                        "scheduler.pdparams and rng_state*.pth are pickles, read with an allowlist unpickler",
                        checkpoint_dir)
            return load_paddlenlp_unified_checkpoint
        if self._is_named_checkpoint(checkpoint_dir) and is_paddlenlp_checkpoint(checkpoint_dir):
            logger.info("%s is a PaddleNLP checkpoint: its .pdparams/.pdopt pickles are read with an allowlist "
                        "unpickler (arrays, tensors, numbers, strings, containers only)", checkpoint_dir)
            return load_paddlenlp_checkpoint
        return ckpt.load_checkpoint

    def _load_best_model(self) -> None:
        """``load_best_model_at_end``: reload ``state.best_model_checkpoint``'s weights. The path comes from the
        trainer state (a resumed checkpoint's ``trainer_state.json`` can name any directory), so a PaddleNLP
        checkpoint there is read only if it is the one the user named; any other is skipped with a warning."""
        best = self.state.best_model_checkpoint
        if is_paddlenlp_checkpoint(best) and not self._is_named_checkpoint(best):
            logger.warning("load_best_model_at_end: the best checkpoint %s is a PaddleNLP checkpoint that the trainer "
                           "state names, not one you named; its pickled files are not read and the model keeps its "
                           "final weights (resume_from_checkpoint=%s loads it)", best, best)
            return
        logger.info("Loading best model from %s (score %s)", best, self.state.best_metric)
        load = self._checkpoint_loader(best)
        load(best, model=self.model, topology=self.topology, load_rng=False)

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
        state_file = os.path.join(checkpoint_dir, TRAINER_STATE_NAME)
        restored = TrainerState.from_dict(validate_trainer_state(loaded.trainer_state, state_file, resume=True),
                                          source=checkpoint_dir)
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

    def _rotate_checkpoints(self, use_mtime: bool = False, output_dir: Optional[str] = None) -> None:
        """Delete the oldest complete checkpoints beyond ``save_total_limit`` (never the best nor the newest;
        main process only). Age is the step number in the name, so ``use_mtime`` has no effect."""
        if self.args.save_total_limit and self.args.save_total_limit > 0 and self.args.should_save:
            ckpt.rotate_checkpoints(output_dir or self.args.output_dir, self.args.save_total_limit,
                                    self.state.best_model_checkpoint)

    def save_model(self, output_dir: Optional[str] = None, merge_tensor_parallel: Optional[bool] = False) -> None:
        """Write a ``from_pretrained``-loadable directory (merged weights, config, tokenizer) to ``output_dir``.

        ``merge_tensor_parallel`` is PaddleNLP's parameter (its scripts pass it); the weights are merged over the
        tensor-parallel ranks either way, so the directory loads in any layout.

        Works on every layout: each rank contributes its shards to a weights-only checkpoint, which the
        main process merges into full tensors. A ``paddlenlp.peft.LoRAModel`` gets what
        ``LoRAModel.from_pretrained(base, output_dir)`` reads, as PaddleNLP saves it: ``lora_config.json``, the
        config and the adapters only (safetensors, merged over tensor-parallel ranks; ``checkpoint.peft``).
        """
        output_dir = output_dir or self.args.output_dir
        staging = os.path.join(output_dir, f".{PREFIX_CHECKPOINT_DIR}-export")
        self._checkpointer.finish()  # an async save in flight is published first (this save clears tmp dirs)
        ckpt.save_checkpoint(staging, model=self.model, topology=self.topology, save_rng=False, args=self.args)
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

    def save_state(self) -> None:
        """Write ``trainer_state.json`` in output_dir."""
        if self.args.should_save:
            os.makedirs(self.args.output_dir, exist_ok=True)
            self.state.save_to_json(os.path.join(self.args.output_dir, "trainer_state.json"))


def _not_overwritten(failed: str, fallback: str) -> Optional[str]:
    """What of checkpoint ``failed`` (whose load stopped half way) loading ``fallback`` would not write again: the
    tensors, and the schedule, scaler and RNG files, ``failed`` holds that ``fallback`` lacks; or a different
    global batch (already applied to this run's accumulation). None when ``fallback`` overwrites all of it."""
    index_failed, index_fallback = read_index(failed), read_index(fallback)
    tensors = sorted(set(index_failed["tensors"]) - set(index_fallback["tensors"]))
    states = sorted(n for n in set(index_failed["files"]) - set(index_fallback["files"])
                    if n in (SCHEDULER_NAME, SCALER_NAME) or n.startswith("rng_state"))
    if tensors or states:
        return "it lacks " + ", ".join((tensors + states)[:5]) + (" …" if len(tensors) + len(states) > 5 else "")
    if saved_global_batch(failed) != saved_global_batch(fallback):
        return "it was trained with another global batch"
    return None
