"""``nan_inf_policy=rollback`` on one process: a NaN loss at a known step sends training back to the newest
checkpoint, the samples trained on since it are skipped, and training ends on the curve of a run that skipped
the same window (built independently: a normal resume from that checkpoint with its data position moved on)."""
import json
import zlib

import numpy as np
import paddle
import pytest

from paddletrainer import Trainer
from paddletrainer.checkpoint import placement as L
from paddletrainer.trainer import NonFiniteLossError
from toy_models import (ROLLBACK_BATCH as BATCH, PoisonAt, RegressionModel, StopAt, poisonable, regression_data,
                        rollback_args as args_for)

BAD_STEP = 6  # checkpoint-4 is the newest before it (save_steps=2), so steps 5 and 6's samples are skipped


PoisonableModel = poisonable(RegressionModel)




def losses(trainer, key="loss"):
    return [h[key] for h in trainer.state.log_history if key in h]


def weights(model):
    return np.concatenate([p.numpy().ravel() for p in model.parameters()])


def skip_window_reference(tmp_path, **kw):
    """Train to step 4, move checkpoint-4's data position past steps 5-6, resume to the end."""
    out = tmp_path / "reference"
    paddle.seed(11)
    first = Trainer(model=RegressionModel(), args=args_for(out, **kw), train_dataset=regression_data(),
                    callbacks=[StopAt(4)])
    first.train()
    ckpt = out / "checkpoint-4"
    data = json.dumps({"consumed_samples": BAD_STEP * BATCH}).encode()
    (ckpt / L.DATA_STATE_NAME).write_bytes(data)
    index = json.loads((ckpt / L.INDEX_NAME).read_text())
    index["files"][L.DATA_STATE_NAME] = {"size": len(data), "crc32": zlib.crc32(data)}
    (ckpt / L.INDEX_NAME).write_text(json.dumps(index))
    paddle.seed(99)  # the weights come from the checkpoint
    second = Trainer(model=RegressionModel(), args=args_for(out, **kw), train_dataset=regression_data())
    second.train(resume_from_checkpoint=str(ckpt))
    return second


def rollback_run(tmp_path, **kw):
    paddle.seed(11)
    model = PoisonableModel()
    trainer = Trainer(model=model, args=args_for(tmp_path / "rollback", **kw), train_dataset=regression_data(),
                      callbacks=[PoisonAt(model, steps=[BAD_STEP])])
    trainer.train()
    return trainer


def test_a_nan_step_rolls_back_skips_the_window_and_ends_on_the_skipped_window_curve(tmp_path, caplog):
    reference = skip_window_reference(tmp_path)
    trainer = rollback_run(tmp_path)
    assert trainer.state.global_step == 10
    assert trainer.state.consumed_samples == (10 + 2) * BATCH  # two windows skipped
    assert losses(trainer) == pytest.approx(losses(reference), rel=1e-6, abs=1e-9)
    np.testing.assert_allclose(weights(trainer.model), weights(reference.model), rtol=1e-6)
    assert "rolled back to" in caplog.text and "checkpoint-4" in caplog.text


def test_the_learning_rate_is_lowered_after_a_rollback_when_asked(tmp_path):
    reference = skip_window_reference(tmp_path, lr_scheduler_type="linear")
    trainer = rollback_run(tmp_path, lr_scheduler_type="linear", nan_inf_rollback_lr_factor=0.5)
    ref_lr, lr = losses(reference, "learning_rate"), losses(trainer, "learning_rate")
    assert len(lr) == len(ref_lr) == 10
    assert lr[:4] == pytest.approx(ref_lr[:4])  # before the rollback (restored from checkpoint-4)
    assert lr[4:] == pytest.approx([0.5 * x for x in ref_lr[4:]])


def test_rollback_gives_up_after_the_configured_retries(tmp_path):
    paddle.seed(11)
    model = PoisonableModel()
    trainer = Trainer(model=model, args=args_for(tmp_path / "out", nan_inf_rollback_max_retries=2),
                      train_dataset=regression_data(), callbacks=[PoisonAt(model, every_from=5)])
    with pytest.raises(NonFiniteLossError) as info:
        trainer.train()
    assert "gave up after 2 rollback(s)" in str(info.value) and "nan_inf_rollback_max_retries=2" in str(info.value)


def test_rollback_without_a_checkpoint_is_a_clear_error(tmp_path):
    paddle.seed(11)
    model = PoisonableModel()
    trainer = Trainer(model=model, args=args_for(tmp_path / "out"), train_dataset=regression_data(),
                      callbacks=[PoisonAt(model, steps=[1])])
    with pytest.raises(NonFiniteLossError) as info:
        trainer.train()
    assert "found no complete checkpoint" in str(info.value) and "save_steps" in str(info.value)


@pytest.mark.parametrize("options,expected", [
    (dict(nan_inf_rollback_max_retries=-1), "nan_inf_rollback_max_retries=-1 is invalid"),
    (dict(nan_inf_rollback_lr_factor=0.0), "nan_inf_rollback_lr_factor=0.0 is invalid"),
    (dict(nan_inf_rollback_lr_factor=2.0), "must lie in (0, 1]"),
])
def test_bad_rollback_options_are_named(tmp_path, options, expected):
    with pytest.raises(ValueError, match=expected.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        args_for(tmp_path, **options)
