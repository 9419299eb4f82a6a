"""The startup report: every second from the process's start to the end of the first step in one phase, written
once per process to every reporting writer and as one readable line."""
import glob
import json
import logging
import time

import pytest

from paddletrainer import Trainer, TrainingArguments
from paddletrainer.metrics.startup import PHASES, StartupTimer, process_start_time, startup_line
from toy_models import RegressionModel, regression_data

KEYS = {f"startup/{phase}" for phase in PHASES} | {"startup/total"}


class FakeClock:
    def __init__(self, now):
        self.now = now

    def __call__(self):
        return self.now


def test_marks_split_the_time_to_the_first_step_and_other_takes_the_skipped_intervals():
    clock, reports = FakeClock(110.0), []
    timer = StartupTimer(imports_done=100.0, on_done=reports.append, process_start=90.0, clock=clock)
    clock.now = 113.0
    timer.topology_built(build_seconds=5.0)  # 2 s of it ran in the script, before Trainer()
    clock.now = 114.0
    timer.mark("model")
    clock.now = 120.0  # the script between Trainer() and train()
    timer.skip()
    clock.now = 121.0
    with timer.timed("optimizer"):
        clock.now = 124.0
    clock.now = 126.0
    timer.mark("wrap")  # 6 s since the skip, 3 of them the nested optimizer
    clock.now = 127.5
    timer.mark("first_batch")
    clock.now = 130.0
    timer.mark("first_step")
    clock.now = 140.0
    timer.mark("first_step")  # after the report: nothing
    (values,) = reports
    assert values == {"startup/import": 10.0, "startup/model": 9.0, "startup/topology": 5.0,
                      "startup/optimizer": 3.0, "startup/wrap": 3.0, "startup/first_batch": 1.5,
                      "startup/first_step": 2.5, "startup/other": 6.0, "startup/total": 40.0}
    assert sum(v for k, v in values.items() if k != "startup/total") == pytest.approx(values["startup/total"])


def test_the_process_start_is_the_kernels_and_precedes_this_test():
    start = process_start_time()
    assert start is not None and start < time.time() - 0.1  # the interpreter started before this line ran


def test_the_readable_line_names_every_phase_and_the_total():
    values = {key: 1.25 for key in KEYS}
    line = startup_line(values, rank=3)
    assert line.startswith("startup (rank 3): 1.2 s to the end of the first step = import 1.2 s, topology")
    assert all(phase.replace("_", " ") in line for phase in PHASES)


def test_a_training_run_writes_the_startup_seconds_once_to_visualdl_and_json_and_logs_one_line(tmp_path, caplog):
    from visualdl import LogReader

    args = TrainingArguments(output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, max_steps=3,
                             logging_steps=1, save_strategy="no", disable_tqdm=True, report_to="visualdl",
                             logging_dir=str(tmp_path / "vdl"), metrics_output_path=str(tmp_path / "json"))
    trainer = Trainer(model=RegressionModel(), args=args, train_dataset=regression_data(16))
    with caplog.at_level(logging.INFO, logger="paddletrainer.metrics.startup"):
        trainer.train()
        trainer.train()  # a second call reports nothing
    rows = [json.loads(line) for line in (tmp_path / "json" / "metrics_rank0.json").read_text().splitlines()]
    (startup,) = [r for r in rows if "startup/total" in r]
    assert KEYS <= set(startup) and startup["step"] == 0
    assert rows.index(startup) < min(i for i, r in enumerate(rows) if "train/loss" in r)  # before the first log
    parts = sum(startup[k] for k in KEYS - {"startup/total"})
    assert parts == pytest.approx(startup["startup/total"], abs=1e-3)
    assert startup["startup/import"] > 0 and startup["startup/first_step"] > 0
    (path,) = glob.glob(str(tmp_path / "vdl" / "**" / "vdlrecords.*.log"), recursive=True)
    reader = LogReader(file_path=path)
    assert KEYS <= set(reader.get_tags()["scalar"])
    assert len(reader.get_data("scalar", "startup/total")) == 1
    assert not any(k.startswith("startup/") for h in trainer.state.log_history for k in h)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("startup (rank 0)")]
    assert len(lines) == 1
