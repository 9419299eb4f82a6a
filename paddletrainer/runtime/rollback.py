"""``nan_inf_policy=rollback``: a non-finite step sends training back to the last good checkpoint.

What happens when the global gradient norm of a step is NaN/inf (and an fp16 loss scaler cannot explain it,
see ``overflow.nonfinite_action``) — the same on every rank, because the norm is the same global value everywhere:

1. the step is not applied (its gradients are dropped);
2. a pending async save is published (collective: every rank reaches this point at the same step);
3. the newest complete checkpoint in ``output_dir`` that may hold good weights is loaded: weights, optimizer,
   schedule, scaler, RNG and the trainer state (``global_step`` goes back to the checkpoint's). One that may not
   is passed over: a step after the current ``global_step`` (left by an earlier run: that would roll *forward*),
   a step after the last replica check that passed (with ``replica_check_steps``: a save between two checks can
   hold weights that had already diverged, mixed from several replicas; loading it would make the replicas agree
   again and hide the corruption), and a damaged one (``checkpoint.discovery.checkpoint_problem``: index unreadable,
   a file missing or of another size; a warning names it);
4. the data window since that checkpoint — every sample trained on after it, the bad step's included — is
   skipped: the data position stays where the bad step left it, so training resumes on unseen samples. This is
   the recovery large-model runs use for loss spikes (restart before the spike, skip the batches around it);
   replaying the same samples would mostly reproduce the fault;
5. optionally the learning rate is multiplied by ``nan_inf_rollback_lr_factor`` (cumulatively, once per
   rollback; for the rest of this ``train()`` call — the schedule's shape is kept, its base value is lowered);
6. after ``nan_inf_rollback_max_retries`` rollbacks in one ``train()`` call, the next non-finite step raises
   ``NonFiniteLossError`` saying so, and so does a rollback with no checkpoint to go back to.

A replica divergence (``replica_check_steps``, :mod:`paddletrainer.runtime.replica_check`) takes the same path: the
check step's update is already applied and counted, and is discarded with the rest of the window.

The loop calls :meth:`Rollback.recover` where ``_optimizer_step`` or the replica check raised; this module never
communicates except through ``Trainer._finish_checkpoints`` (publishing an async save). Limits: only non-finite
norms and replica divergence trigger it (a finite loss spike does not); the skipped samples count as consumed,
so a run bounded by epochs ends after fewer optimizer steps.
"""
from __future__ import annotations

import logging
import os
from typing import List, Optional, Tuple

from ..checkpoint.discovery import newest_sound_checkpoint
from ..config.builders import RollbackConfig  # built by TrainingArguments: args.rollback_config

logger = logging.getLogger(__name__)

class Rollback:
    """The rollback state of one ``train()`` call: how many rollbacks happened, the current LR scale."""

    def __init__(self, config: RollbackConfig):
        self.config = config
        self.count = 0
        self.lr_scale = 1.0
        self._base_lr: Optional[float] = None

    def recover(self, trainer, error: Exception, data_position: int, step_applied: bool = False,
                cause: str = "non-finite gradient norm", verified_step: Optional[int] = None) -> str:
        """Roll ``trainer`` back after ``error`` (the bad step's ``NonFiniteLossError``, or the
        ``ReplicaDivergenceError`` of a check step); return the checkpoint.

        ``data_position``: samples consumed once the bad step's batch is counted — where training goes on.
        ``step_applied``: False for a step stopped before its update (its gradients are dropped; it is the step
        after ``global_step``), True after a step was applied and counted (the replica check: the step is
        ``global_step``, its gradients already cleared). ``cause``: what went wrong, for the log.
        ``verified_step``: with the replica check on, the last step whose weights it found equal on every replica
        (or that was loaded from a checkpoint); no checkpoint after it is taken. None: the check is off.
        Re-raises ``error`` (its type, with the reason appended) when retries are exhausted or there is no
        checkpoint to go back to.
        """
        if not step_applied:
            trainer.optimizer.clear_grad()
        if self.count >= self.config.max_retries:
            raise type(error)(f"{error}; gave up after {self.count} rollback(s) (nan_inf_rollback_max_retries="
                              f"{self.config.max_retries})") from None
        trainer._finish_checkpoints()  # the newest checkpoint may still be in flight (async save)
        newest = trainer.state.global_step if verified_step is None else min(verified_step, trainer.state.global_step)
        path, damaged = self._target(newest)
        for bad, problem in damaged:
            logger.warning("nan_inf_policy='rollback' passed over the damaged checkpoint %s (%s)", bad, problem)
        if path is None:
            why = ("the last step the replica check passed (replica_check_steps): a checkpoint saved after it may "
                   "hold diverged weights" if verified_step is not None and verified_step < trainer.state.global_step
                   else "the current step")
            passed = "".join(f"; {os.path.basename(bad)} is damaged: {problem}" for bad, problem in damaged)
            raise type(error)(f"{error}; nan_inf_policy='rollback' found no complete checkpoint in "
                              f"output_dir={self.config.output_dir!r} at or before step {newest} ({why}) to roll "
                              f"back to{passed} (save earlier: save_steps)") from None
        bad_step = trainer.state.global_step + (0 if step_applied else 1)
        trainer._load_checkpoint(path)
        skipped_from = trainer.state.consumed_samples
        trainer.state.consumed_samples = data_position
        self.count += 1
        self.lr_scale *= self.config.lr_factor
        self._scale_lr(trainer.lr_scheduler)
        trainer._loop.losses.discard()  # the losses of the discarded steps are not logged
        logger.warning(
            "step %d: %s; rolled back to %s (rollback %d of at most %d), skipping samples "
            "[%d, %d) trained on since it%s", bad_step, cause, path, self.count, self.config.max_retries, skipped_from,
            data_position, f"; learning rate x{self.lr_scale:g}" if self.config.lr_factor != 1.0 else "")
        return path

    def _target(self, newest: int) -> Tuple[Optional[str], List[Tuple[str, str]]]:
        """The newest sound checkpoint of ours at or before step ``newest`` (never a PaddleNLP dir: no pickles
        here), and the damaged ones passed over on the way, each with its problem. Every rank decides alike: the
        same directory listing and file sizes."""
        return newest_sound_checkpoint(self.config.output_dir, before=newest + 1)

    def _scale_lr(self, scheduler) -> None:
        if self.config.lr_factor == 1.0 or scheduler is None:
            return
        if self._base_lr is None:
            self._base_lr = float(scheduler.base_lr)
        scheduler.base_lr = self._base_lr * self.lr_scale
        scheduler.last_lr = scheduler.get_lr()  # the loaded state's LR was computed from the original base
