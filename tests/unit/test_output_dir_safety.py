"""What is not ours in ``output_dir`` is never deleted or renamed, and one run at a time saves into it.

"Ours" is a ``checkpoint-N`` directory with both our completion marker and ``checkpoint_index.json``. A PaddleNLP
checkpoint, a user's ``checkpoint-3/my_results.csv`` or a plain file named ``checkpoint-4`` is refused at the start
of a run that could save those steps (naming them), ignored by ``save_total_limit`` rotation, and never touched by
a save. ``output_dir/.paddletrainer.lock`` keeps a second run out while one trains (naming the holder); a lock
left by a killed process of this host is taken over."""
import errno
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from paddletrainer import Trainer, TrainerCallback, TrainingArguments
from paddletrainer.checkpoint import CheckpointError, save_checkpoint
from paddletrainer.checkpoint import placement as L
from paddletrainer.checkpoint import output_lock
from paddletrainer.checkpoint.output_lock import LOCK_NAME, STALE_AFTER_SECONDS, OutputDirLockedError
from toy_models import RegressionModel, regression_data

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def args_for(out, **kw):
    base = dict(output_dir=str(out), per_device_train_batch_size=8, learning_rate=0.1, max_steps=5,
                logging_steps=1, save_strategy="steps", save_steps=1, save_total_limit=1, disable_tqdm=True,
                report_to="none", seed=42)
    base.update(kw)
    return TrainingArguments(**base)


def train(out, resume=None, **kw):
    trainer = Trainer(model=RegressionModel(), args=args_for(out, **kw), train_dataset=regression_data())
    trainer.train(resume_from_checkpoint=resume)
    return trainer


def plant_foreign(out):
    """A PaddleNLP-style checkpoint-2, a user's checkpoint-3/my_results.csv, a plain file checkpoint-4."""
    nlp = out / "checkpoint-2"
    nlp.mkdir(parents=True)
    (nlp / "model_state.pdparams").write_bytes(b"weights")
    (nlp / "trainer_state.json").write_text(json.dumps({"global_step": 2}))
    (out / "checkpoint-3").mkdir()
    (out / "checkpoint-3" / "my_results.csv").write_text("step,score\n3,0.9\n")
    (out / "checkpoint-4").write_text("a file, not a directory")


def tree(root, names):
    """Every file below the entries ``names`` of ``root`` with its bytes (what must survive untouched)."""
    found = {}
    for name in names:
        path = root / name
        files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
        found.update({str(p.relative_to(root)): p.read_bytes() for p in files})
    return found


FOREIGN = ["checkpoint-2", "checkpoint-3", "checkpoint-4"]


def test_a_fresh_run_beside_foreign_checkpoints_is_refused_at_start_naming_them(tmp_path):
    out = tmp_path / "out"
    plant_foreign(out)
    before = tree(out, FOREIGN)
    with pytest.raises(ValueError) as err:
        train(out)  # do_train is not set: the check holds for every train()
    text = str(err.value)
    for name in ("checkpoint-2", "checkpoint-3", "checkpoint-4 (a file)", "--overwrite_output_dir", "did not write"):
        assert name in text, text
    assert tree(out, FOREIGN) == before
    assert sorted(p.name for p in out.iterdir()) == FOREIGN  # nothing saved, nothing renamed, no lock left


@pytest.mark.parametrize("how", ["overwrite_output_dir", "resume_from_ours"])
def test_a_run_that_could_save_their_steps_is_refused_even_with_overwrite_output_dir(tmp_path, how):
    out = tmp_path / "out"
    kw, resume, steps = {}, None, "steps 1..5"
    if how == "overwrite_output_dir":
        kw["overwrite_output_dir"] = True
    else:
        steps = "steps 2..5"
        train(out, max_steps=1)  # our checkpoint-1, resumed below: steps 2..5 may be saved
        resume = True
    plant_foreign(out)
    before = tree(out, FOREIGN)
    with pytest.raises(ValueError) as err:
        train(out, resume=resume, **kw)
    text = str(err.value)
    assert steps in text and all(n in text for n in FOREIGN) and "even with --overwrite_output_dir" in text
    assert tree(out, FOREIGN) == before
    assert not (out / LOCK_NAME).exists()


