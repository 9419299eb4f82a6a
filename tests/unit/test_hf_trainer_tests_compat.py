"""What PaddleNLP's HF-port ``tests/trainer/test_trainer.py`` expects and we did differently: early stopping's
argument error is catchable as ``AssertionError``, the ``init`` memory stage is reported (``init_mem_*`` keys),
rotation counts the empty ``checkpoint-N`` directories (never a non-empty one that is not ours), building and
training a Trainer leaves the arguments as the user gave them, and a resume with nothing to resume from begins its
error with PaddleNLP's sentence."""
import os

import pytest

from paddletrainer import EarlyStoppingCallback, Trainer, TrainingArguments
from toy_models import RegressionModel, regression_data


def make_trainer(tmp_path, **kw):
    base = dict(output_dir=str(tmp_path / "out"), per_device_train_batch_size=16, disable_tqdm=True,
                report_to="none", save_strategy="no", max_steps=2)
    base.update(kw)
    return Trainer(RegressionModel(), args=TrainingArguments(**base), train_dataset=regression_data(64),
                   eval_dataset=regression_data(16))


def test_early_stopping_without_load_best_model_at_end_is_an_assertion_error_before_any_step(tmp_path):
    trainer = make_trainer(tmp_path, evaluation_strategy="epoch", metric_for_best_model="loss", max_steps=-1,
                           num_train_epochs=3)
    trainer.add_callback(EarlyStoppingCallback(1))
    with pytest.raises(AssertionError, match="load_best_model_at_end=True") as caught:
        trainer.train()
    assert isinstance(caught.value, ValueError)  # and still a ValueError, which python -O keeps
    assert trainer.state.global_step == 0


def test_init_memory_stage_is_reported_with_the_first_stage_only(tmp_path):
    trainer = make_trainer(tmp_path, skip_memory_metrics=False)
    train_metrics = trainer.train().metrics
    assert {"init_mem_cpu_alloc_delta", "init_mem_cpu_peaked_delta", "train_mem_cpu_alloc_delta"} <= set(train_metrics)
    eval_metrics = trainer.evaluate()
    assert "eval_mem_cpu_alloc_delta" in eval_metrics and "init_mem_cpu_alloc_delta" not in eval_metrics

    trainer = make_trainer(tmp_path, skip_memory_metrics=True)
    assert not any("_mem_" in k for k in trainer.train().metrics)


def _fake_checkpoints(output_dir):
    for n in (5, 10, 15, 20, 25):
        os.makedirs(os.path.join(output_dir, f"checkpoint-{n}"), exist_ok=True)


def _remaining(output_dir):
    return sorted(int(n.split("-")[1]) for n in os.listdir(output_dir) if n.startswith("checkpoint-"))


@pytest.mark.parametrize("limit, best, kept", [(2, None, [20, 25]), (2, 5, [5, 25]), (1, 25, [25]), (1, 5, [5, 25])])
def test_rotation_counts_empty_checkpoint_directories_like_paddlenlp(tmp_path, limit, best, kept):
    trainer = make_trainer(tmp_path, save_total_limit=limit)
    out = str(tmp_path / "ckpts")
    _fake_checkpoints(out)
    trainer.state.best_model_checkpoint = os.path.join(out, f"checkpoint-{best}") if best else None
    trainer._rotate_checkpoints(output_dir=out)
    assert _remaining(out) == kept


def test_rotation_never_deletes_a_non_empty_directory_that_is_not_ours(tmp_path):
    trainer = make_trainer(tmp_path, save_total_limit=1)
    out = str(tmp_path / "ckpts")
    _fake_checkpoints(out)
    with open(os.path.join(out, "checkpoint-5", "notes.txt"), "w") as f:
        f.write("someone else's file")
    trainer._rotate_checkpoints(output_dir=out)
    assert _remaining(out) == [5, 25]


def test_building_and_training_a_trainer_leaves_the_arguments_as_given(tmp_path):
    kwargs = dict(output_dir=str(tmp_path / "out"), per_device_train_batch_size=16, report_to="none",
                  save_strategy="no", max_steps=2)
    args = TrainingArguments(**kwargs)
    assert args.device == "gpu"  # PaddleNLP's default; this CPU-only build runs on cpu (the Trainer's effective_device)
    trainer = Trainer(RegressionModel(), args=args, train_dataset=regression_data(64))
    trainer.train()
    fresh, used = TrainingArguments(**kwargs).to_dict(), trainer.args.to_dict()
    assert {k: v for k, v in used.items() if k != "logging_dir"} == {k: v for k, v in fresh.items() if k != "logging_dir"}
    assert trainer.args is args and trainer.effective_device == "cpu"


def test_resume_errors_begin_with_paddlenlps_sentences(tmp_path):
    missing = str(tmp_path / "checkpoint-15-bogus")
    with pytest.raises(ValueError) as caught:
        make_trainer(tmp_path).train(resume_from_checkpoint=missing)
    assert str(caught.value).startswith(f"Can't find a valid checkpoint at {missing}: ")

    with pytest.raises(ValueError) as caught:
        make_trainer(tmp_path).train(resume_from_checkpoint=True)
    assert str(caught.value).startswith(f"No valid checkpoint found in output directory ({tmp_path / 'out'}): ")
