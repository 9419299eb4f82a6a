"""A save whose rename or rotation fails reports a CheckpointError naming the file (and never deletes the only copy);
rotation counts only sound checkpoints of ours and never deletes one holding a user's file; ``auto`` sets a damaged
checkpoint aside and falls back from one that turns out corrupt while loading. (The same failures on rank 0 of a
2-process save: tests/distributed/test_checkpoint_publish_failure.py.)"""
import errno
import logging
import os

import pytest

from paddletrainer import Trainer
from paddletrainer.checkpoint import CheckpointError, load_checkpoint, rotate_checkpoints, save_checkpoint
from paddletrainer.checkpoint import save as ckpt_io
from paddletrainer.checkpoint import placement as L
from paddletrainer.checkpoint.discovery import checkpoint_problem
from paddletrainer.trainer_checkpoints import _not_overwritten
from toy_models import RegressionModel, regression_data, restart_args as args_for

SHARD = L.model_file_name(0, 0)


def save(folder, step, **kw):
    return save_checkpoint(str(folder / f"checkpoint-{step}"), model=RegressionModel(), save_rng=False,
                           trainer_state={"global_step": step}, **kw)


def fail_rename_onto(monkeypatch, target):
    real = os.rename

    def rename(src, dst):
        if os.fspath(dst) == os.fspath(target) and ".tmp-" in os.path.basename(os.fspath(src)) \
                and "replaced" not in os.fspath(src):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), os.fspath(dst))
        return real(src, dst)
    monkeypatch.setattr(ckpt_io.os, "rename", rename)


# ------------------------------------------------------------------------------------------------ publish
def test_a_failed_rename_is_a_checkpoint_error_naming_it_and_the_complete_save_is_kept(tmp_path, monkeypatch):
    save(tmp_path, 1)
    fail_rename_onto(monkeypatch, tmp_path / "checkpoint-2")
    with pytest.raises(CheckpointError, match=r"checkpoint-2: renaming .* failed \(Permission denied\)") as info:
        save(tmp_path, 2)
    monkeypatch.undo()
    kept = [n for n in os.listdir(tmp_path) if n.startswith("checkpoint-2.tmp-")]
    assert len(kept) == 1 and f"left in {tmp_path / kept[0]}" in str(info.value)
    assert (tmp_path / kept[0] / L.CHECKPOINT_COMPLETE_MARKER).exists()  # the complete save, not deleted
    assert checkpoint_problem(str(tmp_path / "checkpoint-1")) is None


def test_a_failed_replacement_puts_the_old_checkpoint_of_that_step_back(tmp_path, monkeypatch):
    first = save(tmp_path, 2)
    fail_rename_onto(monkeypatch, tmp_path / "checkpoint-2")
    with pytest.raises(CheckpointError, match="was not published"):
        save(tmp_path, 2)
    monkeypatch.undo()
    assert load_checkpoint(first, model=RegressionModel()).trainer_state == {"global_step": 2}
    assert not [n for n in os.listdir(tmp_path) if "replaced" in n]


def test_a_failed_rotation_is_a_checkpoint_error_naming_the_file_and_the_save_stays_published(tmp_path, monkeypatch):
    save(tmp_path, 1)

    def refuse(*args, **kwargs):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(tmp_path / "checkpoint-1"))
    monkeypatch.setattr(ckpt_io, "rotate_checkpoints", refuse)
    with pytest.raises(CheckpointError, match=r"checkpoint-1: deleting old checkpoints \(save_total_limit=1\) failed "
                                              r"\(PermissionError: Permission denied\); checkpoint .*checkpoint-2 was published"):
        save(tmp_path, 2, save_total_limit=1)
    assert checkpoint_problem(str(tmp_path / "checkpoint-2")) is None


def test_a_failure_to_remove_stale_tmp_dirs_is_a_checkpoint_error(tmp_path, monkeypatch):
    def refuse(parent):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), os.path.join(parent, "output_dir.lock"))
    monkeypatch.setattr(ckpt_io, "remove_stale_tmp_dirs", refuse)
    with pytest.raises(CheckpointError, match=r"rank 0 failed preparing the save: PermissionError: .*output_dir.lock"):
        save(tmp_path, 1)
    assert os.listdir(tmp_path) == []


