"""A script's last reference to the Trainer frees it (no reference cycle through the loop state): its model,
optimizer and loader threads do not outlive it. PaddleNLP's llm/run_pretrain.py aborted at exit (SIGABRT,
"terminate called without an active exception") when an evaluation reader thread the Trainer kept was torn down at
interpreter shutdown instead."""
import gc
import weakref

import numpy as np
import paddle

from paddletrainer import Trainer, TrainingArguments


class _Samples(paddle.io.Dataset):
    def __len__(self):
        return 16

    def __getitem__(self, i):
        return {"x": np.full([4], i, "float32"), "labels": np.float32(i)}


class _Linear(paddle.nn.Layer):
    def __init__(self):
        super().__init__()
        self.linear = paddle.nn.Linear(4, 1)

    def forward(self, x, labels=None):
        out = self.linear(x).squeeze(-1)
        return paddle.nn.functional.mse_loss(out, labels), out


def test_dropping_the_last_reference_after_train_and_evaluate_frees_the_trainer(tmp_path):
    args = TrainingArguments(str(tmp_path), max_steps=2, per_device_train_batch_size=4, report_to=[], device="cpu",
                             disable_tqdm=True, save_strategy="no")
    gc.collect()
    gc.disable()  # reference counting only, as when a script's main() returns
    try:
        trainer = Trainer(_Linear(), args=args, train_dataset=_Samples(), eval_dataset=_Samples())
        trainer.train()
        trainer.evaluate()
        freed = weakref.ref(trainer)
        del trainer
        assert freed() is None, gc.get_referrers(freed())
    finally:
        gc.enable()
