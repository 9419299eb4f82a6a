"""``--device gpu`` (PaddleNLP's default) on a CPU-only Paddle build: the run uses the CPU, with one warning per
process naming the build — never an error, never silent."""
import logging

import paddle
import pytest

from paddletrainer import Trainer, TrainingArguments
from paddletrainer import device
from paddletrainer.device import has_accelerator, resolve_device
from toy_models import RegressionModel, regression_data

pytestmark = pytest.mark.skipif(has_accelerator(), reason="needs a CPU-only Paddle build")


@pytest.fixture(autouse=True)
def _fresh_process_state(monkeypatch):
    monkeypatch.setattr(device, "_cpu_fallback_warned", False)  # as in a new process
    for key in ("PADDLE_TRAINERS_NUM", "PADDLE_TRAINER_ID", "PADDLE_RANK_IN_NODE", "PADDLE_LOCAL_RANK"):
        monkeypatch.delenv(key, raising=False)


def fallback_warnings(caplog):
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and "CPU-only" in r.getMessage()]


def test_the_default_device_gpu_trains_on_cpu_with_one_warning_naming_the_build(tmp_path, caplog):
    args = TrainingArguments(output_dir=str(tmp_path), max_steps=1, report_to="none", save_strategy="no")
    assert args.device == "gpu"  # PaddleNLP's default, kept by the arguments
    with caplog.at_level(logging.WARNING):
        trainer = Trainer(RegressionModel(), args=args, train_dataset=regression_data(8))
        trainer.train()
        Trainer(RegressionModel(), args=TrainingArguments(output_dir=str(tmp_path), device="gpu:1"),
                train_dataset=regression_data(8))
    (message,) = fallback_warnings(caplog)
    assert "device='gpu'" in message and f"paddle {paddle.__version__}" in message and "running on cpu" in message
    assert trainer.effective_device == "cpu" and paddle.get_device() == "cpu"
    assert trainer.args.device == "gpu" and args.device == "gpu"  # the arguments as the user gave them
    assert all(p.place.is_cpu_place() for p in trainer.model.parameters())


def test_cpu_and_unset_devices_are_kept_without_a_warning(caplog):
    with caplog.at_level(logging.WARNING):
        assert resolve_device("cpu") == "cpu" and resolve_device(None) is None
    assert not fallback_warnings(caplog)
