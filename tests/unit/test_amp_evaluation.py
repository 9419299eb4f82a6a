"""Evaluation under reduced precision: bf16/fp16 logits reach compute_metrics as their float32 values."""
import numpy as np
import paddle
import pytest

from paddletrainer import Trainer, TrainingArguments


class FixedLogits(paddle.nn.Layer):
    """Returns (loss, logits) with logits [-1.5, 2.0, -3.0] per sample in ``dtype`` (the argmax is 1)."""

    def __init__(self, dtype):
        super().__init__()
        self.dtype_name = dtype
        self.bias = self.create_parameter([3], default_initializer=paddle.nn.initializer.Assign([-1.5, 2.0, -3.0]))

    def forward(self, x, labels=None):
        logits = (x * 0.0 + self.bias).astype(self.dtype_name)
        loss = logits.astype("float32").mean()
        return loss, logits


def accuracy_and_values(prediction):
    logits = prediction.predictions
    return {"accuracy": float((logits.argmax(-1) == prediction.label_ids).mean()),
            "first_logit": float(logits[0, 0]), "is_float": float(np.issubdtype(logits.dtype, np.floating))}


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_precision_logits_give_correct_metrics(tmp_path, dtype):
    data = [{"x": np.ones([3], dtype="float32"), "labels": np.int64(1)} for _ in range(4)]
    args = TrainingArguments(output_dir=str(tmp_path), per_device_eval_batch_size=2, report_to="none", disable_tqdm=True)
    trainer = Trainer(model=FixedLogits(dtype), args=args, eval_dataset=data, compute_metrics=accuracy_and_values)
    metrics = trainer.evaluate()
    assert metrics["eval_accuracy"] == 1.0
    assert metrics["eval_first_logit"] == -1.5 and metrics["eval_is_float"] == 1.0