# ---------------------------------------------------------------------------------------- user files in ours
def test_rotation_leaves_a_checkpoint_of_ours_that_holds_a_users_file_and_names_it(tmp_path, caplog):
    for step in (1, 2):
        save(tmp_path, step)
    (tmp_path / "checkpoint-1" / "notes.txt").write_text("mine")
    (tmp_path / "checkpoint-1" / "eval").mkdir()
    with caplog.at_level(logging.WARNING):
        save(tmp_path, 3, save_total_limit=1)
    assert sorted(os.listdir(tmp_path)) == ["checkpoint-1", "checkpoint-3"]
    assert (tmp_path / "checkpoint-1" / "notes.txt").read_text() == "mine"
    warned = [r.getMessage() for r in caplog.records if "not deleting" in r.getMessage()]
    assert len(warned) == 1 and str(tmp_path / "checkpoint-1") in warned[0] and "eval, notes.txt" in warned[0]


def test_a_resave_of_a_step_whose_checkpoint_holds_a_users_file_is_refused(tmp_path):
    first = save(tmp_path, 2)
    (tmp_path / "checkpoint-2" / "notes.txt").write_text("mine")
    with pytest.raises(CheckpointError, match=r"cannot save .*checkpoint-2: a checkpoint of that step exists that "
                                              r"holds entries paddletrainer does not write \(notes.txt\)"):
        save(tmp_path, 2)
    assert (tmp_path / "checkpoint-2" / "notes.txt").read_text() == "mine"
    assert load_checkpoint(first, model=RegressionModel()).trainer_state == {"global_step": 2}
    assert os.listdir(tmp_path) == ["checkpoint-2"]  # nothing written: refused before the save began


# ---------------------------------------------------------------------------------------- damaged checkpoints
def truncate(ckpt_dir):
    path = os.path.join(ckpt_dir, SHARD)
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) - 4)


def test_rotation_counts_only_sound_checkpoints_and_keeps_the_newest_sound_one(tmp_path):
    for step in (4, 5, 8):
        save(tmp_path, step)
    truncate(tmp_path / "checkpoint-8")
    deleted = rotate_checkpoints(str(tmp_path), 1)
    assert deleted == [str(tmp_path / "checkpoint-4")]
    assert sorted(os.listdir(tmp_path)) == ["checkpoint-5", "checkpoint-8"]  # the damaged one: neither counted nor deleted


def test_checkpoint_problem_names_a_member_that_is_a_symlink_out_of_the_directory(tmp_path):
    ckpt_dir = save(tmp_path / "out", 1)
    outside = tmp_path / "elsewhere.json"
    os.replace(os.path.join(ckpt_dir, L.TRAINER_STATE_NAME), outside)
    os.symlink(outside, os.path.join(ckpt_dir, L.TRAINER_STATE_NAME))
    problem = checkpoint_problem(ckpt_dir)
    assert problem is not None and problem.startswith(f"{L.TRAINER_STATE_NAME}: is a symlink to {outside}")




def train(tmp_path, **kw):
    trainer = Trainer(model=RegressionModel(), args=args_for(tmp_path, **kw), train_dataset=regression_data())
    trainer.train()
    return trainer


def test_auto_sets_a_damaged_newest_checkpoint_aside_so_rotation_keeps_the_new_save(tmp_path, caplog):
    out = tmp_path / "out"
    train(tmp_path, max_steps=8, save_steps=4)  # checkpoint-4, checkpoint-8
    truncate(out / "checkpoint-8")
    with caplog.at_level(logging.WARNING, logger="paddletrainer.trainer"):
        trainer = train(tmp_path, max_steps=5, save_steps=5, save_total_limit=1, resume_from_checkpoint="auto")
    assert trainer.state.global_step == 5
    aside = [n for n in os.listdir(out) if n.startswith("checkpoint-8.damaged-")]
    assert sorted(n for n in os.listdir(out) if n.startswith("checkpoint-")) == ["checkpoint-5"] + aside
    assert len(aside) == 1 and checkpoint_problem(str(out / "checkpoint-5")) is None
    warned = [r.getMessage() for r in caplog.records if "skipped the damaged checkpoint" in r.getMessage()]
    assert len(warned) == 1 and f"moved it aside to {out / aside[0]}" in warned[0]


