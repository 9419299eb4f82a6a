"""``output_dir``'s lock across an elastic restart on another host, and a run that loses its lock.

* A process of the same launch job (``PADDLE_JOB_ID`` or the launcher's ``--job_id``) takes over another host's
  lock at once, with a warning naming the old holder: an elastic restart whose rank 0 moved to another node does
  not fail (and burn a restart) for the 300 s the heartbeat needs to go stale. Another job is refused at once.
* A run whose lock file comes to name another run logs an error and its next save fails with a CheckpointError
  naming the new holder instead of writing into a directory another run owns."""
import json
import logging
import os
import subprocess
import sys
import time

import pytest

from paddletrainer import Trainer, TrainerCallback, TrainingArguments
from paddletrainer.checkpoint import output_lock
from paddletrainer.checkpoint import CheckpointError
from paddletrainer.checkpoint.output_lock import LOCK_NAME, OutputDirLockedError
from toy_models import RegressionModel, regression_data

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def train(out, callbacks=()):
    args = TrainingArguments(output_dir=str(out), per_device_train_batch_size=8, learning_rate=0.1, max_steps=4,
                             logging_steps=1, save_strategy="steps", save_steps=1, save_total_limit=1,
                             disable_tqdm=True, report_to="none", seed=42)
    trainer = Trainer(model=RegressionModel(), args=args, train_dataset=regression_data(), callbacks=list(callbacks))
    trainer.train()
    return trainer


def other_host_lock(out, job_id, run_id="r1", host="lost-node"):
    """A lock another host's rank 0 holds, renewed just now (its heartbeat is fresh)."""
    lock = {"format": "paddletrainer-output-lock", "host": host, "pid": 4242, "process_start": None,
            "started": "2026-01-01T00:00:00+00:00", "run_id": run_id, "job_id": job_id, "output_dir": str(out)}
    out.mkdir(exist_ok=True)
    (out / LOCK_NAME).write_text(json.dumps(lock))
    return lock


def test_an_elastic_restart_of_the_same_job_takes_another_hosts_lock_over_at_once(tmp_path, monkeypatch, caplog):
    out = tmp_path / "out"
    other_host_lock(out, job_id="job-7")
    monkeypatch.setenv("PADDLE_JOB_ID", "job-7")
    with caplog.at_level(logging.WARNING):
        assert train(out).state.global_step == 4
    taken = [r.getMessage() for r in caplog.records if "taking over" in r.getMessage()]
    assert taken and "'lost-node', pid 4242" in taken[0] and "job-7" in taken[0] and "elastic restart" in taken[0]
    assert not (out / LOCK_NAME).exists()


@pytest.mark.parametrize("job", [None, "default", "job-8"])
def test_another_job_is_still_refused_at_once_naming_the_holder(tmp_path, monkeypatch, job):
    out = tmp_path / "out"
    lock = other_host_lock(out, job_id="job-7")
    if job is None:
        monkeypatch.delenv("PADDLE_JOB_ID", raising=False)
    else:
        monkeypatch.setenv("PADDLE_JOB_ID", job)  # "default" is Paddle's id of every job without one
    with pytest.raises(OutputDirLockedError, match=r"'lost-node', pid 4242.*job_id 'job-7'.*last heartbeat"):
        train(out)
    assert json.loads((out / LOCK_NAME).read_text()) == lock


FAKE_LAUNCHER = """
import subprocess, sys
child = "from paddletrainer.checkpoint.output_lock import job_id; print(job_id())"
sys.exit(subprocess.call([sys.executable, "-c", child]))
"""


@pytest.mark.parametrize("launch_args, expected", [
    (["--job_id", "job-9", "train.py"], "job-9"),
    (["--nnodes", "2", "--job_id=job-10", "train.py", "--job_id", "not-this"], "job-10"),
    (["train.py", "--job_id", "the-script's"], "None"),
    (["--job_id", "default", "train.py"], "None"),
])
def test_a_worker_reads_the_job_id_from_its_launchers_command_line(launch_args, expected):
    """Paddle 3.3.1 exports no job id to workers: it is the parent's ``--job_id`` (before the script)."""
    env = {k: v for k, v in os.environ.items() if k != "PADDLE_JOB_ID"}
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    argv = [sys.executable, "-c", FAKE_LAUNCHER, "-m", "paddle.distributed.launch", *launch_args]
    out = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == expected


class TakenOver(TrainerCallback):
    """At step 2, another host's run of another job takes the lock over (as an elastic restart elsewhere would)."""

    def __init__(self, out):
        self.out = out

    def on_step_begin(self, args, state, control, **kwargs):
        if state.global_step == 1:
            other_host_lock(self.out, job_id="job-11", run_id="new-run", host="new-node")


def test_a_run_that_lost_its_lock_refuses_its_next_save_naming_the_new_holder(tmp_path, caplog):
    out = tmp_path / "out"
    with caplog.at_level(logging.ERROR), pytest.raises(CheckpointError, match=r"'new-node'.*run new-run.*took it over"):
        train(out, callbacks=[TakenOver(out)])
    assert any("LOST the lock" in r.getMessage() and "new-node" in r.getMessage() for r in caplog.records)
    assert sorted(p.name for p in out.iterdir() if p.name.startswith("checkpoint-")) == ["checkpoint-1"]
    assert json.loads((out / LOCK_NAME).read_text())["run_id"] == "new-run"  # the new holder's lock is left alone


def wait_for(predicate, seconds=10):
    deadline = time.time() + seconds
    while not predicate() and time.time() < deadline:
        time.sleep(0.02)
    return predicate()


def test_the_heartbeat_reports_a_lost_lock_and_stops_renewing_it(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(output_lock, "HEARTBEAT_SECONDS", 0.05)
    lock = output_lock.OutputDirLock(str(tmp_path)).acquire()
    try:
        with caplog.at_level(logging.ERROR):
            other_host_lock(tmp_path, job_id=None, run_id="thief")
            old = time.time() - 1000
            os.utime(lock.path, (old, old))
            assert wait_for(lambda: lock.lost_to is not None)
        assert lock.lost_to["run_id"] == "thief"
        assert any("LOST the lock" in r.getMessage() for r in caplog.records)
        time.sleep(0.3)
        assert os.stat(lock.path).st_mtime < old + 1  # never renews another run's lock
        with pytest.raises(CheckpointError, match="no longer this run's.*run thief"):
            output_lock.check_still_held(str(tmp_path))
    finally:
        lock.release()
    assert json.loads(open(lock.path).read())["run_id"] == "thief"  # release leaves it alone


def test_a_lock_removed_by_hand_while_held_is_taken_again_by_the_heartbeat(tmp_path, monkeypatch):
    monkeypatch.setattr(output_lock, "HEARTBEAT_SECONDS", 0.05)
    lock = output_lock.OutputDirLock(str(tmp_path)).acquire()
    try:
        os.unlink(lock.path)
        assert wait_for(lambda: os.path.exists(lock.path))
        assert json.loads(open(lock.path).read())["run_id"] == lock.run_id and lock.lost_to is None
        output_lock.check_still_held(str(tmp_path))  # still ours: saves go on
    finally:
        lock.release()
    assert not os.path.exists(lock.path)
