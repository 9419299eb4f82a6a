"""What the tests that run PaddleNLP's Trainer beside ours share: the tiny token data, a loss-recording callback
for either Trainer, and the sequential sampler both Trainers are given so that they see the same batches."""
from __future__ import annotations

import numpy as np
import paddle

SEQ, VOCAB = 16, 96


def token_data(n=32):
    tokens = np.random.RandomState(0).randint(0, VOCAB, size=(n, SEQ + 1)).astype("int64")
    return [{"input_ids": t[:-1], "labels": t[1:]} for t in tokens]


def loss_log(base, losses):
    """A callback class (of ``base``, either Trainer's) keeping ``{step: loss}``."""
    def on_log(self, args, state, control, logs=None, **kw):
        if logs and "loss" in logs:
            losses[state.global_step] = logs["loss"]
    return type("LossLog", (base,), {"on_log": on_log})


def sequential_sampler(self):
    """A Trainer's ``_get_train_sampler``: the data set in order, one per-device batch at a time."""
    return paddle.io.BatchSampler(self.train_dataset, batch_size=self.args.per_device_train_batch_size, shuffle=False)