def test_a_resumed_run_with_rotation_never_deletes_or_renames_what_is_not_ours(tmp_path, caplog):
    out = tmp_path / "out"
    train(out)  # ours: checkpoint-5 (save_total_limit=1)
    plant_foreign(out)
    copied = out / "checkpoint-1"  # a checkpoint copied without its index: has our marker, is not ours
    copied.mkdir()
    (copied / L.CHECKPOINT_COMPLETE_MARKER).write_bytes(b"")
    (copied / "notes.txt").write_text("keep me")
    user_tmp = out / "checkpoint-6.tmp-mine"  # named like our staging dirs, holding a user's file
    user_tmp.mkdir()
    (user_tmp / "my_results.csv").write_text("x")
    ours_tmp = out / "checkpoint-9.tmp-1700000000-deadbeef-1"  # a crashed save of ours: removed
    ours_tmp.mkdir()
    (ours_tmp / L.model_file_name(0, 0)).write_bytes(b"partial")
    (ours_tmp / L.TRAINER_STATE_NAME).write_text("{}")
    kept = FOREIGN + ["checkpoint-1", "checkpoint-6.tmp-mine"]
    before = tree(out, kept)

    with caplog.at_level(logging.WARNING):
        trainer = train(out, resume=True, max_steps=8)  # saves 6, 7, 8; rotation keeps one of ours
    assert trainer.state.global_step == 8
    assert tree(out, kept) == before
    assert sorted(p.name for p in out.iterdir()) == sorted(kept + ["checkpoint-8"])
    assert any("checkpoint-6.tmp-mine" in r.getMessage() and "left" in r.getMessage() for r in caplog.records)


def test_a_save_onto_a_foreign_entry_fails_and_leaves_it_as_it_was(tmp_path):
    out = tmp_path / "out"
    plant_foreign(out)
    before = tree(out, FOREIGN)
    for name in FOREIGN:
        with pytest.raises(CheckpointError, match=f"cannot save .*{name}.*did not write"):
            save_checkpoint(str(out / name), model=RegressionModel())
    assert tree(out, FOREIGN) == before
    assert sorted(p.name for p in out.iterdir()) == FOREIGN  # no tmp dir, nothing renamed aside


# ------------------------------------------------------------------------------------------------- the lock
HOLDER = """
import sys
from paddletrainer.checkpoint.output_lock import OutputDirLock
OutputDirLock(sys.argv[1]).acquire()
print("HELD", flush=True)
sys.stdin.read()
"""


def hold_lock(out):
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(out)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True, env=env)
    assert proc.stdout.readline().strip() == "HELD"
    return proc


def test_a_second_run_fails_fast_naming_the_holder_and_leaves_its_save_in_flight_alone(tmp_path):
    out = tmp_path / "out"
    in_flight = out / "checkpoint-3.tmp-1700000000-abcdef12-1"  # the holder's save being written
    proc = hold_lock(out)
    try:
        in_flight.mkdir()
        (in_flight / L.model_file_name(0, 0)).write_bytes(b"being written")
        with pytest.raises(OutputDirLockedError) as err:
            train(out, overwrite_output_dir=True)
        text = str(err.value)
        assert f"pid {proc.pid}" in text and socket.gethostname() in text and "one run per output_dir" in text
        assert isinstance(err.value, CheckpointError)  # main_guard: "error: ..." and exit 2
        assert in_flight.is_dir() and (out / LOCK_NAME).is_file()
        assert json.loads((out / LOCK_NAME).read_text())["pid"] == proc.pid  # the holder keeps its lock
    finally:
        proc.stdin.close()
        proc.wait(30)
    assert proc.returncode == 0 and not (out / LOCK_NAME).exists()  # released at the holder's exit
    train(out, overwrite_output_dir=True)  # now free


def test_what_output_dir_holds_is_checked_under_the_lock(tmp_path):
    """The check of output_dir's entries runs once the lock is taken (no window for another run between them):
    a run beside a live holder is told the directory is in use, not to move the holder's entries out."""
    out = tmp_path / "out"
    proc = hold_lock(out)
    try:
        plant_foreign(out)  # what the check alone would refuse
        with pytest.raises(OutputDirLockedError, match=f"pid {proc.pid}"):
            train(out)
    finally:
        proc.stdin.close()
        proc.wait(30)
    with pytest.raises(ValueError, match="did not write"):  # the holder is gone: now the check speaks
        train(out)
    assert not (out / LOCK_NAME).exists()  # released although the check raised


