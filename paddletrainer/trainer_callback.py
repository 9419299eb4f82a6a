"""Trainer events: ``TrainerState``, ``TrainerControl``, ``TrainerCallback``, ``CallbackHandler`` and the
default callbacks.

Names, fields and event signatures match ``paddlenlp.trainer.trainer_callback`` (3.0.0b4), so a PaddleNLP
callback subclass works here unchanged. Two additions from Hugging Face: ``on_predict`` and a tolerant
``TrainerState.load_from_json`` (unknown keys are dropped with a warning, so a state written by a newer
version still loads).

Event flow of one training run
------------------------------
The Trainer calls the ``CallbackHandler`` in this order. It is PaddleNLP's ``Trainer.train`` order with
one difference: a step's micro-batches are all read before any is computed (the pipeline schedule needs
them together, and one order for every layout beats one per layout), so the ``on_load_data_end`` events of
a step come before its ``on_substep_end`` events. ``control`` is the object returned by the previous call;
the handler resets the per-step flags itself where noted::

    on_init_end                                   # end of Trainer.__init__
    on_train_begin                                # resets control.should_training_stop
    for each epoch:
        on_epoch_begin                            # resets control.should_epoch_stop
        for each optimizer step (gradient_accumulation_steps micro-batches):
            for each micro-batch:
                on_load_data_end(inputs=batch)    # right after the batch is read
                if first micro-batch: on_step_begin   # resets should_log / should_evaluate / should_save
            for each micro-batch:
                forward + backward
                on_substep_end                    # all but the last micro-batch
            on_optimizer_begin(scaler=...)
            optimizer.step(); lr_scheduler.step(); clear grads
            on_optimizer_end(scaler=...)
            state.global_step += 1; state.epoch = consumed samples / samples per epoch
            on_step_end                           # DefaultFlowCallback sets the flags here
            _maybe_log_save_evaluate              # see below
            stop the epoch if control.should_epoch_stop or control.should_training_stop
        on_epoch_end                              # DefaultFlowCallback sets epoch-strategy flags here
        _maybe_log_save_evaluate
        stop if control.should_training_stop
    on_train_end

    _maybe_log_save_evaluate, in this order:
        if control.should_log:      on_log(logs=...)          # resets should_log
        if control.should_evaluate: evaluate() -> on_prediction_step per eval batch,
                                    on_log(logs=eval metrics), on_evaluate(metrics=...)  # resets should_evaluate
        if control.should_save:     save checkpoint, then on_save   # resets should_save
    state.best_metric / best_model_checkpoint are updated after on_evaluate (when the checkpoint is saved),
    so EarlyStoppingCallback compares each evaluation with the best one before it.

``predict()`` calls ``on_prediction_step`` per batch and then ``on_predict(metrics=...)``.

Every event receives ``args, state, control`` plus the keyword arguments ``model, tokenizer, optimizer,
lr_scheduler, train_dataloader, eval_dataloader`` (attributes of the handler, which the Trainer keeps up to
date) and the event's own keywords (``inputs``, ``scaler``, ``metrics``, ``logs``).

Strategies (``args.logging_strategy`` etc.) may be ``paddletrainer.trainer_utils.IntervalStrategy`` members
or their string values ("no", "steps", "epoch"); both compare by value here.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import sys
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Union

from tqdm.auto import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

logger = logging.getLogger(__name__)

__all__ = [
    "TrainerState",
    "TrainerControl",
    "TrainerCallback",
    "CallbackHandler",
    "DefaultFlowCallback",
    "ProgressCallback",
    "PrinterCallback",
    "EarlyStoppingCallback",
    "EarlyStoppingArgumentsError",
]


def _strategy(value) -> str:
    """The string value of an IntervalStrategy member or of a plain string ("no", "steps", "epoch")."""
    return str(getattr(value, "value", value)).lower()


@dataclass
class TrainerState:
    """The Trainer's inner state; saved as ``trainer_state.json`` in every checkpoint and passed to callbacks.

    One step is one optimizer update: with ``gradient_accumulation_steps=n`` a step covers n micro-batches.

    Attributes:
        epoch: fractional epoch during training (2.5 = halfway through the third epoch); None before it.
        global_step: optimizer updates done so far.
        consumed_samples: global samples consumed (global_step x global batch), used to resume the data order.
        skipped_steps: steps whose update was skipped for a NaN/inf gradient (``nan_inf_policy="skip"``).
        max_steps: optimizer updates planned for this run.
        num_train_epochs: epochs planned for this run.
        total_flos: floating point operations done so far (a float to avoid overflow).
        log_history: every ``logs`` dict passed to ``on_log`` and every metrics dict of ``on_evaluate``.
        best_metric / best_model_checkpoint: best value of ``metric_for_best_model`` and its checkpoint path.
        is_local_process_zero / is_world_process_zero: whether this process is rank 0 on its node / overall.
        trial_name / trial_params: hyper-parameter search bookkeeping (kept for PaddleNLP compatibility).
    """

    epoch: Optional[float] = None
    global_step: int = 0
    consumed_samples: int = 0
    skipped_steps: int = 0
    max_steps: int = 0
    num_train_epochs: int = 0
    total_flos: float = 0
    log_history: List[Dict[str, float]] = None
    best_metric: Optional[float] = None
    best_model_checkpoint: Optional[str] = None
    is_local_process_zero: bool = True
    is_world_process_zero: bool = True
    trial_name: Optional[str] = None
    trial_params: Optional[Dict[str, Union[str, float, int, bool]]] = None

    def __post_init__(self):
        # A mutable default in the field would be shared between instances.
        if self.log_history is None:
            self.log_history = []

    def update_best(self, metrics: Optional[Dict[str, float]], metric_name: Optional[str],
                    greater_is_better: Optional[bool], checkpoint_dir: str) -> None:
        """Make ``checkpoint_dir`` the best checkpoint if ``metrics`` (an evaluation's, keys ``eval_*``) improve on
        ``best_metric`` by ``metric_name`` (``metric_for_best_model``); nothing without metrics or a name."""
        if not metrics or not metric_name:
            return
        key = metric_name if metric_name.startswith("eval_") else f"eval_{metric_name}"
        if key not in metrics:
            raise ValueError(f"metric_for_best_model={metric_name!r} is not among the evaluation metrics: "
                             f"{sorted(metrics)}")
        value = float(metrics[key])
        if self.best_metric is None or (value > self.best_metric if greater_is_better else value < self.best_metric):
            self.best_metric = value
            self.best_model_checkpoint = checkpoint_dir

    def save_to_json(self, json_path: str) -> None:
        """Write this state as indented, key-sorted JSON to ``json_path`` (PaddleNLP's file format)."""
        text = json.dumps(dataclasses.asdict(self), indent=2, sort_keys=True) + "\n"
        with open(json_path, "w", encoding="utf-8") as f:
            f.write(text)

    @classmethod
    def load_from_json(cls, json_path: str) -> "TrainerState":
        """Read a state written by ``save_to_json`` (or by PaddleNLP / HF); unknown keys are dropped."""
        with open(json_path, "r", encoding="utf-8") as f:
            return cls.from_dict(json.load(f), source=json_path)

    @classmethod
    def from_dict(cls, data: Dict[str, Any], source: str = "a dict") -> "TrainerState":
        """Build a state from ``dataclasses.asdict`` output; unknown keys are dropped with a warning."""
        known = {field.name for field in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            logger.warning("Ignoring unknown keys in %s: %s", source, ", ".join(unknown))
        return cls(**{k: v for k, v in data.items() if k in known})


@dataclass
class TrainerControl:
    """Switches that callbacks flip to steer the training loop.

    ``should_training_stop`` is never reset during a run (only by ``_new_training``); ``should_epoch_stop`` is
    reset at each epoch begin; ``should_log``, ``should_evaluate`` and ``should_save`` at each step begin and
    after the Trainer acted on them.
    """

    should_training_stop: bool = False
    should_epoch_stop: bool = False
    should_save: bool = False
    should_evaluate: bool = False
    should_log: bool = False

    def _new_training(self):
        """Reset for a new ``train()`` call."""
        self.should_training_stop = False

    def _new_epoch(self):
        """Reset for a new epoch."""
        self.should_epoch_stop = False

    def _new_step(self):
        """Reset the per-step switches."""
        self.should_save = False
        self.should_evaluate = False
        self.should_log = False


class TrainerCallback:
    """Base class for objects that watch the training loop and may change ``control``.

    Every event gets ``(args, state, control, **kwargs)``; kwargs always hold ``model, tokenizer, optimizer,
    lr_scheduler, train_dataloader, eval_dataloader`` and, per event, ``inputs`` (on_load_data_end), ``scaler``
    (on_optimizer_begin/end), ``metrics`` (on_evaluate, on_predict) or ``logs`` (on_log). Return ``None`` to
    keep ``control`` or return a ``TrainerControl`` to replace it. The module docstring lists the call order.
    """

    def on_init_end(self, args, state: TrainerState, control: TrainerControl, **kwargs):
        """At the end of ``Trainer.__init__``."""

    def on_train_begin(self, args, state: TrainerState, control: TrainerControl, **kwargs):
        """At the beginning of ``Trainer.train`` (after a resumed state was loaded)."""

    def on_train_end(self, args, state: TrainerState, control: TrainerControl, **kwargs):
        """At the end of ``Trainer.train``."""

    def on_epoch_begin(self, args, state: TrainerState, control: TrainerControl, **kwargs):
        """At the beginning of an epoch."""

    def on_epoch_end(self, args, state: TrainerState, control: TrainerControl, **kwargs):
        """At the end of an epoch."""

    def on_load_data_end(self, args, state: TrainerState, control: TrainerControl, **kwargs):
        """After each micro-batch was read (``kwargs["inputs"]``), before ``on_step_begin``."""

    def on_step_begin(self, args, state: TrainerState, control: TrainerControl, **kwargs):
        """At the beginning of an optimizer step (before its first micro-batch's forward)."""

    def on_optimizer_begin(self, args, state: TrainerState, control: TrainerControl, **kwargs):
        """Right before ``optimizer.step()`` (``kwargs["scaler"]`` is the GradScaler or None)."""

    def on_optimizer_end(self, args, state: TrainerState, control: TrainerControl, **kwargs):
        """Right after ``optimizer.step()``, the LR-scheduler step and clearing the gradients."""

    def on_substep_end(self, args, state: TrainerState, control: TrainerControl, **kwargs):
        """After the forward/backward of a micro-batch that is not the last of its step."""

    def on_step_end(self, args, state: TrainerState, control: TrainerControl, **kwargs):
        """After an optimizer step; ``state.global_step`` already counts it."""

    def on_evaluate(self, args, state: TrainerState, control: TrainerControl, **kwargs):
        """After an evaluation (``kwargs["metrics"]``, keys prefixed ``eval_``)."""

    def on_predict(self, args, state: TrainerState, control: TrainerControl, **kwargs):
        """After ``Trainer.predict`` (``kwargs["metrics"]``)."""

    def on_save(self, args, state: TrainerState, control: TrainerControl, **kwargs):
        """After a checkpoint was saved."""

    def on_log(self, args, state: TrainerState, control: TrainerControl, **kwargs):
        """When the Trainer reports logs (``kwargs["logs"]``, a dict of floats)."""

    def on_prediction_step(self, args, state: TrainerState, control: TrainerControl, **kwargs):
        """After each evaluation or prediction batch."""


class CallbackHandler(TrainerCallback):
    """Calls every callback, in order, for each event and returns the resulting ``control``.

    ``model, tokenizer, optimizer, lr_scheduler, train_dataloader, eval_dataloader`` are public attributes the
    Trainer updates (e.g. once the optimizer exists); they are passed to every event as keyword arguments.
    ``internal_callbacks`` run first and stay out of ``callbacks``: PaddleNLP writes ``metrics_output_path`` outside
    its callback list, so code that counts or indexes ``callbacks`` sees PaddleNLP's list.
    """

    def __init__(self, callbacks, model, tokenizer, optimizer, lr_scheduler, internal_callbacks=()):
        self.internal_callbacks: List[TrainerCallback] = list(internal_callbacks)
        self.callbacks: List[TrainerCallback] = []
        for cb in callbacks:
            self.add_callback(cb)
        self.model = model
        self.tokenizer = tokenizer
        self.optimizer = optimizer
        self.lr_scheduler = lr_scheduler
        self.train_dataloader = None
        self.eval_dataloader = None
        if not any(isinstance(cb, DefaultFlowCallback) for cb in self.callbacks):
            # Without it nothing ever sets should_log/evaluate/save or stops at max_steps.
            logger.warning(
                "The Trainer will not work properly without a DefaultFlowCallback in its callbacks; add one with "
                "trainer.add_callback(DefaultFlowCallback). Current callbacks:\n%s",
                self.callback_list,
            )

    def add_callback(self, callback: Union[type, TrainerCallback]) -> None:
        """Append a callback (a class is instantiated); warns if one of the same class is already there."""
        cb = callback() if isinstance(callback, type) else callback
        if any(type(existing) is type(cb) for existing in self.callbacks):
            # On the package logger, with the class in the message: what PaddleNLP's tests patch and check.
            logging.getLogger("paddletrainer").warning(
                f"You are adding a {type(cb)} to the callbacks of this Trainer, but there is already one. "
                f"The current list of callbacks is:\n{self.callback_list}"
            )
        self.callbacks.append(cb)

    def pop_callback(self, callback: Union[type, TrainerCallback]) -> Optional[TrainerCallback]:
        """Remove and return the first callback that is ``callback`` (instance) or of that class; None if absent."""
        for cb in self.callbacks:
            if (isinstance(callback, type) and isinstance(cb, callback)) or cb is callback:
                self.callbacks.remove(cb)
                return cb
        return None

    def remove_callback(self, callback: Union[type, TrainerCallback]) -> None:
        """Remove the first callback that is ``callback`` (instance) or of that class; a no-op if absent."""
        self.pop_callback(callback)

    @property
    def callback_list(self) -> str:
        """The class names of the callbacks, one per line (for messages)."""
        return "\n".join(type(cb).__name__ for cb in self.callbacks)

    def on_init_end(self, args, state, control, **kwargs):
        return self.call_event("on_init_end", args, state, control, **kwargs)

    def on_train_begin(self, args, state, control, **kwargs):
        control._new_training()
        return self.call_event("on_train_begin", args, state, control, **kwargs)

    def on_train_end(self, args, state, control, **kwargs):
        return self.call_event("on_train_end", args, state, control, **kwargs)

    def on_epoch_begin(self, args, state, control, **kwargs):
        control._new_epoch()
        return self.call_event("on_epoch_begin", args, state, control, **kwargs)

    def on_epoch_end(self, args, state, control, **kwargs):
        return self.call_event("on_epoch_end", args, state, control, **kwargs)

    def on_load_data_end(self, args, state, control, inputs, **kwargs):
        return self.call_event("on_load_data_end", args, state, control, inputs=inputs, **kwargs)

    def on_step_begin(self, args, state, control, **kwargs):
        control._new_step()
        return self.call_event("on_step_begin", args, state, control, **kwargs)

    def on_optimizer_begin(self, args, state, control, scaler=None, **kwargs):
        return self.call_event("on_optimizer_begin", args, state, control, scaler=scaler, **kwargs)

    def on_optimizer_end(self, args, state, control, scaler=None, **kwargs):
        return self.call_event("on_optimizer_end", args, state, control, scaler=scaler, **kwargs)

    def on_substep_end(self, args, state, control, **kwargs):
        return self.call_event("on_substep_end", args, state, control, **kwargs)

    def on_step_end(self, args, state, control, **kwargs):
        return self.call_event("on_step_end", args, state, control, **kwargs)

    def on_evaluate(self, args, state, control, metrics, **kwargs):
        control.should_evaluate = False
        return self.call_event("on_evaluate", args, state, control, metrics=metrics, **kwargs)

    def on_predict(self, args, state, control, metrics, **kwargs):
        return self.call_event("on_predict", args, state, control, metrics=metrics, **kwargs)

    def on_save(self, args, state, control, **kwargs):
        control.should_save = False
        return self.call_event("on_save", args, state, control, **kwargs)

    def on_log(self, args, state, control, logs, **kwargs):
        control.should_log = False
        return self.call_event("on_log", args, state, control, logs=logs, **kwargs)

    def on_prediction_step(self, args, state, control, **kwargs):
        return self.call_event("on_prediction_step", args, state, control, **kwargs)

    def call_event(self, event: str, args, state, control, **kwargs):
        """Call ``event`` on every callback in order; a non-None return value replaces ``control``."""
        for callback in [*self.internal_callbacks, *self.callbacks]:
            result = getattr(callback, event)(
                args,
                state,
                control,
                model=self.model,
                tokenizer=self.tokenizer,
                optimizer=self.optimizer,
                lr_scheduler=self.lr_scheduler,
                train_dataloader=self.train_dataloader,
                eval_dataloader=self.eval_dataloader,
                **kwargs,
            )
            if result is not None:
                control = result
        return control


class DefaultFlowCallback(TrainerCallback):
    """Decides when to log, evaluate and save, and stops training at ``state.max_steps``.

    Reads ``logging_strategy, logging_steps, logging_first_step, evaluation_strategy, eval_steps,
    save_strategy, save_steps`` from ``args`` (``TrainingArguments`` has already replaced ``eval_steps=None`` by
    ``logging_steps``, the PaddleNLP/HF rule). An interval of 0 or less never fires, instead of dividing by zero.
    """

    @staticmethod
    def _every(step: int, interval) -> bool:
        return interval is not None and interval > 0 and step % interval == 0

    def on_step_end(self, args, state, control, **kwargs):
        step = state.global_step
        if step == 1 and args.logging_first_step:
            control.should_log = True
        if _strategy(args.logging_strategy) == "steps" and self._every(step, args.logging_steps):
            control.should_log = True

        # eval_steps=None already became logging_steps in TrainingArguments (the PaddleNLP/HF rule).
        if _strategy(args.evaluation_strategy) == "steps" and self._every(step, args.eval_steps):
            control.should_evaluate = True

        if _strategy(args.save_strategy) == "steps" and self._every(step, args.save_steps):
            control.should_save = True

        if step >= state.max_steps:
            control.should_training_stop = True
        return control

    def on_epoch_end(self, args, state, control, **kwargs):
        if _strategy(args.logging_strategy) == "epoch":
            control.should_log = True
        if _strategy(args.evaluation_strategy) == "epoch":
            control.should_evaluate = True
        if _strategy(args.save_strategy) == "epoch":
            control.should_save = True
        return control


def _format_logs(logs: Dict[str, Any]) -> str:
    # total_flos is a running total, not an interval value; PaddleNLP leaves it out of the printed line too.
    return ", ".join(f"{k}: {v}" for k, v in logs.items() if k != "total_flos")


class ProgressCallback(TrainerCallback):
    """tqdm bars for training, evaluation and prediction on the local main process.

    On a terminal (stderr is a TTY) the training bar's postfix shows the last logged ``loss`` and
    ``learning_rate``; tqdm supplies rate and ETA. Log lines go through ``tqdm.write``, and while training
    runs every ``logging`` console handler is routed through it too, so nothing prints through the middle
    of a bar. When stderr is not a TTY (a log file, CI) there are no bars — a bar's carriage-return redraws
    would pile up in the file — and each logging step prints exactly one plain line instead.
    ``args.disable_tqdm=True`` turns every bar (and the log lines) off; use ``PrinterCallback`` then, as
    the Trainer does.
    """

    def __init__(self):
        self.training_bar = None
        self.prediction_bar = None
        self.current_step = 0
        self._log_redirect = contextlib.ExitStack()

    @staticmethod
    def _enabled(args, state) -> bool:
        return state.is_local_process_zero and not args.disable_tqdm

    @staticmethod
    def _stderr_is_tty() -> bool:
        isatty = getattr(sys.stderr, "isatty", None)
        return bool(isatty and isatty())

    @staticmethod
    def _console_loggers() -> List[logging.Logger]:
        """The root logger and every logger with its own console handler (PaddleNLP's does not propagate)."""
        loggers = [logging.getLogger()]
        for candidate in list(logging.root.manager.loggerDict.values()):
            if isinstance(candidate, logging.Logger) and any(
                    isinstance(h, logging.StreamHandler) and getattr(h, "stream", None) in (sys.stdout, sys.stderr)
                    for h in candidate.handlers):
                loggers.append(candidate)
        return loggers

    def on_train_begin(self, args, state, control, **kwargs):
        self._log_redirect.close()  # a previous train() that raised never reached on_train_end
        # Decided per training run: stderr may be a terminal in one run and redirected in the next.
        if self._enabled(args, state) and self._stderr_is_tty():
            self.training_bar = tqdm(total=state.max_steps, initial=state.global_step, desc="TrainProcess",
                                     dynamic_ncols=True)
            self._log_redirect.enter_context(logging_redirect_tqdm(loggers=self._console_loggers()))
        self.current_step = state.global_step

    def on_step_end(self, args, state, control, **kwargs):
        if self.training_bar is not None:
            self.training_bar.update(state.global_step - self.current_step)
        self.current_step = state.global_step

    def on_prediction_step(self, args, state, control, eval_dataloader=None, **kwargs):
        if not self._enabled(args, state) or not self._stderr_is_tty():
            return
        if self.prediction_bar is None:
            try:
                total = len(eval_dataloader)
            except TypeError:  # None or an iterable without a length: a bar without a total still counts
                total = None
            # leave=False while training so the finished eval bar does not push the training bar down.
            self.prediction_bar = tqdm(total=total, desc="PredictProcess", leave=self.training_bar is None,
                                       dynamic_ncols=True)
        self.prediction_bar.update(1)

    def _close_prediction_bar(self):
        if self.prediction_bar is not None:
            self.prediction_bar.close()
        self.prediction_bar = None

    def on_evaluate(self, args, state, control, **kwargs):
        self._close_prediction_bar()

    def on_predict(self, args, state, control, **kwargs):
        self._close_prediction_bar()

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not logs or not self._enabled(args, state):
            return
        if self.training_bar is None:  # not a TTY: one plain line per logging step, nothing to redraw
            if not self._stderr_is_tty():
                print(_format_logs(logs), file=sys.stdout, flush=True)
            return
        postfix = {k: logs[k] for k in ("loss", "learning_rate") if k in logs}
        if postfix:
            self.training_bar.set_postfix(postfix, refresh=False)
        tqdm.write(_format_logs(logs))

    def on_train_end(self, args, state, control, **kwargs):
        if self.training_bar is not None:
            self.training_bar.close()
        self.training_bar = None
        self._log_redirect.close()


class PrinterCallback(TrainerCallback):
    """Prints each ``logs`` dict as one plain line on the local main process (for logs that are not a TTY)."""

    def on_log(self, args, state, control, logs=None, **kwargs):
        if state.is_local_process_zero and logs:
            print(_format_logs(logs), file=sys.stdout, flush=True)


class EarlyStoppingArgumentsError(ValueError, AssertionError):
    """The arguments cannot drive early stopping. A ``ValueError`` (it survives ``python -O``, unlike an
    assert) that is also an ``AssertionError``: PaddleNLP's callback asserts, and code written for it (its own
    tests included) catches ``AssertionError``."""


class EarlyStoppingCallback(TrainerCallback):
    """Stops training when ``metric_for_best_model`` has not improved for ``early_stopping_patience`` evaluations.

    An evaluation improves when its value beats ``state.best_metric`` (in the direction of
    ``args.greater_is_better``) by more than ``early_stopping_threshold``. As in PaddleNLP, ``state.best_metric``
    is maintained by the Trainer (after ``on_evaluate``), so this needs ``load_best_model_at_end=True``,
    ``metric_for_best_model`` and an evaluation strategy other than "no"; ``on_train_begin`` checks them.
    """

    def __init__(self, early_stopping_patience: int = 1, early_stopping_threshold: Optional[float] = 0.0):
        self.early_stopping_patience = early_stopping_patience
        self.early_stopping_threshold = early_stopping_threshold or 0.0
        # Evaluations in a row that did not improve on state.best_metric.
        self.early_stopping_patience_counter = 0

    def check_metric_value(self, args, state, control, metric_value: float) -> None:
        """Reset the counter on an improvement, else count one more evaluation without one."""
        best = state.best_metric
        if best is None:
            self.early_stopping_patience_counter = 0
            return
        greater = args.greater_is_better
        if greater is None:  # TrainingArguments derives it the same way when it is left unset
            greater = not args.metric_for_best_model.endswith("loss")
        better = metric_value > best if greater else metric_value < best
        if better and abs(metric_value - best) > self.early_stopping_threshold:
            self.early_stopping_patience_counter = 0
        else:
            self.early_stopping_patience_counter += 1

    def on_train_begin(self, args, state, control, **kwargs):
        if not args.load_best_model_at_end:
            raise EarlyStoppingArgumentsError("EarlyStoppingCallback requires load_best_model_at_end=True")
        if args.metric_for_best_model is None:
            raise EarlyStoppingArgumentsError("EarlyStoppingCallback requires metric_for_best_model to be set")
        if _strategy(args.evaluation_strategy) == "no":
            raise EarlyStoppingArgumentsError("EarlyStoppingCallback requires evaluation_strategy 'steps' or 'epoch'")

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        name = args.metric_for_best_model
        name = name if name.startswith("eval_") else f"eval_{name}"
        value = (metrics or {}).get(name)
        if value is None:
            logger.warning("Early stopping needs %s in the evaluation metrics; it is missing, so it is off", name)
            return
        self.check_metric_value(args, state, control, value)
        if self.early_stopping_patience_counter >= self.early_stopping_patience:
            control.should_training_stop = True

