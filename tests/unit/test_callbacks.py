"""Callback events, the handler, the default flow, progress output and early stopping."""
import logging
import math
import sys
from types import SimpleNamespace

import pytest
from tqdm.std import tqdm as std_tqdm

from paddletrainer.trainer_callback import (
    CallbackHandler,
    DefaultFlowCallback,
    EarlyStoppingCallback,
    PrinterCallback,
    ProgressCallback,
    TrainerCallback,
    TrainerControl,
    TrainerState,
)
from paddletrainer.training_args import TrainingArguments

EVENTS = [
    "on_init_end", "on_train_begin", "on_train_end", "on_epoch_begin", "on_epoch_end", "on_load_data_end",
    "on_step_begin", "on_optimizer_begin", "on_optimizer_end", "on_substep_end", "on_step_end", "on_evaluate",
    "on_predict", "on_save", "on_log", "on_prediction_step",
]
COMMON_KWARGS = {"model", "tokenizer", "optimizer", "lr_scheduler", "train_dataloader", "eval_dataloader"}


def make_args(**overrides):
    """The TrainingArguments fields the callbacks read, with PaddleNLP's defaults."""
    fields = dict(
        logging_strategy="steps", logging_steps=500, logging_first_step=False,
        evaluation_strategy="no", eval_steps=None, save_strategy="steps", save_steps=500,
        disable_tqdm=False, metric_for_best_model=None, greater_is_better=None, load_best_model_at_end=False,
    )
    fields.update(overrides)
    return SimpleNamespace(**fields)


class Recorder(TrainerCallback):
    """Records (event, kwargs) of every call."""

    def __init__(self):
        self.calls = []

    def __getattribute__(self, name):
        if name in EVENTS:
            return lambda args, state, control, **kw: self.calls.append((name, kw))
        return object.__getattribute__(self, name)


def make_handler(*callbacks):
    return CallbackHandler(list(callbacks), model="M", tokenizer="T", optimizer="O", lr_scheduler="S")


def replay_training(handler, args, state, control, num_epochs, micro_batches_per_epoch, ga=1):
    """Drive the handler exactly as the callbacks module docstring says the Trainer does.

    Returns the flags seen after each on_step_end / on_epoch_end as (where, global_step, log, eval, save).
    """
    seen = []

    def maybe_log_save_evaluate():
        if control.should_log:
            handler.on_log(args, state, control, logs={"loss": 1.0})
        if control.should_evaluate:
            handler.on_prediction_step(args, state, control)
            handler.on_evaluate(args, state, control, metrics={"eval_loss": 1.0})
        if control.should_save:
            handler.on_save(args, state, control)

    steps_per_epoch = micro_batches_per_epoch // ga
    state.max_steps = steps_per_epoch * num_epochs
    control = handler.on_train_begin(args, state, control)
    for epoch in range(num_epochs):
        control = handler.on_epoch_begin(args, state, control)
        for micro in range(micro_batches_per_epoch):
            handler.on_load_data_end(args, state, control, inputs={"input_ids": micro})
            if micro % ga == 0:
                control = handler.on_step_begin(args, state, control)
            if micro % ga == ga - 1:
                handler.on_optimizer_begin(args, state, control, scaler=None)
                handler.on_optimizer_end(args, state, control, scaler=None)
                state.global_step += 1
                state.epoch = epoch + (micro + 1) / micro_batches_per_epoch
                control = handler.on_step_end(args, state, control)
                seen.append(("step", state.global_step, control.should_log, control.should_evaluate,
                             control.should_save))
                maybe_log_save_evaluate()
            else:
                control = handler.on_substep_end(args, state, control)
            if control.should_epoch_stop or control.should_training_stop:
                break
        control = handler.on_epoch_end(args, state, control)
        seen.append(("epoch", state.global_step, control.should_log, control.should_evaluate, control.should_save))
        maybe_log_save_evaluate()
        if control.should_training_stop:
            break
    handler.on_train_end(args, state, control)
    return seen


# --- TrainerState / TrainerControl -------------------------------------------------------------------------

def test_trainer_state_json_round_trip_keeps_every_field(tmp_path):
    state = TrainerState(epoch=1.5, global_step=30, consumed_samples=240, max_steps=60, num_train_epochs=3,
                         best_metric=0.25, best_model_checkpoint="out/checkpoint-20",
                         log_history=[{"loss": 1.5, "step": 10}])
    path = tmp_path / "trainer_state.json"
    state.save_to_json(str(path))
    assert TrainerState.load_from_json(str(path)) == state


