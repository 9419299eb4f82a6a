"""Which checkpoint a rollback may go back to (one process): none saved after the last step the replica check passed
(every save step is a check step, so each checkpoint holds verified weights; a checkpoint of diverged weights would
make the replicas agree again and hide the corruption), none newer than the current step (an earlier run's
checkpoint would roll *forward*), and no damaged one (passed over with a warning naming it)."""
import logging
import os

import paddle
import pytest

import paddletrainer.trainer_loop_state as loop_state_module
from paddletrainer import Trainer
from paddletrainer.checkpoint import placement as L
from paddletrainer.errors import ReplicaDivergenceError
from paddletrainer.runtime.replica_check import ReplicaCheck
from paddletrainer.trainer_callback import TrainerCallback
from toy_models import (ROLLBACK_BATCH as BATCH, PoisonAt, RegressionModel, poisonable, regression_data,
                        rollback_args as args_for)

PoisonableModel = poisonable(RegressionModel)




def fake_replicas(monkeypatch, every, diverge_at):
    """The loop's ReplicaCheck as if this rank had a replica checked every ``every`` steps whose weights differ at
    the steps ``diverge_at`` (each once); everything but the comparison itself is the real class."""
    pending = set(diverge_at)

    class OneRankReplicas(ReplicaCheck):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            self.every = every

        def _verdict(self, step):
            if step in pending:
                pending.discard(step)
                return ReplicaDivergenceError(f"step {step}: the replicas' weights diverged", step=step, ranks=[1])
            return None

    monkeypatch.setattr(loop_state_module, "ReplicaCheck", OneRankReplicas)


class DamageAt(TrainerCallback):
    """Truncates checkpoint ``name``'s model shard by 4 bytes at the start of step ``step``."""

    def __init__(self, out, name, step):
        self.path, self.step = os.path.join(str(out), name, L.model_file_name(0, 0)), step

    def on_step_begin(self, args, state, control, **kwargs):
        if state.global_step + 1 == self.step:
            os.truncate(self.path, os.path.getsize(self.path) - 4)


def test_a_divergence_rolls_back_to_the_newest_checkpoint_the_check_before_its_save_verified(
        tmp_path, monkeypatch, caplog):
    # checks every 3 steps and before every save (2, 4, ...): checkpoint-4 was verified when it was saved, so the
    # divergence found at step 6 goes back to it
    fake_replicas(monkeypatch, every=3, diverge_at=[6])
    trainer = Trainer(model=RegressionModel(), args=args_for(tmp_path / "out"), train_dataset=regression_data())
    with caplog.at_level(logging.WARNING, logger="paddletrainer.runtime.rollback"):
        trainer.train()
    out = str(tmp_path / "out")
    assert f"step 6: replica divergence; rolled back to {os.path.join(out, 'checkpoint-4')}" in caplog.text
    assert trainer.state.global_step == 10
    assert trainer.state.consumed_samples == (10 + 2) * BATCH  # steps 5-6 skipped


def test_a_divergence_found_before_the_first_save_has_no_checkpoint_to_go_back_to(tmp_path, monkeypatch):
    fake_replicas(monkeypatch, every=3, diverge_at=[2])  # the check before checkpoint-2's save finds it: no checkpoint
    trainer = Trainer(model=RegressionModel(), args=args_for(tmp_path / "out"), train_dataset=regression_data())
    with pytest.raises(ReplicaDivergenceError) as info:
        trainer.train()
    message = str(info.value)
    assert message.startswith("step 2: the replicas' weights diverged; nan_inf_policy='rollback' found no complete "
                              "checkpoint in output_dir=")
    assert "at or before step 0 (the last step the replica check passed (replica_check_steps)" in message


class PoisonAfterARollback(TrainerCallback):
    """A NaN loss at step ``step`` once a rollback has skipped samples (the data position is ahead of the step)."""

    def __init__(self, model, step):
        self.model, self.step = model, step

    def on_step_begin(self, args, state, control, **kwargs):
        if state.global_step + 1 == self.step and state.consumed_samples > state.global_step * BATCH:
            self.model.poisoned, self.step = True, None


def test_after_a_rollback_the_checkpoint_it_loaded_is_the_last_verified_step(tmp_path, monkeypatch, caplog):
    # a save (so a check) every step. checkpoint-11 is damaged before the check at 12 finds a divergence: the
    # rollback passes over it to checkpoint-10. Steps 11 and 12 are trained again and saved, verified; a NaN at
    # step 13 then goes back to the new checkpoint-12
    fake_replicas(monkeypatch, every=6, diverge_at=[12])
    out = tmp_path / "out"
    paddle.seed(11)
    model = PoisonableModel()
    trainer = Trainer(model=model, args=args_for(out, max_steps=16, save_steps=1), train_dataset=regression_data(128),
                      callbacks=[DamageAt(out, "checkpoint-11", step=12), PoisonAfterARollback(model, step=13)])
    with caplog.at_level(logging.WARNING, logger="paddletrainer.runtime.rollback"):
        trainer.train()
    assert f"step 12: replica divergence; rolled back to {out / 'checkpoint-10'}" in caplog.text
    assert f"step 13: non-finite gradient norm; rolled back to {out / 'checkpoint-12'}" in caplog.text
    assert trainer.state.global_step == 16


def test_a_rollback_never_goes_forward_to_a_newer_checkpoint_of_an_earlier_run(tmp_path, caplog):
    out = tmp_path / "out"
    Trainer(model=RegressionModel(), args=args_for(out, max_steps=8), train_dataset=regression_data()).train()
    paddle.seed(11)
    model = PoisonableModel()
    trainer = Trainer(model=model, args=args_for(out), train_dataset=regression_data(),
                      callbacks=[PoisonAt(model, steps=[6])])
    with caplog.at_level(logging.WARNING, logger="paddletrainer.runtime.rollback"):
        trainer.train(resume_from_checkpoint=str(out / "checkpoint-4"))  # checkpoint-6 and -8 lie beside it
    assert f"step 6: non-finite gradient norm; rolled back to {out / 'checkpoint-4'}" in caplog.text
    assert trainer.state.global_step == 10


def test_a_damaged_checkpoint_is_passed_over_with_a_warning_naming_it(tmp_path, caplog):
    out = tmp_path / "out"
    paddle.seed(11)
    model = PoisonableModel()
    trainer = Trainer(model=model, args=args_for(out), train_dataset=regression_data(),
                      callbacks=[DamageAt(out, "checkpoint-4", step=6), PoisonAt(model, steps=[6])])
    with caplog.at_level(logging.WARNING, logger="paddletrainer.runtime.rollback"):
        trainer.train()
    assert (f"passed over the damaged checkpoint {out / 'checkpoint-4'} ({L.model_file_name(0, 0)} has "
            in caplog.text)
    assert f"step 6: non-finite gradient norm; rolled back to {out / 'checkpoint-2'}" in caplog.text
    assert trainer.state.global_step == 10
