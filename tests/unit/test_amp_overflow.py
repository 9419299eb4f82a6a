"""fp16 loss scaling in the Trainer (CPU dry run, live GradScaler): an overflow skips the step, halves the scale,
holds the LR schedule and leaves the weights finite; ``nan_inf_policy=error`` still stops a real NaN."""
import numpy as np
import paddle
import pytest

from paddletrainer import Trainer, TrainerCallback, TrainingArguments
from paddletrainer.optim import overflow
from toy_models import RegressionModel, regression_data


class InfGradAt(TrainerCallback):
    """Puts an inf into the (scaled) weight gradient right before the optimizer step of step ``step``."""

    def __init__(self, step):
        self.step = step

    def on_optimizer_begin(self, args, state, control, model=None, **kwargs):
        if state.global_step + 1 == self.step:
            grad = model.linear.weight.grad
            grad.set_value(paddle.full_like(grad, float("inf")))


class RecordWeights(TrainerCallback):
    def __init__(self, sink):
        self.sink = sink

    def on_step_end(self, args, state, control, model=None, **kwargs):
        self.sink[state.global_step] = model.linear.weight.numpy().copy()


def fp16_trainer(out, scale_loss, callbacks=(), **kw):
    paddle.seed(3)
    base = dict(output_dir=str(out), per_device_train_batch_size=8, learning_rate=0.1, max_steps=5, logging_steps=1,
                save_steps=100, disable_tqdm=True, report_to="none", seed=1, lr_scheduler_type="linear",
                fp16=True, amp_on_cpu="fp32_dry_run", scale_loss=scale_loss)
    base.update(kw)
    return Trainer(model=RegressionModel(), args=TrainingArguments(**base), train_dataset=regression_data(),
                   callbacks=list(callbacks))


def test_fp16_overflow_skips_the_step_halves_the_scale_holds_the_lr_and_keeps_weights_finite(tmp_path):
    weights = {}
    trainer = fp16_trainer(tmp_path / "inf", 1024.0, [InfGradAt(3), RecordWeights(weights)])
    trainer.train()
    trainer.recorded_weights = weights
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert [h["loss_scale"] for h in logs] == [1024.0, 1024.0, 512.0, 512.0, 512.0]
    assert [h["skipped_steps"] for h in logs] == [0, 0, 1, 1, 1]
    assert not np.isfinite(logs[2]["grad_norm"]) and all(np.isfinite(h["grad_norm"]) for i, h in enumerate(logs) if i != 2)
    lrs = [h["learning_rate"] for h in logs]
    assert lrs[2] == lrs[1] and lrs[1] > lrs[3] > lrs[4]  # the skipped step does not advance the schedule
    assert all(np.isfinite(p.numpy()).all() for p in trainer.model.parameters())
    # the same run without the injection: steps 1-2 equal; the weights after the skip equal those after step 2
    clean = fp16_trainer(tmp_path / "clean", 1024.0)
    clean.train()
    clean_losses = [h["loss"] for h in clean.state.log_history if "loss" in h]
    np.testing.assert_allclose([h["loss"] for h in logs[:3]], clean_losses[:3], rtol=1e-6)
    weights = trainer.recorded_weights
    assert np.array_equal(weights[3], weights[2]) and not np.array_equal(weights[4], weights[3])


def test_fp16_gradients_reach_the_optimizer_unscaled(tmp_path):
    scaled = fp16_trainer(tmp_path / "fp16", 1024.0, max_steps=3)
    scaled.train()
    plain = fp16_trainer(tmp_path / "fp32", 1024.0, max_steps=3, fp16=False)
    plain.train()
    got = [h["grad_norm"] for h in scaled.state.log_history if "grad_norm" in h]
    want = [h["grad_norm"] for h in plain.state.log_history if "grad_norm" in h]
    np.testing.assert_allclose(got, want, rtol=1e-6)
    np.testing.assert_allclose(scaled.model.linear.weight.numpy(), plain.model.linear.weight.numpy(), rtol=1e-6)


def test_nan_inf_policy_error_is_applied_with_a_scaler_once_scaling_cannot_explain_the_overflow(tmp_path):
    from paddletrainer.trainer import NonFiniteLossError

    trainer = fp16_trainer(tmp_path / "err", 1.0, [InfGradAt(2)])
    with pytest.raises(NonFiniteLossError, match="step 2: gradient norm is"):
        trainer.train()
    trainer = fp16_trainer(tmp_path / "skip", 1.0, [InfGradAt(2)], nan_inf_policy="skip")
    trainer.train()
    assert trainer.state.skipped_steps == 1


def test_nonfinite_action_is_the_one_place_the_policy_is_decided():
    cfg_scaler = type("S", (), {"_scale": paddle.to_tensor([8.0])})()
    assert overflow.nonfinite_action(True, "error", None) == overflow.STEP
    assert overflow.nonfinite_action(False, "error", None) == overflow.RAISE
    assert overflow.nonfinite_action(False, "skip", None) == overflow.SKIP
    assert overflow.nonfinite_action(False, "error", cfg_scaler) == overflow.SKIP
    with pytest.raises(ValueError, match="nan_inf_policy='ignore' is not valid"):
        overflow.nonfinite_action(False, "ignore", None)


def test_the_live_loss_scale_is_saved_and_restored_on_resume(tmp_path):
    first = fp16_trainer(tmp_path / "a", 1024.0, [InfGradAt(2)], max_steps=3, save_steps=3)
    first.train()
    assert [h["loss_scale"] for h in first.state.log_history if "loss" in h] == [1024.0, 512.0, 512.0]
    resumed = fp16_trainer(tmp_path / "b", 1024.0, max_steps=5, save_steps=100)
    resumed.train(resume_from_checkpoint=str(tmp_path / "a" / "checkpoint-3"))
    assert overflow.loss_scale(resumed.scaler) == 512.0  # not the initial 1024
    assert resumed.scaler.state_dict()["incr_count"] == 3  # good steps since the overflow: 3 (saved 1, then 4 and 5)


def test_unscale_gradients_divides_every_gradient_by_the_divisor_and_flags_a_nonfinite_one():
    finite = [paddle.to_tensor([2.0, 4.0]), paddle.to_tensor([[6.0]])]
    assert overflow.unscale_gradients(None, finite, divisor=1.0) is None  # nothing to do: untouched
    flag = overflow.unscale_gradients(None, finite, divisor=2.0)
    np.testing.assert_array_equal(finite[0].numpy(), [1.0, 2.0])
    np.testing.assert_array_equal(finite[1].numpy(), [[3.0]])
    assert not bool(flag)
    poisoned = [paddle.to_tensor([1.0]), paddle.to_tensor([float("inf")])]
    assert bool(overflow.unscale_gradients(None, poisoned, divisor=2.0))