def test_trainer_state_load_drops_unknown_keys_with_a_warning(tmp_path, caplog):
    path = tmp_path / "trainer_state.json"
    path.write_text('{"global_step": 7, "stateful_callbacks": {}}')
    with caplog.at_level(logging.WARNING):
        state = TrainerState.load_from_json(str(path))
    assert state.global_step == 7 and state.log_history == []
    assert "stateful_callbacks" in caplog.text


def test_trainer_states_do_not_share_log_history():
    a, b = TrainerState(), TrainerState()
    a.log_history.append({"loss": 1.0})
    assert b.log_history == []


def test_control_resets_touch_only_their_own_flags():
    control = TrainerControl(True, True, True, True, True)
    control._new_step()
    assert (control.should_log, control.should_evaluate, control.should_save) == (False, False, False)
    assert control.should_epoch_stop and control.should_training_stop
    control._new_epoch()
    assert not control.should_epoch_stop and control.should_training_stop
    control._new_training()
    assert not control.should_training_stop


# --- CallbackHandler ---------------------------------------------------------------------------------------

def test_base_callback_has_every_paddlenlp_event():
    for event in EVENTS:
        assert callable(getattr(TrainerCallback(), event)), event
        assert TrainerCallback().__getattribute__(event)(None, None, None) is None


def test_handler_passes_common_and_event_kwargs_to_every_callback():
    rec = Recorder()
    handler = make_handler(DefaultFlowCallback(), rec)
    handler.train_dataloader, handler.eval_dataloader = "TD", "ED"
    args, state, control = make_args(), TrainerState(), TrainerControl()
    event_kwargs = {"on_load_data_end": {"inputs": {"x": 1}}, "on_optimizer_begin": {"scaler": "GS"},
                    "on_optimizer_end": {"scaler": "GS"}, "on_evaluate": {"metrics": {"eval_loss": 1}},
                    "on_predict": {"metrics": {"test_loss": 2}}, "on_log": {"logs": {"loss": 3}}}
    for event in EVENTS:
        getattr(handler, event)(args, state, control, **event_kwargs.get(event, {}))
    assert [name for name, _ in rec.calls] == EVENTS
    for name, kwargs in rec.calls:
        assert {k: kwargs[k] for k in COMMON_KWARGS} == {"model": "M", "tokenizer": "T", "optimizer": "O",
                                                        "lr_scheduler": "S", "train_dataloader": "TD",
                                                        "eval_dataloader": "ED"}, name
        for key, value in event_kwargs.get(name, {}).items():
            assert kwargs[key] == value, name


