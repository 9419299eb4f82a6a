"""Async saves copy parameters and optimizer states while the next forward/backward runs, and still hold
exactly the saved step's state: a copy held back on purpose overlaps training, and resuming from it is
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

GATE_TIMEOUT_S = 30  # a held writer is let go after this, so a broken hand-off fails instead of hanging


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


class GatedCopy:
    """Holds the writer thread's chunks of the async host copy at a gate until the test opens it (the training
    thread's chunks are never held), so who copies what, and when, follows explicit hand-offs instead of timing.

    Records each chunk's (thread id, end time), each snapshot made, whether a training forward ran while the
    latest snapshot was not yet taken, and sets ``writer_holding`` once the writer is at the gate.
    ``open_after``: the training thread opens the gate itself after copying that many chunks.
    """

    def __init__(self, monkeypatch):
        self.gate, self.writer_holding = threading.Event(), threading.Event()
        self.chunks, self.snapshots, self.forwards_before_taken = [], [], 0
        self.open_after, self.close_at_each_snapshot = None, False
        self.training = threading.get_ident()
        init, copy_chunk = snapshot_mod.HostSnapshot.__init__, snapshot_mod._copy_chunk

        def recorded_init(snap, *args, **kwargs):
            if self.close_at_each_snapshot:
                self.gate.clear()
            init(snap, *args, **kwargs)
            self.snapshots.append(snap)

        def gated_chunk(dst, src):
            if threading.get_ident() != self.training:
                self.writer_holding.set()
                assert self.gate.wait(GATE_TIMEOUT_S), "the gate was never opened"
            copy_chunk(dst, src)
            self.chunks.append((threading.get_ident(), time.perf_counter()))
            if self.open_after is not None and self.by_thread(self.training) >= self.open_after:
                self.gate.set()

        monkeypatch.setattr(snapshot_mod.HostSnapshot, "__init__", recorded_init)
        monkeypatch.setattr(snapshot_mod, "_copy_chunk", gated_chunk)

    def open_at_the_next_forward(self, model):
        """Each save's copy is held until the next training forward has started (the gate closes again at
        every new snapshot); counts the forwards that started before the snapshot was taken."""
        def on_forward(layer, inputs):
            self.forwards_before_taken += bool(self.snapshots) and not self.snapshots[-1]._taken.is_set()
            self.gate.set()

        self.close_at_each_snapshot = True
        model.register_forward_pre_hook(on_forward)

    def by_thread(self, ident) -> int:
        return sum(t == ident for t, _ in self.chunks)


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


def test_a_held_back_async_copy_overlaps_the_next_steps_and_resuming_from_it_is_bit_exact(tmp_path, monkeypatch):
    sync = train(tmp_path / "sync")
    sync.train()

    gated = GatedCopy(monkeypatch)
    trainer = train(tmp_path / "async", checkpoint_async_save=True)
    gated.open_at_the_next_forward(trainer.model)
    trainer.train()
    assert len(gated.snapshots) == 2  # checkpoint-3 and checkpoint-6
    assert gated.forwards_before_taken == 2  # steps 4 and 7 started their forward before the copy was taken
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

    gated = GatedCopy(monkeypatch)  # the writer's copy is held until the gate opens below
    saver = Checkpointer(model=model, optimizer=opt, save_rng=False)
    saved = saver.save(str(tmp_path / "async" / "checkpoint-2"), async_save=True)
    jobs = len(saver._pending.snapshot._jobs)
    assert jobs >= 20 and gated.chunks == []  # the copy is not in the call: the call did not copy a chunk
    forward_backward()  # changes the BatchNorm statistics in place, before the copy
    assert gated.chunks == []  # the training thread copied nothing before the wait point
    gated.gate.set()
    saver.wait_for_snapshot()
    returned = time.perf_counter()
    assert len(gated.chunks) == jobs and max(end for _, end in gated.chunks) <= returned  # every chunk, once
    opt.step()  # writes parameters and moments in place: after the wait, so not in the checkpoint
    assert saver.finish() == saved
    assert safetensors_bytes(saved) == safetensors_bytes(reference)
    assert read_index(saved)["tensors"] == read_index(reference)["tensors"]


def test_a_training_thread_waiting_for_the_copy_copies_the_chunks_nobody_started(tmp_path, monkeypatch):
    paddle.seed(5)
    model = BatchNormRegression()
    opt = paddle.optimizer.AdamW(learning_rate=0.1, parameters=model.parameters())
    model(paddle.randn([16, 1]), paddle.randn([16]))[0].backward()
    opt.step()
    reference = save_checkpoint(str(tmp_path / "sync" / "checkpoint-1"), model=model, optimizer=opt, save_rng=False)

    gated = GatedCopy(monkeypatch)
    saver = Checkpointer(model=model, optimizer=opt, save_rng=False)
    saved = saver.save(str(tmp_path / "async" / "checkpoint-1"), async_save=True)
    jobs = len(saver._pending.snapshot._jobs)
    assert gated.writer_holding.wait(GATE_TIMEOUT_S)  # the writer has started its first chunk and is held there
    gated.open_after = jobs // 2  # the training thread lets the writer go on once it has copied half the chunks
    saver.wait_for_snapshot()  # the writer is held: without help this would wait for GATE_TIMEOUT_S and fail
    helped = gated.by_thread(gated.training)
    assert len(gated.chunks) == jobs  # each chunk copied exactly once, by one of the two threads
    assert helped >= jobs // 2 and jobs - helped >= 1  # both threads copied: the training thread at least half
    saver.finish()
    assert safetensors_bytes(saved) == safetensors_bytes(reference)


def test_a_failing_async_copy_releases_the_wait_and_fails_the_save_on_finish(tmp_path, monkeypatch):
    model = BatchNormRegression()

    def broken_copy(dst, src):
        raise MemoryError("no host memory for the snapshot")

    monkeypatch.setattr(snapshot_mod, "_copy_chunk", broken_copy)
    saver = Checkpointer(model=model)
    saver.save(str(tmp_path / "checkpoint-1"), async_save=True)
    waiter = threading.Thread(target=saver.wait_for_snapshot)
    waiter.start()
    waiter.join(timeout=10)
    assert not waiter.is_alive()
    with pytest.raises(CheckpointError, match="rank 0 failed writing its files: MemoryError"):
        saver.finish()
    assert not os.path.exists(tmp_path / "checkpoint-1")
