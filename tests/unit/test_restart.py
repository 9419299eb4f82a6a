"""Automatic restart pieces that need no launch: ``resume_from_checkpoint=auto``, the cleanup of half-written
checkpoints when training starts, and the restart decisions of ``python -m paddletrainer.launch`` (the real
restarts under ``paddle.distributed.launch`` are in tests/distributed/test_robustness_sigkill.py)."""
import logging
import os

import pytest

from paddletrainer import Trainer
from paddletrainer import launch as restart_launch
from paddletrainer.checkpoint import CheckpointError
from paddletrainer.checkpoint.discovery import checkpoint_problem
from paddletrainer.checkpoint.discovery import resolve_resume_checkpoint
from toy_models import RegressionModel, regression_data, restart_args as args_for




def test_auto_starts_fresh_without_a_checkpoint_and_resumes_the_newest_complete_one(tmp_path):
    out = tmp_path / "out"
    assert resolve_resume_checkpoint("auto", str(out)) is None  # no output_dir yet: a fresh start
    first = Trainer(model=RegressionModel(), args=args_for(tmp_path, resume_from_checkpoint="auto"),
                    train_dataset=regression_data())
    first.train()
    assert first.state.global_step == 4
    (out / "checkpoint-6").mkdir()  # a save that never finished is not "newest"
    assert resolve_resume_checkpoint("auto", str(out)) == str(out / "checkpoint-4")
    again = Trainer(model=RegressionModel(), args=args_for(tmp_path, max_steps=6, resume_from_checkpoint="auto"),
                    train_dataset=regression_data())
    again.train()
    assert again.state.global_step == 6
    assert [h["step"] for h in again.state.log_history if "loss" in h] == [1, 2, 3, 4, 5, 6]


def test_half_written_checkpoints_of_a_crashed_attempt_are_deleted_when_training_starts(tmp_path):
    Trainer(model=RegressionModel(), args=args_for(tmp_path), train_dataset=regression_data()).train()
    out = tmp_path / "out"
    stale = out / "checkpoint-6.tmp-1700000000-deadbeef"
    stale.mkdir()
    (stale / "model_state.tp00_pp00.safetensors").write_bytes(b"half")
    trainer = Trainer(model=RegressionModel(), args=args_for(tmp_path, max_steps=5, save_steps=100,
                                                             resume_from_checkpoint="auto"),
                      train_dataset=regression_data())
    trainer.train()
    assert not stale.exists()
    assert trainer.state.global_step == 5  # resumed from checkpoint-4, not from the tmp dir


