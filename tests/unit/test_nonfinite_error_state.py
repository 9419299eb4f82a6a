"""``nan_inf_policy=error`` (read at the next logging step): after the error, the trainer state is the one of a
run that ended at the last finite step — step count, data position and epoch agree, in memory and in the
``trainer_state.json`` that ``save_state`` writes (a checkpoint stores the same state and data position)."""
import json
import os

import pytest

from paddletrainer import Trainer, TrainingArguments
from paddletrainer.errors import NonFiniteLossError
from toy_models import PoisonAt, RegressionModel, poisonable, regression_data

GLOBAL_BATCH = 8  # 4 per device x 2 accumulation steps
SAMPLES = 40  # 5 steps per epoch: a poisoned step 7 is read at step 8, in the second epoch


def trainer_for(out, model, max_steps, callbacks=()):
    args = TrainingArguments(output_dir=str(out), per_device_train_batch_size=4, gradient_accumulation_steps=2,
                             learning_rate=0.1, max_steps=max_steps, logging_steps=4, save_steps=100,
                             lr_scheduler_type="constant", disable_tqdm=True, report_to="none", seed=1)
    return Trainer(model=model, args=args, train_dataset=regression_data(SAMPLES), callbacks=list(callbacks))


def saved_state(trainer, out):
    trainer.save_state()
    with open(os.path.join(out, "trainer_state.json")) as f:
        state = json.load(f)
    return {k: state[k] for k in ("global_step", "consumed_samples", "epoch")}


@pytest.mark.parametrize("bad_step", [3, 7], ids=["before_the_first_check", "after_a_clean_check_next_epoch"])
def test_the_state_after_the_error_is_the_state_of_a_run_that_ended_before_the_bad_step(tmp_path, bad_step):
    model = poisonable(RegressionModel)()
    failed = trainer_for(tmp_path / "failed", model, max_steps=10, callbacks=[PoisonAt(model, steps=[bad_step])])
    with pytest.raises(NonFiniteLossError, match=f"step {bad_step}: gradient norm is nan"):
        failed.train()
    clean = trainer_for(tmp_path / "clean", RegressionModel(), max_steps=bad_step - 1)
    clean.train()

    expected = {"global_step": bad_step - 1, "consumed_samples": (bad_step - 1) * GLOBAL_BATCH,
                "epoch": (bad_step - 1) * GLOBAL_BATCH / SAMPLES}
    assert saved_state(clean, tmp_path / "clean") == expected  # the reference run agrees with the arithmetic
    assert saved_state(failed, tmp_path / "failed") == expected
    # nothing was logged for the steps that are no longer counted
    assert all(h["step"] < bad_step for h in failed.state.log_history)
