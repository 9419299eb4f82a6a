"""A resume keeps the global batch it was trained with (before 2026-11-25, an elastic scale-in from dp2 to dp1 silently
halved it and stopped at step 26 of 30 with exit 0).

One process emulates the layout change: a checkpoint saved with per_device 4 x GA 2 (global batch 8), resumed
asking for per_device 4 x GA 1 (what dp1 with the dp2 options asks for). The real dp2 -> dp1 scale-in under Paddle's
elastic launch is in tests/distributed/test_elastic_etcd.py.
"""
import logging

import pytest

from paddletrainer import Trainer, TrainingArguments
from toy_models import RegressionModel, regression_data


def args_for(out, **kw):
    base = dict(output_dir=str(out), per_device_train_batch_size=4, gradient_accumulation_steps=2, learning_rate=0.1,
                max_steps=12, logging_steps=1, save_strategy="steps", save_steps=6, evaluation_strategy="no",
                disable_tqdm=True, report_to="none", seed=42)
    base.update(kw)
    return TrainingArguments(**base)


def losses(trainer):
    return {h["step"]: h["loss"] for h in trainer.state.log_history if "loss" in h}


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """An uninterrupted run (64 samples, global batch 8: 8 steps per epoch, 12 steps) and its checkpoint-6."""
    out = tmp_path_factory.mktemp("ref") / "out"
    trainer = Trainer(model=RegressionModel(), args=args_for(out), train_dataset=regression_data())
    trainer.train()
    return out, losses(trainer)


def test_a_resume_asking_for_another_global_batch_keeps_the_saved_one_and_reaches_max_steps(reference, tmp_path,
                                                                                               caplog):
    out, expected = reference
    args = args_for(tmp_path / "out", gradient_accumulation_steps=1, resume_from_checkpoint=str(out / "checkpoint-6"))
    trainer = Trainer(model=RegressionModel(), args=args, train_dataset=regression_data())
    with caplog.at_level(logging.WARNING, logger="paddletrainer.trainer"):
        trainer.train()
    assert "KEEPING THE GLOBAL BATCH" in caplog.text and "gradient_accumulation_steps 1 -> 2" in caplog.text
    assert args.gradient_accumulation_steps == 2 and args.global_batch_size == 8
    assert trainer.state.global_step == 12 and trainer.state.consumed_samples == 12 * 8
    got = losses(trainer)  # steps 1-6 come back with the checkpoint's log history
    assert sorted(got) == list(range(1, 13))
    assert [got[s] for s in range(7, 13)] == pytest.approx([expected[s] for s in range(7, 13)], rel=1e-6)


def test_a_global_batch_the_new_layout_cannot_make_up_is_refused_naming_the_options(reference, tmp_path):
    out, _ = reference
    args = args_for(tmp_path / "out", per_device_train_batch_size=3, gradient_accumulation_steps=1,
                    resume_from_checkpoint=str(out / "checkpoint-6"))
    trainer = Trainer(model=RegressionModel(), args=args, train_dataset=regression_data())
    with pytest.raises(ValueError) as info:
        trainer.train()
    message = str(info.value)
    assert "global batch of 8 samples per step" in message
    assert "per_device_train_batch_size=3 x gradient_accumulation_steps=1 x 1 data rank(s) = 3" in message
    assert "--ignore_load_lr_and_optim" in message
    assert trainer.state.global_step == 0  # refused before any step
    # the way out it names: a warm start restores no data position, so it trains with the batch it asks for
    args = args_for(tmp_path / "warm", per_device_train_batch_size=3, gradient_accumulation_steps=1, max_steps=3,
                    resume_from_checkpoint=str(out / "checkpoint-6"), ignore_load_lr_and_optim=True)
    trainer = Trainer(model=RegressionModel(), args=args, train_dataset=regression_data())
    trainer.train()
    assert args.global_batch_size == 3 and trainer.state.global_step == 3


