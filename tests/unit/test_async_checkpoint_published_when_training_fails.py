"""An async save finished before ``train()`` raises is still published: under ``nan_inf_policy=error`` a
non-finite step after an async save at step N leaves ``checkpoint-N`` complete (not a ``.tmp-*`` dir the next
run would remove as stale), and resuming from it continues exactly like a run that never failed."""
import os

import numpy as np
import paddle
import pytest

from paddletrainer import Trainer, TrainingArguments
from paddletrainer.checkpoint import read_index
from paddletrainer.errors import NonFiniteLossError
from toy_models import PoisonAt, RegressionModel, poisonable, regression_data

SAVE_STEP, BAD_STEP = 2, 3  # the bad step is read at the logging step 4, before any other save


def seeded(model_cls):
    paddle.seed(3)  # the same initial weights in the failed and the clean run
    return model_cls()


def trainer_for(out, model, max_steps, callbacks=()):
    args = TrainingArguments(output_dir=str(out), per_device_train_batch_size=8, learning_rate=0.1,
                             max_steps=max_steps, logging_steps=4, save_steps=SAVE_STEP, checkpoint_async_save=True,
                             nan_inf_policy="error", lr_scheduler_type="constant", disable_tqdm=True,
                             report_to="none", seed=1)
    return Trainer(model=model, args=args, train_dataset=regression_data(64), callbacks=list(callbacks))


def test_an_async_checkpoint_saved_before_a_nonfinite_step_is_published_and_resumable(tmp_path):
    model = seeded(poisonable(RegressionModel))
    failed = trainer_for(tmp_path / "failed", model, max_steps=8, callbacks=[PoisonAt(model, steps=[BAD_STEP])])
    with pytest.raises(NonFiniteLossError, match=f"step {BAD_STEP}"):
        failed.train()

    ckpt = tmp_path / "failed" / f"checkpoint-{SAVE_STEP}"
    assert sorted(os.listdir(tmp_path / "failed")) == [f"checkpoint-{SAVE_STEP}"]  # published, no tmp dir left
    assert read_index(str(ckpt))["tensors"]  # the index is written last: the checkpoint is complete

    resumed = trainer_for(tmp_path / "failed", seeded(RegressionModel), max_steps=4)
    resumed.train(resume_from_checkpoint=str(ckpt))
    clean = trainer_for(tmp_path / "clean", seeded(RegressionModel), max_steps=4)
    clean.train()
    assert resumed.state.global_step == 4
    for a, b in zip(resumed.model.parameters(), clean.model.parameters()):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
