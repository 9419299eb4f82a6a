"""Writers (VisualDL, JSONL), build_writers and MetricsCallback, read back from disk."""
import glob
import json
import os
import socket
from types import SimpleNamespace

import pytest
from visualdl import LogReader, LogWriter

from paddletrainer.trainer_callback import TrainerControl, TrainerState
from paddletrainer.config.builders import metrics_config_of
from paddletrainer.metrics import (
    JsonlWriter,
    MetricsCallback,
    MetricsWriter,
    VisualDLCallback,
    VisualDLWriter,
    build_writers,
    rewrite_logs,
)


def read_visualdl(logdir):
    """The one vdlrecords file in logdir, as a LogReader (the file form: with VisualDL 2.5.3 the server-style
    ``LogReader(logdir=)`` returns no scalars)."""
    (path,) = glob.glob(os.path.join(logdir, "vdlrecords.*.log"))
    return LogReader(file_path=path)


def scalars(reader, tag):
    return [(record.id, record.value) for record in reader.get_data("scalar", tag)]


def read_jsonl(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def test_visualdl_writer_round_trip_scalars_text_and_bool_hparams(tmp_path):
    writer = VisualDLWriter(str(tmp_path / "run"))
    for step in (1, 2, 3):
        writer.log_scalars({"train/loss": 1.0 / step, "train/learning_rate": 1e-3, "note": "not a number"}, step)
    writer.log_text("args", '{"lr": 0.001}')
    # A bool here crashes VisualDL 2.5.3's add_hparams unless the writer turns it into a string.
    writer.log_hparams({"fp16": True, "lr": 1e-3, "steps": 3, "dir": None})
    writer.close()

    reader = read_visualdl(str(tmp_path / "run"))
    tags = reader.get_tags()
    assert sorted(tags["scalar"]) == ["train/learning_rate", "train/loss"]
    assert tags["text"] == ["args"] and "hyper_parameters" in tags
    assert [step for step, _ in scalars(reader, "train/loss")] == [1, 2, 3]
    assert [round(v, 6) for _, v in scalars(reader, "train/loss")] == [1.0, 0.5, round(1 / 3, 6)]
    assert reader.get_data("text", "args")[0].text.encoded_text_string == '{"lr": 0.001}'


def test_visualdl_writer_can_wrap_an_existing_log_writer(tmp_path):
    log_writer = LogWriter(logdir=str(tmp_path))
    writer = VisualDLWriter(log_writer=log_writer)
    writer.log_scalars({"train/loss": 2.0}, 5)
    writer.close()
    assert writer.logdir == str(tmp_path)
    assert scalars(LogReader(file_path=writer.file_path), "train/loss") == [(5, 2.0)]


def test_jsonl_writer_round_trip_with_strict_json_for_nan(tmp_path):
    path = tmp_path / "logs" / "metrics.jsonl"
    writer = JsonlWriter(str(path))
    writer.log_text("args", "line one\nline two")
    writer.log_scalars({"train/loss": 2.5, "train/grad_norm": float("nan"), "skip": "text"}, step=10)
    writer.log_hparams({"fp16": True, "path": path})
    writer.close()
    text, scalar, hparams = read_jsonl(path)
    assert (text["tag"], text["text"], text["step"]) == ("args", "line one\nline two", 0)
    assert scalar["step"] == 10 and scalar["train/loss"] == 2.5
    assert scalar["train/grad_norm"] is None and "skip" not in scalar
    assert isinstance(scalar["time"], float)
    assert hparams["hparams"] == {"fp16": True, "path": str(path)}


def test_jsonl_writer_appends_to_an_existing_file(tmp_path):
    path = str(tmp_path / "m.jsonl")
    for step in (1, 2):
        writer = JsonlWriter(path)
        writer.log_scalars({"train/loss": float(step)}, step)
        writer.close()
    assert [r["step"] for r in read_jsonl(path)] == [1, 2]


@pytest.mark.parametrize("report_to, expected", [
    ("visualdl", ["visualdl"]),
    (None, ["visualdl"]),  # PaddleNLP's default
    ("jsonl", ["jsonl"]),
    ("all", ["visualdl", "jsonl", "tensorboard"]),  # every local writer installed; wandb only when named
    (["jsonl", "visualdl", "jsonl"], ["jsonl", "visualdl"]),
    ("visualdl,jsonl", ["visualdl", "jsonl"]),
    ("none", []),
    (["none"], []),
    ([], []),
])
def test_build_writers_accepts_names_lists_all_and_none(tmp_path, report_to, expected):
    writers = build_writers(report_to, str(tmp_path))
    try:
        assert [w.name for w in writers] == expected
    finally:
        for writer in writers:
            writer.close()


def test_build_writers_rejects_unknown_names_listing_the_valid_ones_and_creates_nothing(tmp_path):
    with pytest.raises(ValueError, match="'comet'.*all, jsonl, none, tensorboard, visualdl, wandb"):
        build_writers(["visualdl", "comet"], str(tmp_path / "logs"))
    assert not (tmp_path / "logs").exists()
    with pytest.raises(ValueError, match="logging directory"):
        build_writers("jsonl", None)


def test_base_writer_methods_are_safe_no_ops():
    writer = MetricsWriter()
    writer.log_scalars({"a": 1.0}, 1)
    writer.log_text("t", "x")
    writer.log_hparams({})
    writer.flush()
    writer.close()


def test_rewrite_logs_groups_train_eval_and_test_keys():
    assert rewrite_logs({"loss": 1, "eval_loss": 2, "test_accuracy": 3, "train_runtime": 4}) == {
        "train/loss": 1, "eval/loss": 2, "test/accuracy": 3, "train/train_runtime": 4}


# --- MetricsCallback ---------------------------------------------------------------------------------------

class FakeArgs(SimpleNamespace):
    run_name = None

    @property
    def metrics_config(self):
        return metrics_config_of(self)

    def to_json_string(self):
        return json.dumps({"output_dir": self.output_dir, "fp16": False}, sort_keys=True)

    def to_sanitized_dict(self):
        return {"output_dir": self.output_dir, "fp16": False}  # a bool, as PaddleNLP's dict has


class FakeModel:
    """Shaped like paddle.DataParallel around a model with a config."""

    def __init__(self):
        self._layers = SimpleNamespace(config=SimpleNamespace(to_json_string=lambda: '{"hidden_size": 8}'))


def run_callback(callback, args, state):
    control = TrainerControl()
    callback.on_train_begin(args, state, control, model=FakeModel())
    for step in (1, 2):
        state.global_step = step
        callback.on_log(args, state, control, logs={"loss": 3.0 - step, "learning_rate": 1e-3,
                                                   "grad_norm": 0.5, "note": "skipped"})
    callback.on_log(args, state, control, logs={"eval_loss": 0.75, "eval_runtime": 1.5})
    callback.on_train_end(args, state, control)


def test_metrics_callback_writes_train_and_eval_scalars_and_run_info_to_both_writers(tmp_path):
    args = FakeArgs(output_dir=str(tmp_path), logging_dir=str(tmp_path / "vdl"), report_to=["visualdl", "jsonl"])
    callback = MetricsCallback()
    run_callback(callback, args, TrainerState())
    # train end flushes but keeps the writers: an evaluate() after train() goes to the same run file
    assert callback.writers is not None
    callback.close()
    assert callback.writers is None

    reader = read_visualdl(str(tmp_path / "vdl"))
    tags = reader.get_tags()
    assert sorted(tags["scalar"]) == ["eval/loss", "eval/runtime", "train/grad_norm", "train/learning_rate",
                                      "train/loss"]
    assert sorted(tags["text"]) == ["args", "model_config"]
    assert scalars(reader, "train/loss") == [(1, 2.0), (2, 1.0)]
    assert scalars(reader, "eval/loss") == [(2, 0.75)]

    records = read_jsonl(tmp_path / "vdl" / "metrics.jsonl")
    assert [r.get("tag") for r in records[:2]] == ["args", "model_config"]
    assert records[1]["text"] == '{"hidden_size": 8}'
    assert records[2]["hparams"] == {"output_dir": str(tmp_path), "fp16": False}
    assert [(r["step"], r.get("train/loss"), r.get("eval/loss")) for r in records[3:]] == [
        (1, 2.0, None), (2, 1.0, None), (2, None, 0.75)]


def test_metrics_callback_defaults_logging_dir_under_output_dir_runs(tmp_path):
    args = FakeArgs(output_dir=str(tmp_path), logging_dir=None, report_to="jsonl")
    callback = MetricsCallback()
    run_callback(callback, args, TrainerState())
    (run_dir,) = glob.glob(str(tmp_path / "runs" / "*"))
    assert callback.logging_dir == run_dir and os.path.basename(run_dir).endswith("_" + socket.gethostname())
    assert len(read_jsonl(os.path.join(run_dir, "metrics.jsonl"))) == 6


def test_metrics_callback_writes_nothing_off_world_rank_zero(tmp_path):
    args = FakeArgs(output_dir=str(tmp_path), logging_dir=str(tmp_path / "logs"), report_to="all")
    callback = MetricsCallback()
    run_callback(callback, args, TrainerState(is_world_process_zero=False, is_local_process_zero=True))
    assert not (tmp_path / "logs").exists() and callback.writers is None


def test_metrics_callback_opens_on_first_log_when_evaluating_without_training(tmp_path):
    args = FakeArgs(output_dir=str(tmp_path), logging_dir=str(tmp_path / "logs"), report_to="jsonl")
    callback = MetricsCallback()
    callback.on_log(args, TrainerState(global_step=7), TrainerControl(), logs={"eval_loss": 0.5})
    callback.writers[0].flush()
    records = read_jsonl(tmp_path / "logs" / "metrics.jsonl")
    assert records[-1]["step"] == 7 and records[-1]["eval/loss"] == 0.5


def test_visualdl_callback_takes_paddlenlp_arguments_and_uses_the_given_writer(tmp_path):
    callback = VisualDLCallback(vdl_writer=LogWriter(logdir=str(tmp_path)))
    args = FakeArgs(output_dir=str(tmp_path / "unused"), logging_dir=None, report_to="jsonl")
    run_callback(callback, args, TrainerState())
    assert scalars(read_visualdl(str(tmp_path)), "train/loss") == [(1, 2.0), (2, 1.0)]
    assert not (tmp_path / "unused").exists()


def test_tensorboard_callback_wraps_a_given_summary_writer(tmp_path):
    tensorboardX = pytest.importorskip("tensorboardX")
    event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    from paddletrainer.metrics import TensorBoardCallback

    callback = TensorBoardCallback(tb_writer=tensorboardX.SummaryWriter(logdir=str(tmp_path / "tb")))
    assert callback.tb_writer.log_dir == str(tmp_path / "tb")
    args = FakeArgs(output_dir=str(tmp_path / "unused"), logging_dir=None, report_to="jsonl")
    run_callback(callback, args, TrainerState())
    ea = event_accumulator.EventAccumulator(str(tmp_path / "tb"))
    ea.Reload()
    assert [(s.step, s.value) for s in ea.Scalars("train/loss")] == [(1, 2.0), (2, 1.0)]
    assert not (tmp_path / "unused").exists()


def opened_callback_counting_closes(tmp_path):
    """A MetricsCallback after a run with one JSONL writer, and the list its writer appends to on close."""
    args = FakeArgs(output_dir=str(tmp_path), logging_dir=str(tmp_path / "run"), report_to=["jsonl"])
    callback = MetricsCallback()
    run_callback(callback, args, TrainerState())
    (writer,) = callback.writers
    closed = []
    original_close = writer.close
    writer.close = lambda: (closed.append(True), original_close())
    return callback, closed


def test_a_dropped_metrics_callback_is_collected_and_closes_its_writers(tmp_path):
    # The writers must not keep a finished run's callback (and through it nothing else) alive until exit.
    import gc
    import weakref

    callback, closed = opened_callback_counting_closes(tmp_path)
    alive = weakref.ref(callback)
    del callback
    gc.collect()
    assert alive() is None and closed == [True]


def test_closing_a_metrics_callback_twice_closes_its_writers_once(tmp_path):
    callback, closed = opened_callback_counting_closes(tmp_path)
    callback.close()
    callback.close()
    assert closed == [True] and callback.writers is None


def test_a_missing_writer_library_is_named_before_any_process_group_exists(tmp_path, monkeypatch):
    import importlib.util

    import paddle

    import paddletrainer.trainer as trainer_mod
    from paddletrainer import Trainer, TrainingArguments

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a, **k: None if name == "wandb" else real_find_spec(name, *a, **k))
    monkeypatch.setattr(trainer_mod, "init_topology",
                        lambda *a, **k: pytest.fail("process groups were created before report_to was checked"))
    args = TrainingArguments(output_dir=str(tmp_path), report_to="wandb")
    hint = r"report_to=wandb needs the 'wandb' package: pip install \"paddletrainer\[wandb\]\"$"
    with pytest.raises(ImportError, match=hint):
        Trainer(model=paddle.nn.Linear(2, 2), args=args)


