"""``Trainer.wait_for_checkpoint_snapshot``: a callback that writes the weights in place right after an async save
calls it first, and the checkpoint holds the saved step's weights; without it (the background copy held back on
purpose until the next wait point) the callback's values leak into the checkpoint — the reason the method exists."""
import os
import threading

import paddle

from paddletrainer import Trainer, TrainerCallback, TrainingArguments
from paddletrainer.checkpoint import snapshot as snapshot_mod
from toy_models import RegressionModel, regression_data

SAVE_STEP = 2
GATE_TIMEOUT_S = 30  # a held writer is let go after this, so a broken hand-off fails instead of hanging


class OverwriteWeightsOnSave(TrainerCallback):
    """At ``on_save``: optionally wait for the snapshot, then overwrite every parameter in place with 7."""

    def __init__(self, trainer, wait: bool):
        self.trainer, self.wait = trainer, wait

    def on_save(self, args, state, control, **kwargs):
        if self.wait:
            self.trainer.wait_for_checkpoint_snapshot()
        for p in self.trainer.model.parameters():
            paddle.assign(paddle.full_like(p, 7.0), output=p)


def read_bytes(path):
    with open(path, "rb") as f:
        return f.read()


def checkpoint_bytes(out, async_save, wait):
    paddle.seed(3)
    args = TrainingArguments(output_dir=str(out), per_device_train_batch_size=8, learning_rate=0.1, max_steps=3,
                             save_steps=SAVE_STEP, logging_steps=1, disable_tqdm=True, report_to="none", seed=1,
                             checkpoint_async_save=async_save)
    trainer = Trainer(model=RegressionModel(), args=args, train_dataset=regression_data(64))
    trainer.add_callback(OverwriteWeightsOnSave(trainer, wait))
    trainer.train()
    ckpt = os.path.join(out, f"checkpoint-{SAVE_STEP}")
    return {f: read_bytes(os.path.join(ckpt, f)) for f in sorted(os.listdir(ckpt)) if f.startswith("model_state")}


def hold_the_background_copy_until_a_wait_point(monkeypatch):
    """The writer thread copies no chunk before the training thread reaches a wait point (the callback's
    ``wait_for_checkpoint_snapshot`` or the Trainer's, before the next optimizer step) for that snapshot."""
    reached = threading.Event()
    training = threading.get_ident()
    init, copy_chunk = snapshot_mod.HostSnapshot.__init__, snapshot_mod._copy_chunk
    wait_until_taken = snapshot_mod.HostSnapshot.wait_until_taken

    def new_snapshot(snap, *args, **kwargs):  # one save at a time: a new snapshot has no wait point yet
        reached.clear()
        init(snap, *args, **kwargs)

    def held_chunk(dst, src):
        if threading.get_ident() != training:
            assert reached.wait(GATE_TIMEOUT_S), "no wait point was reached"
        copy_chunk(dst, src)

    def wait_point(snap):
        reached.set()
        wait_until_taken(snap)

    monkeypatch.setattr(snapshot_mod.HostSnapshot, "__init__", new_snapshot)
    monkeypatch.setattr(snapshot_mod, "_copy_chunk", held_chunk)
    monkeypatch.setattr(snapshot_mod.HostSnapshot, "wait_until_taken", wait_point)


def test_a_callback_that_waits_for_the_snapshot_does_not_leak_into_the_async_checkpoint(tmp_path, monkeypatch):
    saved_before_the_callback = checkpoint_bytes(tmp_path / "sync", async_save=False, wait=False)
    hold_the_background_copy_until_a_wait_point(monkeypatch)
    assert checkpoint_bytes(tmp_path / "waits", async_save=True, wait=True) == saved_before_the_callback
    assert checkpoint_bytes(tmp_path / "no_wait", async_save=True, wait=False) != saved_before_the_callback
