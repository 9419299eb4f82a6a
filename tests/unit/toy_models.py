"""The tiny regression model and data the single-process Trainer tests share, and what the rollback tests
share with the multi-process rollback worker (tests/distributed/workers/robust_train.py): ``poisonable``,
``PoisonAt`` (the callback that poisons chosen steps) and ``StopAt`` (stops training after a step); the
arguments the restart tests (``restart_args``) and the rollback tests (``rollback_args``) train with; the plain
attention the ring-attention tests and their worker (tests/distributed/workers/ring_attn_worker.py) compare with
(``reference_attention``)."""
import math

import numpy as np
import paddle

from paddletrainer import TrainerCallback, TrainingArguments


class RegressionModel(paddle.nn.Layer):
    """y = a·x + b; returns (loss, prediction) with labels, (prediction,) without."""

    def __init__(self):
        super().__init__()
        self.linear = paddle.nn.Linear(1, 1)

    def forward(self, x, labels=None):
        pred = self.linear(x).squeeze(-1)
        if labels is None:
            return (pred,)
        return paddle.nn.functional.mse_loss(pred, labels), pred


def regression_data(n=64, a=2.0, b=-1.0, seed=0):
    """``n`` samples ``{"x": [x], "labels": a·x + b}`` with x uniform in [-1, 1)."""
    rng = np.random.RandomState(seed)
    x = rng.uniform(-1, 1, size=(n, 1)).astype("float32")
    return [{"x": x[i], "labels": np.float32(a * x[i, 0] + b)} for i in range(n)]


def poisonable(cls):
    """A subclass of the model class ``cls`` whose loss is NaN on the next forward with labels after
    ``model.poisoned = True`` (then it clears the flag). A subclass, so the state dict keeps ``cls``'s names."""

    class Poisonable(cls):
        poisoned = False

        def forward(self, x, labels=None):
            out = super().forward(x, labels)
            if labels is not None and self.poisoned:
                self.poisoned = False
                return (out[0] * float("nan"),) + tuple(out[1:])
            return out

    Poisonable.__name__ = Poisonable.__qualname__ = f"Poisonable{cls.__name__}"
    return Poisonable


class PoisonAt(TrainerCallback):
    """Makes the loss of a ``poisonable`` model NaN at the given steps (each number once, or every step from
    ``every_from`` on)."""

    def __init__(self, model, steps=(), every_from=None):
        self.model, self.steps, self.every_from = model, set(steps), every_from

    def on_step_begin(self, args, state, control, **kwargs):
        step = state.global_step + 1
        if step in self.steps or (self.every_from is not None and step >= self.every_from):
            self.steps.discard(step)
            self.model.poisoned = True


class StopAt(TrainerCallback):
    """Stops training at the end of global step ``step`` (as an early stop or a kill between steps would)."""

    def __init__(self, step: int):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step >= self.step:
            control.should_training_stop = True


def restart_args(tmp_path, **kw):
    """Save every 2 of 4 steps into ``tmp_path/out`` (the restart and publish/rotation tests)."""
    base = dict(output_dir=str(tmp_path / "out"), per_device_train_batch_size=8, learning_rate=0.1, max_steps=4,
                logging_steps=1, save_strategy="steps", save_steps=2, evaluation_strategy="no", disable_tqdm=True,
                report_to="none", seed=42)
    base.update(kw)
    return TrainingArguments(**base)


ROLLBACK_BATCH = 4


def rollback_args(out, **kw):
    """``nan_inf_policy=rollback``, batch ``ROLLBACK_BATCH``, 10 steps saved every 2, into ``out``."""
    base = dict(output_dir=str(out), per_device_train_batch_size=ROLLBACK_BATCH, learning_rate=0.1, max_steps=10,
                logging_steps=1, save_strategy="steps", save_steps=2, evaluation_strategy="no", disable_tqdm=True,
                report_to="none", seed=42, weight_decay=0.0, nan_inf_policy="rollback")
    base.update(kw)
    return TrainingArguments(**base)


def reference_attention(q, k, v, causal):
    """Plain attention over the whole sequence, [b, s, h, d] in and out; K/V heads repeated for GQA."""
    groups = q.shape[2] // k.shape[2]
    qh, kh, vh = (paddle.transpose(t, [0, 2, 1, 3]) for t in (q, k, v))
    kh, vh = (paddle.repeat_interleave(t, groups, axis=1) for t in (kh, vh))
    scores = paddle.matmul(qh, kh, transpose_y=True) / math.sqrt(q.shape[-1])
    if causal:
        scores = scores + paddle.triu(paddle.full([q.shape[1]] * 2, float("-inf"), dtype=q.dtype), diagonal=1)
    return paddle.transpose(paddle.matmul(paddle.nn.functional.softmax(scores, -1), vh), [0, 2, 1, 3])
