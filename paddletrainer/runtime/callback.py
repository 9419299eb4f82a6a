"""``RobustnessCallback``: graceful stop and the hang watchdog driven by Trainer events.

Handlers are installed at ``on_train_begin``; the watchdog is re-armed at every event with the phase the loop is
in (``data``, ``forward_backward``, ``optimizer``, ``stop_check``, ``log``, ``evaluate``, ``checkpoint_save``). The
stop check itself (a collective) is the Trainer loop's ``GracefulStop.agreed``, right after the optimizer step; it
sets ``should_save`` and ``should_training_stop``; the Trainer saves that checkpoint synchronously (even with
``checkpoint_async_save``) and this callback's ``on_save`` then raises ``TrainingInterrupted``. With ``remove_unused_columns=False`` the
first training batch's keys are checked here, in the main thread — not in the collator, because Paddle's
single-process DataLoader collates in a helper thread and an exception there leaves the loop waiting forever.
"""
from __future__ import annotations

import logging
import os
from typing import Optional, Sequence

from ..trainer_callback import TrainerCallback
from ..checks import check_batch_keys
from ..errors import TrainingInterrupted
from ..checkpoint.placement import checkpoint_dir_name
from .signals import GracefulStop
from .watchdog import CollectiveWatchdog

logger = logging.getLogger(__name__)

__all__ = ["RobustnessCallback"]


class RobustnessCallback(TrainerCallback):
    """``GracefulStop`` + ``CollectiveWatchdog`` driven by Trainer events (see the module docstring).

    Args:
        topology: the Trainer's ``Topology`` (``world_size`` and ``rank`` are read).
        collective_timeout_seconds: ``args.collective_timeout_seconds`` (None: no watchdog).
        handle_signals: install the SIGTERM/SIGINT handlers during ``train()`` (default True).
        popped_keys: batch keys the trainer removes before calling the model (its ``label_names`` when a
            ``criterion`` is used); with ``remove_unused_columns=False`` the first training batch's other keys must
            be ``forward`` parameters (:func:`check_batch_keys`).
        remove_unused_columns: the option of that name; False makes the first training batch's keys checked.
        stopper: the ``GracefulStop`` whose handlers this callback installs — the one the Trainer's loop asks
            (``Trainer`` passes its own); None with ``handle_signals``: a new one.
    """

    def __init__(self, topology=None, collective_timeout_seconds: Optional[float] = None, handle_signals: bool = True,
                 popped_keys: Sequence[str] = (), stopper: Optional[GracefulStop] = None,
                 remove_unused_columns: bool = True):
        self.topology = topology
        self.popped_keys = tuple(popped_keys)
        self._keys_checked = remove_unused_columns  # the collator drops unknown keys: nothing to check
        rank = int(getattr(topology, "rank", 0) or 0)
        self.stopper = (stopper or GracefulStop()) if handle_signals else None
        self.watchdog = CollectiveWatchdog(collective_timeout_seconds, rank)
        self._training = False

    # -------------------------------------------------------------------------- helpers
    @staticmethod
    def _next_step(state) -> int:
        return int(state.global_step) + 1

    def _after_step_phase(self, control) -> str:
        if control.should_log:
            return "log"
        if control.should_evaluate:
            return "evaluate"
        if control.should_save:
            return "checkpoint_save"
        return "data"

    # -------------------------------------------------------------------------- events
    def on_train_begin(self, args, state, control, **kwargs):
        self._training = True
        if self.stopper is not None:
            self.stopper.uninstall()  # a previous train() of this trainer that ended in an exception
            self.stopper.reset()
            self.stopper.install()
        self.watchdog.enter("data", self._next_step(state))

    def on_load_data_end(self, args, state, control, inputs=None, model=None, **kwargs):
        if not self._keys_checked and isinstance(inputs, dict) and model is not None:
            check_batch_keys(model, inputs.keys(), self.popped_keys)
        self._keys_checked = True

    def on_step_begin(self, args, state, control, **kwargs):
        self.watchdog.enter("forward_backward", self._next_step(state))

    def on_substep_end(self, args, state, control, **kwargs):
        self.watchdog.enter("forward_backward", self._next_step(state))

    def on_optimizer_begin(self, args, state, control, **kwargs):
        self.watchdog.enter("optimizer", self._next_step(state))

    def on_optimizer_end(self, args, state, control, **kwargs):
        # the loop's collective stop check (GracefulStop.agreed) comes next, before on_step_end
        self.watchdog.enter("stop_check", self._next_step(state))

    def on_step_end(self, args, state, control, **kwargs):
        self.watchdog.enter(self._after_step_phase(control), state.global_step)

    def on_log(self, args, state, control, **kwargs):
        if self._training:
            self.watchdog.enter(self._after_step_phase(control), state.global_step)

    def on_prediction_step(self, args, state, control, **kwargs):
        self.watchdog.enter("evaluate", state.global_step)

    def on_evaluate(self, args, state, control, **kwargs):
        if self._training:
            self.watchdog.enter("checkpoint_save" if control.should_save else "data", state.global_step)
        else:
            self.watchdog.disarm()

    def on_predict(self, args, state, control, **kwargs):
        if not self._training:
            self.watchdog.disarm()

    def on_save(self, args, state, control, **kwargs):
        if self.stopper is not None and self.stopper.stopping:  # the Trainer saved the stop checkpoint synchronously
            self._finish()
            checkpoint = os.path.join(args.output_dir, checkpoint_dir_name(state.global_step))
            exc = TrainingInterrupted(self.stopper.signum, state.global_step, checkpoint)
            logger.warning("%s", exc.message)
            raise exc
        self.watchdog.enter("data", self._next_step(state))

    def on_epoch_end(self, args, state, control, **kwargs):
        self.watchdog.enter("epoch_end", state.global_step)

    def on_train_end(self, args, state, control, **kwargs):
        self._finish()

    def _finish(self) -> None:
        self._training = False
        self.watchdog.disarm()
        if self.stopper is not None:
            self.stopper.uninstall()

