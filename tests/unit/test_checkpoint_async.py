"""Async saves copy parameters and optimizer states while the next forward/backward runs, and still hold
exactly the saved step's state: a copy slowed down on purpose overlaps training, and resuming from it is
bit-exact; state the forward does change (BatchNorm statistics, RNG) is captured in the save call."""
import os
import threading
import time

import numpy as np
import paddle
import pytest

from paddletrainer import Trainer, TrainingArguments
from paddletrainer.checkpoint import CheckpointError, Checkpointer, read_index, save_checkpoint
from paddletrainer.checkpoint import snapshot as snapshot_mod
from toy_models import regression_data

COPY_DELAY_S = 0.4


class BatchNormRegression(paddle.nn.Layer):
    """Linear → BatchNorm (running statistics change in every training forward) → Dropout (RNG) → Linear."""

    def __init__(self):
        super().__init__()
        self.inp = paddle.nn.Linear(1, 8)
        self.norm = paddle.nn.BatchNorm1D(8)
        self.drop = paddle.nn.Dropout(0.2)
        self.out = paddle.nn.Linear(8, 1)

    def forward(self, x, labels=None):
        pred = self.out(self.drop(self.norm(self.inp(x)))).squeeze(-1)
        if labels is None:
            return (pred,)
        return paddle.nn.functional.mse_loss(pred, labels), pred


class SlowCopy:
    """Makes the async host copy sleep first; records when it ran and when training forwards ran."""

    def __init__(self, monkeypatch):
        self.copies, self.forwards = [], []
        original = snapshot_mod.HostSnapshot.take

        def slow_take(snap, buffers=None):
            start = time.perf_counter()
            time.sleep(COPY_DELAY_S)
            try:
                return original(snap, buffers)
            finally:
                self.copies.append((start, time.perf_counter()))

        monkeypatch.setattr(snapshot_mod.HostSnapshot, "take", slow_take)

    def watch(self, model):
        model.register_forward_pre_hook(lambda layer, inputs: self.forwards.append(time.perf_counter()))

    def forwards_during_copies(self) -> int:
        return sum(start < t < end for start, end in self.copies for t in self.forwards)


def args_for(out, **kw):
    base = dict(output_dir=str(out), per_device_train_batch_size=8, learning_rate=0.05, logging_steps=1,
                save_strategy="steps", save_steps=3, evaluation_strategy="no", disable_tqdm=True, report_to="none",
                seed=42, lr_scheduler_type="linear", warmup_steps=2, max_steps=8, overwrite_output_dir=True)
    base.update(kw)
    return TrainingArguments(**base)


def train(out, **kw):
    paddle.seed(11)
    trainer = Trainer(model=BatchNormRegression(), args=args_for(out, **kw), train_dataset=regression_data(128))
    return trainer


def losses_of(trainer):
    return [h["loss"] for h in trainer.state.log_history if "loss" in h]


def safetensors_bytes(ckpt_dir):
    return {f: open(os.path.join(ckpt_dir, f), "rb").read() for f in sorted(os.listdir(ckpt_dir))
            if f.endswith(".safetensors")}


def test_a_slow_async_copy_overlaps_the_next_steps_and_resuming_from_it_is_bit_exact(tmp_path, monkeypatch):
    sync = train(tmp_path / "sync")
    sync.train()

    slow = SlowCopy(monkeypatch)
    trainer = train(tmp_path / "async", checkpoint_async_save=True)
    slow.watch(trainer.model)
    trainer.train()
    assert len(slow.copies) == 2  # checkpoint-3 and checkpoint-6, each copied in the background
    assert slow.forwards_during_copies() >= 2  # the next steps' forwards ran while the copies were running
    assert losses_of(trainer) == losses_of(sync)  # waiting before the optimizer step changes nothing
    for step in (3, 6):  # the same bytes as a save that stopped training for the copy
        assert safetensors_bytes(tmp_path / "async" / f"checkpoint-{step}") == \
            safetensors_bytes(tmp_path / "sync" / f"checkpoint-{step}")

    resumed = train(tmp_path / "async")
    resumed.train(resume_from_checkpoint=str(tmp_path / "async" / "checkpoint-3"))
    assert losses_of(resumed) == losses_of(sync)  # steps 4-8 again: bit for bit (RNG, BatchNorm, schedule)
    for a, b in zip(resumed.model.parameters(), sync.model.parameters()):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_the_save_call_returns_before_the_copy_and_captures_what_the_forward_changes(tmp_path, monkeypatch):
    paddle.seed(3)
    model = BatchNormRegression()
    opt = paddle.optimizer.AdamW(learning_rate=0.1, parameters=model.parameters())
    x, y = paddle.randn([16, 1]), paddle.randn([16])

    def forward_backward():
        model(x, y)[0].backward()

    for _ in range(2):
        forward_backward()
        opt.step()
        opt.clear_grad()
    reference = save_checkpoint(str(tmp_path / "sync" / "checkpoint-2"), model=model, optimizer=opt, save_rng=False)

    SlowCopy(monkeypatch)
    saver = Checkpointer()
    t0 = time.perf_counter()
    saved = saver.save(str(tmp_path / "async" / "checkpoint-2"), model=model, optimizer=opt, save_rng=False,
                       async_save=True)
    assert time.perf_counter() - t0 < COPY_DELAY_S  # the copy is not in the call
    forward_backward()  # changes the BatchNorm statistics in place, while the copy sleeps
    saver.wait_for_snapshot()
    assert time.perf_counter() - t0 >= COPY_DELAY_S  # returned only once the copy was done
    opt.step()  # writes parameters and moments in place: after the wait, so not in the checkpoint
    assert saver.finish() == saved
    assert safetensors_bytes(saved) == safetensors_bytes(reference)
    assert read_index(saved)["tensors"] == read_index(reference)["tensors"]


def test_a_failing_async_copy_releases_the_wait_and_fails_the_save_on_finish(tmp_path, monkeypatch):
    model = BatchNormRegression()

    def broken_copy(dst, src):
        raise MemoryError("no host memory for the snapshot")

    monkeypatch.setattr(snapshot_mod.np, "copyto", broken_copy)
    saver = Checkpointer()
    saver.save(str(tmp_path / "checkpoint-1"), model=model, async_save=True)
    waiter = threading.Thread(target=saver.wait_for_snapshot)
    waiter.start()
    waiter.join(timeout=10)
    assert not waiter.is_alive()
    with pytest.raises(CheckpointError, match="rank 0 failed writing its files: MemoryError"):
        saver.finish()
    assert not os.path.exists(tmp_path / "checkpoint-1")
