"""Hugging Face ``TrainingArguments`` options PaddleNLP 3.0.0b4 lacks (``paddletrainer.config.hf_options``): each with its
Hugging Face meaning, and the PyTorch-only ones refused by name with the Paddle equivalent."""
import logging
import math
import os

import numpy as np
import paddle
import pytest

from paddletrainer import PdArgumentParser, Trainer, TrainingArguments
from paddletrainer.errors import CheckpointError
from paddletrainer.optim.optimization import get_scheduler
from toy_models import PoisonAt, RegressionModel, poisonable, regression_data


def make_args(tmp_path, **kw):
    base = dict(output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, max_steps=4, logging_steps=1,
                save_strategy="no", disable_tqdm=True, report_to="none", seed=7, learning_rate=0.1)
    base.update(kw)
    return TrainingArguments(**base)


def first_epoch_order(tmp_path, **kw):
    trainer = Trainer(RegressionModel(), args=make_args(tmp_path, **kw), train_dataset=regression_data(32))
    return [i for batch in trainer._get_train_sampler() for i in batch]


def test_data_seed_sets_the_data_order_and_defaults_to_seed(tmp_path):
    by_seed = first_epoch_order(tmp_path, seed=7)
    assert first_epoch_order(tmp_path, seed=7, data_seed=7) == by_seed
    assert first_epoch_order(tmp_path, seed=7, data_seed=8) == first_epoch_order(tmp_path, seed=8)
    assert first_epoch_order(tmp_path, seed=7, data_seed=8) != by_seed


def test_log_level_sets_the_package_logger_on_the_main_process_and_passive_leaves_it(tmp_path):
    package = logging.getLogger("paddletrainer")
    before = package.level
    try:
        Trainer(RegressionModel(), args=make_args(tmp_path, log_level="error"), train_dataset=regression_data(8))
        assert package.level == logging.ERROR
        package.setLevel(logging.INFO)
        Trainer(RegressionModel(), args=make_args(tmp_path), train_dataset=regression_data(8))  # passive
        assert package.level == logging.INFO
        package.setLevel(logging.NOTSET)  # inherits from the root logger, and keeps doing so
        Trainer(RegressionModel(), args=make_args(tmp_path), train_dataset=regression_data(8))
        assert package.level == logging.NOTSET
    finally:
        package.setLevel(before)


def test_log_level_replica_applies_where_should_log_is_false(tmp_path):
    class Replica(TrainingArguments):
        should_log = False  # another process than the main one

    args = Replica(output_dir=str(tmp_path), log_level="debug", log_level_replica="critical")
    assert args.get_process_log_level() == logging.CRITICAL
    with pytest.raises(ValueError, match="log_level='loud' is not valid; choose one of: debug, info"):
        TrainingArguments(output_dir=str(tmp_path), log_level="loud")


def logged_losses(tmp_path, name, **kw):
    model = poisonable(RegressionModel)()
    args = make_args(tmp_path / name, **{"nan_inf_policy": "skip", "logging_steps": 2, **kw})
    trainer = Trainer(model, args=args, train_dataset=regression_data(32), callbacks=[PoisonAt(model, steps=[2])])
    trainer.train()
    return [h["loss"] for h in trainer.state.log_history if "loss" in h]


def test_logging_nan_inf_filter_logs_the_mean_of_the_finite_steps_instead_of_nan(tmp_path):
    filtered = logged_losses(tmp_path, "on")  # the default, as in Hugging Face
    assert all(math.isfinite(v) for v in filtered)
    unfiltered = logged_losses(tmp_path, "off", logging_nan_inf_filter=False)
    assert math.isnan(unfiltered[0]) and unfiltered[1] == pytest.approx(filtered[1])
    # step 2's loss counts as step 1's (the mean of the steps before it since the last log): their mean is step 1's
    assert filtered[0] == pytest.approx(logged_losses(tmp_path, "one", logging_steps=1)[0], rel=1e-6)


def test_lr_scheduler_kwargs_are_the_schedules_arguments(tmp_path):
    kwargs = {"power": 2.0, "lr_end": 0.01}
    trainer = Trainer(RegressionModel(), train_dataset=regression_data(8),
                      args=make_args(tmp_path, lr_scheduler_type="polynomial", lr_scheduler_kwargs=kwargs))
    schedule = trainer.create_scheduler(10)
    expected = get_scheduler("polynomial", learning_rate=0.1, num_warmup_steps=0, num_training_steps=10, **kwargs)
    got = []
    for _ in range(10):
        got.append((schedule.get_lr(), expected.get_lr()))
        schedule.step()
        expected.step()
    np.testing.assert_allclose(*zip(*got))
    default = get_scheduler("polynomial", learning_rate=0.1, num_warmup_steps=0, num_training_steps=10)
    default.step()
    assert got[1][0] != default.get_lr()
    with pytest.raises(ValueError, match="lr_scheduler_kwargs: unknown key\\(s\\) gamma; valid: num_cycles"):
        make_args(tmp_path, lr_scheduler_kwargs={"gamma": 0.5})
    (parsed,) = PdArgumentParser(TrainingArguments).parse_args_into_dataclasses(
        ["--output_dir", str(tmp_path), "--lr_scheduler_kwargs", '{"num_cycles": 2}'])
    assert parsed.lr_scheduler_kwargs == {"num_cycles": 2}


def test_save_only_model_checkpoints_have_no_optimizer_state_and_are_not_resumed(tmp_path):
    args = make_args(tmp_path, save_only_model=True, save_strategy="steps", save_steps=2)
    Trainer(RegressionModel(), args=args, train_dataset=regression_data(32)).train()
    files = os.listdir(tmp_path / "out" / "checkpoint-2")
    assert any("model_state" in f for f in files) and not any("optimizer" in f for f in files)
    again = make_args(tmp_path, max_steps=6, resume_from_checkpoint=str(tmp_path / "out" / "checkpoint-2"))
    with pytest.raises(CheckpointError, match="holds no optimizer state.*ignore_load_lr_and_optim"):
        Trainer(RegressionModel(), args=again, train_dataset=regression_data(32)).train(
            resume_from_checkpoint=again.resume_from_checkpoint)


def test_use_cpu_sets_the_device_and_save_safetensors_false_is_refused(tmp_path, monkeypatch):
    assert make_args(tmp_path, use_cpu=True).device == "cpu"
    with pytest.raises(ValueError, match="use_cpu=True contradicts device='xpu'"):
        make_args(tmp_path, use_cpu=True, device="xpu")
    devices = []
    monkeypatch.setattr(paddle, "set_device", lambda d: devices.append(d))
    Trainer(RegressionModel(), args=make_args(tmp_path, use_cpu=True), train_dataset=regression_data(8))
    assert devices == ["cpu"]
    with pytest.raises(ValueError, match="save_safetensors=False is not supported by paddletrainer"):
        make_args(tmp_path, save_safetensors=False)


@pytest.mark.parametrize("option, value, instead", [
    ("use_ipex", True, "Intel Extension"), ("use_mps_device", True, "device=cpu"),
    ("jit_mode_eval", True, "to_static"), ("per_gpu_train_batch_size", 8, "per_device_train_batch_size"),
    ("per_gpu_eval_batch_size", 8, "per_device_eval_batch_size")])
def test_pytorch_only_options_are_refused_by_name_with_the_paddle_equivalent(tmp_path, option, value, instead):
    with pytest.raises(ValueError, match=f"{option}={value!r} is not supported by paddletrainer: .*{instead}"):
        make_args(tmp_path, **{option: value})