def test_a_checkpoint_written_before_the_global_batch_was_recorded_is_read_from_its_arguments(tmp_path, monkeypatch):
    old_out = tmp_path / "old"
    monkeypatch.setattr(Trainer, "_data_state", lambda self: {"consumed_samples": self.state.consumed_samples})
    Trainer(model=RegressionModel(), args=args_for(old_out, max_steps=6), train_dataset=regression_data()).train()
    monkeypatch.undo()
    args = args_for(tmp_path / "out", gradient_accumulation_steps=1, resume_from_checkpoint=str(old_out / "checkpoint-6"))
    trainer = Trainer(model=RegressionModel(), args=args, train_dataset=regression_data())
    trainer.train()
    assert args.gradient_accumulation_steps == 2 and trainer.state.global_step == 12



def test_an_old_checkpoint_counts_the_data_ranks_of_the_layout_its_index_records(tmp_path, monkeypatch):
    """Without a recorded global batch it is per-device batch x accumulation x dp x sharding of the index's
    ``topology`` (the key the writer uses): a dp2 checkpoint resumed on one rank accumulates twice as much."""
    import json
    old_out = tmp_path / "old"
    monkeypatch.setattr(Trainer, "_data_state", lambda self: {"consumed_samples": self.state.consumed_samples})
    Trainer(model=RegressionModel(), args=args_for(old_out, max_steps=2, save_steps=2),
            train_dataset=regression_data()).train()
    monkeypatch.undo()
    index_path = old_out / "checkpoint-2" / "checkpoint_index.json"
    index = json.loads(index_path.read_text())
    index["topology"].update(world_size=2, dp_degree=2)  # as a dp2 run writes it (RNG states then not restored)
    index_path.write_text(json.dumps(index))
    args = args_for(tmp_path / "out", gradient_accumulation_steps=1, max_steps=3,
                    resume_from_checkpoint=str(old_out / "checkpoint-2"))
    trainer = Trainer(model=RegressionModel(), args=args, train_dataset=regression_data())
    trainer.train()
    assert args.gradient_accumulation_steps == 4 and args.global_batch_size == 16  # 4 x 2 x 2 data ranks


def test_a_model_wrapped_with_another_accumulation_for_sequence_parallel_is_refused(reference, tmp_path, monkeypatch):
    """A second train() resuming a checkpoint of another global batch: the sequence-parallel all-reduce hooks were
    registered by the first wrap with its gradient_accumulation_steps and would reduce at the wrong micro-batches.
    (One process has no tensor parallel: the test says the wrap registered them, as it does under tp > 1.)"""
    import paddletrainer.trainer as trainer_module
    from types import SimpleNamespace
    from paddletrainer.parallel import wrap_captures_accumulation
    assert wrap_captures_accumulation(SimpleNamespace(tp_degree=2), SimpleNamespace(sequence_parallel=True))
    assert not wrap_captures_accumulation(SimpleNamespace(tp_degree=1), SimpleNamespace(sequence_parallel=True))
    monkeypatch.setattr(trainer_module, "wrap_captures_accumulation", lambda topology, config: True)
    out, _ = reference
    args = args_for(tmp_path / "out", gradient_accumulation_steps=1, max_steps=2, save_steps=2)
    trainer = Trainer(model=RegressionModel(), args=args, train_dataset=regression_data())
    trainer.train()  # wraps with gradient_accumulation_steps=1
    with pytest.raises(ValueError) as info:
        trainer.train(resume_from_checkpoint=str(out / "checkpoint-6"))  # keeps its global batch 8: GA 1 -> 2
    assert str(info.value).startswith(
        "gradient_accumulation_steps=2 but this Trainer's model was wrapped for sequence parallel with "
        "gradient_accumulation_steps=1 (by an earlier evaluate(), predict() or train())")
    assert trainer.state.global_step == 2  # refused before any step
    # the same accumulation as the wrap's is no problem
    args.gradient_accumulation_steps, args.max_steps = 1, 3
    trainer.train(resume_from_checkpoint=str(tmp_path / "out" / "checkpoint-2"))
    assert trainer.state.global_step == 3