def _damage(ckpt_dir, how):
    shard = os.path.join(ckpt_dir, "model_state.tp00_pp00.safetensors")
    if how == "truncated":
        with open(shard, "r+b") as f:
            f.truncate(os.path.getsize(shard) - 4)
    elif how == "missing":
        os.remove(shard)
    else:  # the index is cut short: not JSON any more
        index = os.path.join(ckpt_dir, "checkpoint_index.json")
        data = open(index, "rb").read()
        open(index, "wb").write(data[: len(data) // 2])
    return os.path.basename(shard)


@pytest.mark.parametrize("how", ["truncated", "missing", "index"])
def test_auto_passes_over_a_damaged_newest_checkpoint_to_the_newest_sound_one(tmp_path, caplog, how):
    out = tmp_path / "out"
    Trainer(model=RegressionModel(), args=args_for(tmp_path), train_dataset=regression_data()).train()
    shard = _damage(str(out / "checkpoint-4"), how)  # marked complete, then damaged
    trainer = Trainer(model=RegressionModel(), args=args_for(tmp_path, max_steps=6, resume_from_checkpoint="auto"),
                      train_dataset=regression_data())
    with caplog.at_level(logging.WARNING, logger="paddletrainer.trainer"):
        trainer.train()
    assert trainer.state.global_step == 6
    assert [h["step"] for h in trainer.state.log_history if "loss" in h] == [1, 2, 3, 4, 5, 6]  # from checkpoint-2
    skipped = [r.getMessage() for r in caplog.records if "skipped the damaged checkpoint" in r.getMessage()]
    assert len(skipped) == 1 and str(out / "checkpoint-4") in skipped[0] and str(out / "checkpoint-2") in skipped[0]
    assert (shard if how != "index" else "checkpoint_index.json") in skipped[0]
    assert checkpoint_problem(str(out / "checkpoint-4")) is None  # step 4 was saved again


def test_auto_with_every_checkpoint_damaged_is_an_error_naming_them_not_a_fresh_start(tmp_path):
    out = tmp_path / "out"
    Trainer(model=RegressionModel(), args=args_for(tmp_path), train_dataset=regression_data()).train()
    for step in (2, 4):
        _damage(str(out / f"checkpoint-{step}"), "truncated")
    trainer = Trainer(model=RegressionModel(), args=args_for(tmp_path, max_steps=6, resume_from_checkpoint="auto"),
                      train_dataset=regression_data())
    with pytest.raises(CheckpointError, match=r"auto: every checkpoint .* is damaged \(checkpoint-4: .*checkpoint-2: "):
        trainer.train()
    assert trainer.state.global_step == 0


@pytest.mark.parametrize("argv,expected", [
    (["--max_restart", "2", "--nproc_per_node", "2", "train.py", "--max_restart", "9"],
     (2, ["--nproc_per_node", "2", "train.py", "--max_restart", "9"])),  # the script's own options are its own
    (["--max_restart=0", "train.py"], (0, ["train.py"])),
    (["--nproc_per_node", "2", "train.py"], (3, ["--nproc_per_node", "2", "train.py"])),
])
def test_max_restart_is_taken_from_the_launcher_arguments_only(argv, expected):
    assert restart_launch.split_max_restart(argv) == expected


@pytest.mark.parametrize("bad", ["-1", "two"])
def test_a_bad_max_restart_is_a_usage_error(bad, capsys):
    with pytest.raises(SystemExit) as info:
        restart_launch.split_max_restart(["--max_restart", bad, "train.py"])
    assert info.value.code == 2
    assert "error: argument --max_restart" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [
    ["--master", "etcd://127.0.0.1:2379", "--max_restart", "2", "train.py"],
    ["--max_restart=1", "--master=etcd://10.0.0.1:2379", "--nnodes", "2", "train.py"],
])
def test_max_restart_with_an_etcd_master_is_refused_as_two_stacked_restart_loops(argv, capsys, monkeypatch):
    monkeypatch.setattr(restart_launch._Supervisor, "run_once", lambda sup, attempt: pytest.fail("launched"))
    with pytest.raises(SystemExit) as info:
        restart_launch.main(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "error: --max_restart with --master etcd://" in err and "--elastic_level 1" in err


def test_an_etcd_master_runs_the_launch_once_paddle_restarts_it(monkeypatch):
    fake = FakeAttempts([241, 0])
    monkeypatch.setattr(restart_launch._Supervisor, "run_once", lambda sup, attempt: fake(sup, attempt))
    # the script's own --max_restart is its own; an HTTP master keeps this module's restarts
    assert restart_launch.main(["--master", "etcd://127.0.0.1:2379", "train.py", "--max_restart", "3"]) == 241
    assert fake.calls == [0]
    assert restart_launch.etcd_master(["--master", "127.0.0.1:8090", "train.py"]) is None


class FakeAttempts:
    """Stands in for one ``paddle.distributed.launch`` run per call: returns the next exit status."""

    def __init__(self, codes, stop_on=None):
        self.codes, self.calls, self.stop_on = list(codes), [], stop_on

    def __call__(self, sup, attempt):
        self.calls.append(attempt)
        if self.stop_on == attempt:
            sup.stop_signal = 15  # SIGTERM arrived during this attempt
        return self.codes.pop(0)


@pytest.mark.parametrize("codes,max_restart,stop_on,final,attempts", [
    ([241, 247, 0], 3, None, 0, [0, 1, 2]),        # killed ranks: restarted until it succeeds
    ([241, 241, 241], 2, None, 241, [0, 1, 2]),    # gives up after max_restart restarts
    ([2], 3, None, 2, [0]),                        # a usage error would fail again: no restart
    ([143], 3, 0, 143, [0]),                       # asked to stop: no restart
])
def test_the_launch_restarts_only_failures_that_a_restart_can_fix(monkeypatch, codes, max_restart, stop_on, final,
                                                                    attempts):
    fake = FakeAttempts(codes, stop_on)
    monkeypatch.setattr(restart_launch._Supervisor, "run_once", lambda sup, attempt: fake(sup, attempt))
    monkeypatch.setattr(restart_launch.time, "sleep", lambda s: None)
    assert restart_launch.main(["--max_restart", str(max_restart), "train.py"]) == final
    assert fake.calls == attempts


def test_restart_count_reaches_the_job(monkeypatch):
    seen = {}

    class Proc:
        def __init__(self, cmd, env):
            seen["cmd"], seen["count"] = cmd, env[restart_launch.RESTART_COUNT_ENV]

        def wait(self):
            return 0

    monkeypatch.setattr(restart_launch.subprocess, "Popen", Proc)
    assert restart_launch.main(["--nproc_per_node", "2", "train.py", "--lr", "1"]) == 0
    assert seen["cmd"][1:] == ["-m", "paddle.distributed.launch", "--nproc_per_node", "2", "train.py", "--lr", "1"]
    assert seen["count"] == "0"
    assert os.environ.get(restart_launch.RESTART_COUNT_ENV) is None


def test_a_kill_in_the_middle_of_rotation_leaves_no_half_deleted_checkpoint(tmp_path, monkeypatch):
    import paddle

    from paddletrainer.checkpoint import discovery, placement as L, list_complete_checkpoints, save_checkpoint

    model = paddle.nn.Linear(2, 2)
    for step in (1, 2, 3):
        save_checkpoint(str(tmp_path / f"checkpoint-{step}"), model=model, trainer_state={"global_step": step})
    monkeypatch.setattr(discovery.shutil, "rmtree", lambda *a, **k: None)  # the process dies before deleting files
    discovery.rotate_checkpoints(str(tmp_path), 2)
    names = os.listdir(tmp_path)
    published = sorted(n for n in names if L.parse_checkpoint_step(n) is not None)
    assert published == sorted(os.path.basename(c) for c in list_complete_checkpoints(str(tmp_path))), names
    assert published == ["checkpoint-2", "checkpoint-3"]
    monkeypatch.undo()
    discovery.remove_stale_tmp_dirs(str(tmp_path))  # what the next save or train() start does
    assert sorted(os.listdir(tmp_path)) == ["checkpoint-2", "checkpoint-3"]