def test_each_backends_facts_live_on_its_writer_class(monkeypatch):
    import importlib.util

    from paddletrainer.metrics.callback import INTEGRATION_TO_CALLBACK, TensorBoardCallback, WandbCallback
    from paddletrainer.metrics.writers import WRITERS, TensorBoardWriter, check_report_to, writer_names

    assert all(cls.name == name for name, cls in WRITERS.items())
    assert {name: cls.library for name, cls in WRITERS.items()} == {
        "visualdl": None, "jsonl": None, "tensorboard": "tensorboardX", "wandb": "wandb"}
    assert INTEGRATION_TO_CALLBACK == {"visualdl": VisualDLCallback, "tensorboard": TensorBoardCallback,
                                       "wandb": WandbCallback}
    assert all(cb.writer_class is WRITERS[name] for name, cb in INTEGRATION_TO_CALLBACK.items())
    # the class's `library` decides what "all" expands to and the install hint; its `in_all` whether "all" takes it
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a, **k: None if name == "tensorboardX" else real_find_spec(name, *a, **k))
    assert writer_names("all") == ["visualdl", "jsonl"]
    with pytest.raises(ImportError, match=r"pip install \"paddletrainer\[tensorboard\]\"$"):
        check_report_to("tensorboard")
    monkeypatch.setattr(importlib.util, "find_spec", real_find_spec)
    monkeypatch.setattr(TensorBoardWriter, "in_all", False)
    assert writer_names("all,wandb") == ["visualdl", "jsonl", "wandb"]