def test_handler_keeps_control_when_callback_returns_none_and_replaces_it_otherwise():
    replacement = TrainerControl(should_training_stop=True)

    class Replace(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            return replacement

    class SeesReplacement(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            self.got = control

    original = TrainerControl()
    later = SeesReplacement()
    handler = make_handler(DefaultFlowCallback(), TrainerCallback(), Replace(), later)
    result = handler.on_step_end(make_args(), TrainerState(max_steps=10), original)
    assert result is replacement and later.got is replacement
    assert make_handler(DefaultFlowCallback()).on_epoch_begin(make_args(), TrainerState(), original) is original


def test_handler_resets_flags_before_the_matching_events():
    handler, args, state = make_handler(DefaultFlowCallback()), make_args(), TrainerState(max_steps=10)
    control = TrainerControl(True, True, True, True, True)
    handler.on_step_begin(args, state, control)
    assert not (control.should_log or control.should_evaluate or control.should_save)
    control.should_log = control.should_evaluate = control.should_save = True
    handler.on_log(args, state, control, logs={})
    handler.on_evaluate(args, state, control, metrics={})
    handler.on_save(args, state, control)
    assert not (control.should_log or control.should_evaluate or control.should_save)
    handler.on_epoch_begin(args, state, control)
    assert not control.should_epoch_stop and control.should_training_stop
    handler.on_train_begin(args, state, control)
    assert not control.should_training_stop


def test_add_pop_remove_by_class_and_by_instance():
    printer, progress = PrinterCallback(), ProgressCallback()
    handler = make_handler(DefaultFlowCallback, printer, progress)
    assert isinstance(handler.callbacks[0], DefaultFlowCallback)  # a class is instantiated
    assert handler.callback_list == "DefaultFlowCallback\nPrinterCallback\nProgressCallback"
    assert handler.pop_callback(PrinterCallback) is printer
    assert handler.pop_callback(printer) is None
    handler.remove_callback(progress)
    assert handler.callback_list == "DefaultFlowCallback"
    handler.add_callback(EarlyStoppingCallback)
    handler.remove_callback(EarlyStoppingCallback)
    handler.remove_callback(EarlyStoppingCallback)  # absent: no error
    assert handler.callback_list == "DefaultFlowCallback"


def test_adding_a_second_callback_of_the_same_class_warns(caplog):
    handler = make_handler(DefaultFlowCallback())
    with caplog.at_level(logging.WARNING):
        handler.add_callback(PrinterCallback())
    assert caplog.text == ""
    with caplog.at_level(logging.WARNING):
        handler.add_callback(PrinterCallback)
    assert "already one" in caplog.text and len(handler.callbacks) == 3


def test_handler_without_default_flow_callback_warns(caplog):
    with caplog.at_level(logging.WARNING):
        make_handler(PrinterCallback())
    assert "DefaultFlowCallback" in caplog.text


# --- the documented event order and DefaultFlowCallback --------------------------------------------------

def test_replay_follows_the_documented_event_order_with_gradient_accumulation():
    rec = Recorder()
    handler = make_handler(DefaultFlowCallback(), rec)
    args = make_args(logging_steps=1, save_strategy="no")
    state, control = TrainerState(), TrainerControl()
    handler.on_init_end(args, state, control)
    replay_training(handler, args, state, control, num_epochs=1, micro_batches_per_epoch=4, ga=2)
    one_step = ["on_load_data_end", "on_step_begin", "on_substep_end",  # micro-batch 1 of 2
                "on_load_data_end", "on_optimizer_begin", "on_optimizer_end", "on_step_end", "on_log"]
    expected = ["on_init_end", "on_train_begin", "on_epoch_begin"] + one_step * 2 + ["on_epoch_end", "on_train_end"]
    assert [name for name, _ in rec.calls] == expected
    assert state.global_step == 2 and state.epoch == 1.0


def test_default_flow_steps_strategy_flags_at_each_step(tmp_path):
    # real arguments: eval_steps=None becomes logging_steps there (the one home of that rule)
    args = TrainingArguments(output_dir=str(tmp_path), logging_steps=2, logging_first_step=True,
                             evaluation_strategy="steps", eval_steps=None, save_strategy="steps", save_steps=3)
    seen = replay_training(make_handler(DefaultFlowCallback()), args, TrainerState(), TrainerControl(),
                           num_epochs=2, micro_batches_per_epoch=3)
    step_rows = [row[1:] for row in seen if row[0] == "step"]
    assert step_rows == [
        # step, log (first step, then every 2), eval (eval_steps=None -> logging_steps), save (every 3)
        (1, True, False, False),
        (2, True, True, False),
        (3, False, False, True),
        (4, True, True, False),
        (5, False, False, False),
        (6, True, True, True),
    ]
    assert [row[2:] for row in seen if row[0] == "epoch"] == [(False, False, False)] * 2


def test_default_flow_epoch_strategy_sets_flags_only_at_epoch_end():
    args = make_args(logging_strategy="epoch", evaluation_strategy="epoch", save_strategy="epoch")
    seen = replay_training(make_handler(DefaultFlowCallback()), args, TrainerState(), TrainerControl(),
                           num_epochs=2, micro_batches_per_epoch=4, ga=2)
    assert seen == [("step", 1, False, False, False), ("step", 2, False, False, False),
                    ("epoch", 2, True, True, True),
                    ("step", 3, False, False, False), ("step", 4, False, False, False),
                    ("epoch", 4, True, True, True)]


def test_default_flow_accepts_enum_strategies_and_ignores_zero_intervals():
    class Strategy:  # an IntervalStrategy-like enum member: compared through .value
        def __init__(self, value):
            self.value = value

    args = make_args(logging_strategy=Strategy("steps"), logging_steps=1, evaluation_strategy=Strategy("no"),
                     save_strategy=Strategy("steps"), save_steps=0)
    control = DefaultFlowCallback().on_step_end(args, TrainerState(global_step=4, max_steps=9), TrainerControl())
    assert (control.should_log, control.should_evaluate, control.should_save) == (True, False, False)


def test_default_flow_stops_training_at_max_steps():
    handler, args = make_handler(DefaultFlowCallback()), make_args(save_strategy="no")
    state, control = TrainerState(max_steps=3), TrainerControl()
    control = handler.on_train_begin(args, state, control)
    stop_flags = []
    for _ in range(10):  # more batches than max_steps, as in an epoch longer than the run
        control = handler.on_step_begin(args, state, control)
        state.global_step += 1
        control = handler.on_step_end(args, state, control)
        stop_flags.append(control.should_training_stop)
        if control.should_training_stop:
            break
    assert stop_flags == [False, False, True]


# --- ProgressCallback / PrinterCallback ---------------------------------------------------------------------

def run_progress(disable_tqdm, eval_batches=2):
    handler = make_handler(DefaultFlowCallback(), ProgressCallback())
    handler.eval_dataloader = list(range(eval_batches))
    args = make_args(disable_tqdm=disable_tqdm, logging_steps=3, save_strategy="no",
                     evaluation_strategy="steps", eval_steps=3)
    state, control = TrainerState(max_steps=3), TrainerControl()
    handler.on_train_begin(args, state, control)
    for _ in range(3):
        handler.on_step_begin(args, state, control)
        state.global_step += 1
        handler.on_step_end(args, state, control)
    handler.on_log(args, state, control, logs={"loss": 0.5, "learning_rate": 0.001, "total_flos": 9.0})
    for _ in range(eval_batches):
        handler.on_prediction_step(args, state, control)
    handler.on_evaluate(args, state, control, metrics={"eval_loss": 0.4})
    handler.on_train_end(args, state, control)
    return handler.callbacks[1]


@pytest.fixture
def terminal(monkeypatch):
    """ProgressCallback draws bars only when stderr is a terminal; pytest's captured stderr is not one."""
    monkeypatch.setattr(ProgressCallback, "_stderr_is_tty", staticmethod(lambda: True))


def test_progress_bars_show_steps_loss_and_eval_when_tqdm_enabled(capsys, terminal):
    callback = run_progress(disable_tqdm=False)
    out, err = capsys.readouterr()
    assert "TrainProcess" in err and "3/3" in err
    assert "loss=0.5" in err and "learning_rate=0.001" in err  # the postfix
    assert "PredictProcess" in err  # the eval bar is not left behind during training (leave=False)
    assert "loss: 0.5, learning_rate: 0.001" in out and "total_flos" not in out
    assert callback.training_bar is None and callback.prediction_bar is None


def test_prediction_bar_outside_training_counts_batches_and_is_left_on_screen(capsys, terminal):
    callback, args, state = ProgressCallback(), make_args(), TrainerState()
    for _ in range(2):
        callback.on_prediction_step(args, state, TrainerControl(), eval_dataloader=[0, 1])
    callback.on_predict(args, state, TrainerControl(), metrics={})
    err = capsys.readouterr().err
    assert "PredictProcess" in err and "2/2" in err and callback.prediction_bar is None


def test_progress_without_a_terminal_prints_one_plain_line_per_log_and_no_bar(capsys):
    run_progress(disable_tqdm=False)
    out, err = capsys.readouterr()
    assert out == "loss: 0.5, learning_rate: 0.001\n"
    assert "TrainProcess" not in err and "PredictProcess" not in err and "\r" not in err


def test_logging_during_training_is_routed_through_tqdm_write_then_restored(terminal, monkeypatch):
    """A logger's console handler writing mid-training would print through the bar; it goes via tqdm.write."""
    written = []
    monkeypatch.setattr(std_tqdm, "write", classmethod(lambda cls, s, file=None, end="\n", nolock=False:
                                                        written.append(s)))
    console = logging.getLogger("test_progress_console_logger")
    handler = logging.StreamHandler(sys.stderr)
    monkeypatch.setattr(console, "handlers", [handler])
    monkeypatch.setattr(console, "propagate", False)
    callback, args, state = ProgressCallback(), make_args(), TrainerState(max_steps=2)
    callback.on_train_begin(args, state, TrainerControl())
    console.warning("checkpoint saved")
    callback.on_train_end(args, state, TrainerControl())
    assert written == ["checkpoint saved"]
    assert console.handlers == [handler]  # the original handler is back after training


def test_progress_prints_nothing_when_tqdm_disabled(capsys):
    run_progress(disable_tqdm=True)
    assert capsys.readouterr() == ("", "")


def test_progress_stays_silent_off_the_local_main_process(capsys):
    callback = ProgressCallback()
    state = TrainerState(max_steps=2, is_local_process_zero=False)
    callback.on_train_begin(make_args(), state, TrainerControl())
    callback.on_log(make_args(), state, TrainerControl(), logs={"loss": 1.0})
    callback.on_train_end(make_args(), state, TrainerControl())
    assert capsys.readouterr() == ("", "")


def test_printer_prints_one_plain_line_per_log_on_local_main_only(capsys):
    printer = PrinterCallback()
    printer.on_log(make_args(), TrainerState(), TrainerControl(), logs={"loss": 1.25, "global_step": 4})
    printer.on_log(make_args(), TrainerState(is_local_process_zero=False), TrainerControl(), logs={"loss": 9})
    assert capsys.readouterr().out == "loss: 1.25, global_step: 4\n"


# --- EarlyStoppingCallback ---------------------------------------------------------------------------------

def early_args(**overrides):
    return make_args(**{"load_best_model_at_end": True, "metric_for_best_model": "loss",
                        "greater_is_better": False, "evaluation_strategy": "steps", **overrides})


def evaluate_sequence(callback, args, values):
    """Feed eval values like the Trainer: on_evaluate, then best_metric updated. Returns stop flag per eval."""
    handler = make_handler(DefaultFlowCallback(), callback)
    state, control = TrainerState(), TrainerControl()
    handler.on_train_begin(args, state, control)
    stops = []
    for value in values:
        handler.on_evaluate(args, state, control, metrics={"eval_loss": value})
        stops.append(control.should_training_stop)
        better = state.best_metric is None or (value > state.best_metric if args.greater_is_better
                                               else value < state.best_metric)
        if better:
            state.best_metric = value
    return stops


def test_early_stopping_stops_after_patience_evaluations_without_improvement():
    stops = evaluate_sequence(EarlyStoppingCallback(early_stopping_patience=2), early_args(),
                              [1.0, 0.8, 0.9, 0.7, 0.75, 0.71])
    # 0.9 misses (1), 0.7 improves (reset), 0.75 misses (1), 0.71 misses (2) -> stop.
    assert stops == [False, False, False, False, False, True]


def test_early_stopping_threshold_counts_small_improvements_as_misses():
    stops = evaluate_sequence(EarlyStoppingCallback(1, early_stopping_threshold=0.05), early_args(),
                              [1.0, 0.97])
    assert stops == [False, True]


def test_early_stopping_with_greater_is_better_derived_from_the_metric_name():
    args = early_args(metric_for_best_model="eval_accuracy", greater_is_better=None)
    callback = EarlyStoppingCallback(1)
    state = TrainerState(best_metric=0.5)
    callback.on_evaluate(args, state, TrainerControl(), metrics={"eval_accuracy": 0.6})
    assert callback.early_stopping_patience_counter == 0
    callback.on_evaluate(args, state, TrainerControl(), metrics={"eval_accuracy": 0.4})
    assert callback.early_stopping_patience_counter == 1


@pytest.mark.parametrize("overrides, message", [
    ({"load_best_model_at_end": False}, "load_best_model_at_end"),
    ({"metric_for_best_model": None}, "metric_for_best_model"),
    ({"evaluation_strategy": "no"}, "evaluation_strategy"),
])
def test_early_stopping_rejects_arguments_it_cannot_work_with(overrides, message):
    with pytest.raises(ValueError, match=message):
        EarlyStoppingCallback().on_train_begin(early_args(**overrides), TrainerState(), TrainerControl())


def test_early_stopping_without_the_metric_warns_and_does_not_stop(caplog):
    control = TrainerControl()
    with caplog.at_level(logging.WARNING):
        EarlyStoppingCallback(1).on_evaluate(early_args(), TrainerState(best_metric=math.inf), control,
                                             metrics={"eval_accuracy": 1.0})
    assert "eval_loss" in caplog.text and not control.should_training_stop