def flip_a_byte(ckpt_dir):
    path = os.path.join(ckpt_dir, SHARD)
    data = bytearray(open(path, "rb").read())
    data[-1] ^= 0xFF  # same size: only the crc32 tells
    open(path, "wb").write(bytes(data))


def test_auto_falls_back_to_the_next_older_checkpoint_when_the_chosen_one_is_corrupt(tmp_path, caplog):
    out = tmp_path / "out"
    train(tmp_path)  # checkpoint-2, checkpoint-4
    flip_a_byte(out / "checkpoint-4")
    assert checkpoint_problem(str(out / "checkpoint-4")) is None  # found only while loading
    with caplog.at_level(logging.WARNING, logger="paddletrainer.trainer"):
        trainer = train(tmp_path, max_steps=6, resume_from_checkpoint="auto")
    assert trainer.state.global_step == 6
    assert [h["step"] for h in trainer.state.log_history if "loss" in h] == [1, 2, 3, 4, 5, 6]  # from checkpoint-2
    warned = [r.getMessage() for r in caplog.records if "skipped the damaged checkpoint" in r.getMessage()]
    assert len(warned) == 1 and str(out / "checkpoint-4") in warned[0] and SHARD in warned[0]
    assert f"resuming from {out / 'checkpoint-2'}" in warned[0]
    assert [n for n in os.listdir(out) if n.startswith("checkpoint-4.damaged-")]


def test_a_fallback_checkpoint_lacking_what_the_failed_load_wrote_cannot_stand_in(tmp_path):
    model = RegressionModel()
    full = save_checkpoint(str(tmp_path / "checkpoint-2"), model=model, save_rng=False,
                           trainer_state={"global_step": 2})
    with_rng = save_checkpoint(str(tmp_path / "checkpoint-1"), model=model, save_rng=True,
                                   trainer_state={"global_step": 1})
    assert _not_overwritten(with_rng, full).startswith("it lacks rng_state.")
    assert _not_overwritten(full, with_rng) is None


def rank_1_reports(monkeypatch, trainer, outcome):
    """As if a second rank's load ended with ``outcome`` the first time (``(is_corrupt, message)``; None: loaded)."""
    calls = []

    def every_ranks_outcome(own):
        calls.append(own)
        return [own, outcome if len(calls) == 1 else None]
    monkeypatch.setattr(trainer, "_every_ranks_outcome", every_ranks_outcome)
    return calls


def test_every_rank_falls_back_when_another_rank_found_the_chosen_checkpoint_corrupt(tmp_path, monkeypatch):
    out = tmp_path / "out"
    train(tmp_path)  # checkpoint-2, checkpoint-4: sound for this rank
    trainer = Trainer(model=RegressionModel(), args=args_for(tmp_path, max_steps=6, resume_from_checkpoint="auto"),
                      train_dataset=regression_data())
    calls = rank_1_reports(monkeypatch, trainer, (True, "CheckpointCorruptError: corrupt checkpoint …: crc32"))
    trainer.train()
    assert calls == [None, None]  # this rank loaded checkpoint-4, then (with rank 1) checkpoint-2
    assert [h["step"] for h in trainer.state.log_history if "loss" in h] == [1, 2, 3, 4, 5, 6]
    assert [n for n in os.listdir(out) if n.startswith("checkpoint-4.damaged-")]


def test_a_load_failure_of_another_kind_on_another_rank_fails_this_rank_too(tmp_path, monkeypatch):
    train(tmp_path)
    trainer = Trainer(model=RegressionModel(), args=args_for(tmp_path, max_steps=6, resume_from_checkpoint="auto"),
                      train_dataset=regression_data())
    rank_1_reports(monkeypatch, trainer, (False, "CheckpointMismatchError: shape mismatch"))
    with pytest.raises(CheckpointError, match=r"rank 1 failed to load .*checkpoint-4: CheckpointMismatchError"):
        trainer.train()