def test_a_stale_lock_of_a_killed_run_is_taken_over_with_a_warning(tmp_path, caplog):
    out = tmp_path / "out"
    proc = hold_lock(out)
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)
    assert json.loads((out / LOCK_NAME).read_text())["pid"] == proc.pid  # left behind
    with caplog.at_level(logging.WARNING):
        trainer = train(out)
    assert trainer.state.global_step == 5
    assert any("stale lock" in r.getMessage() and f"pid {proc.pid}" in r.getMessage() for r in caplog.records)
    assert not (out / LOCK_NAME).exists()


def test_a_lock_from_another_host_is_taken_over_only_once_its_heartbeat_is_stale(tmp_path, caplog):
    out = tmp_path / "out"
    out.mkdir()
    lock = {"format": "paddletrainer-output-lock", "host": "some-other-node", "pid": 1, "process_start": None,
            "started": "2026-01-01T00:00:00+00:00", "run_id": "r1", "output_dir": str(out)}
    (out / LOCK_NAME).write_text(json.dumps(lock))  # just renewed: that run may well be alive
    with pytest.raises(OutputDirLockedError, match=r"'some-other-node', pid 1.*last heartbeat was \d+ s ago.*delete"):
        train(out)
    assert json.loads((out / LOCK_NAME).read_text()) == lock
    old = time.time() - STALE_AFTER_SECONDS - 60
    os.utime(out / LOCK_NAME, (old, old))  # not renewed for longer than the stale limit: its host is gone
    with caplog.at_level(logging.WARNING):
        assert train(out).state.global_step == 5
    assert any("stale lock" in r.getMessage() and "some-other-node" in r.getMessage() for r in caplog.records)
    assert not (out / LOCK_NAME).exists()


def test_the_holder_renews_its_lock_while_it_runs(tmp_path, monkeypatch):
    monkeypatch.setattr(output_lock, "HEARTBEAT_SECONDS", 0.05)
    lock = output_lock.OutputDirLock(str(tmp_path)).acquire()
    try:
        old = time.time() - 1000
        os.utime(lock.path, (old, old))
        deadline = time.time() + 10
        while os.stat(lock.path).st_mtime <= old + 1 and time.time() < deadline:
            time.sleep(0.02)
        assert os.stat(lock.path).st_mtime > old + 1
    finally:
        lock.release()
    assert not os.path.exists(lock.path)


def test_an_unreadable_lock_file_is_refused_and_left_alone(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / LOCK_NAME).write_text("garbage")
    with pytest.raises(OutputDirLockedError, match="not a paddletrainer lock file"):
        train(out)
    assert (out / LOCK_NAME).read_text() == "garbage"


class Boom(TrainerCallback):
    """Records the lock while training, then fails at step 2."""

    def __init__(self, out):
        self.out, self.seen = out, None

    def on_step_end(self, args, state, control, **kwargs):
        self.seen = json.loads((self.out / LOCK_NAME).read_text())
        if state.global_step == 2:
            raise RuntimeError("boom")


def test_the_lock_is_held_by_this_process_during_train_and_released_when_train_raises(tmp_path):
    out = tmp_path / "out"
    boom = Boom(out)
    trainer = Trainer(model=RegressionModel(), args=args_for(out), train_dataset=regression_data(), callbacks=[boom])
    with pytest.raises(RuntimeError, match="boom"):
        trainer.train()
    assert boom.seen["pid"] == os.getpid() and boom.seen["host"] == socket.gethostname()
    assert not (out / LOCK_NAME).exists()
    train(out, resume=True)  # the next run takes it again


def test_on_a_filesystem_without_hard_links_the_lock_is_created_exclusively(tmp_path, monkeypatch):
    def no_links(src, dst):
        raise OSError(errno.EPERM, "hard links not supported")

    monkeypatch.setattr(os, "link", no_links)
    lock = output_lock.OutputDirLock(str(tmp_path)).acquire()
    try:
        assert json.loads(open(lock.path).read())["run_id"] == lock.run_id
        with pytest.raises(OutputDirLockedError, match="this process"):
            output_lock.OutputDirLock(str(tmp_path)).acquire()
    finally:
        lock.release()
    assert os.listdir(tmp_path) == []  # no private file left either
