"""Single-process Trainer behaviour: learning, accumulation math, callbacks, best model, early stopping."""
import json
import os

import numpy as np
import paddle
import pytest

from paddletrainer import (
    EarlyStoppingCallback,
    EvalPrediction,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)
from toy_models import RegressionModel, regression_data


def args_for(tmp_path, **kw):
    base = dict(output_dir=str(tmp_path / "out"), per_device_train_batch_size=8, learning_rate=0.1,
                num_train_epochs=1, logging_steps=1, save_strategy="no", evaluation_strategy="no",
                disable_tqdm=True, report_to="none", seed=42, weight_decay=0.0)
    base.update(kw)
    return TrainingArguments(**base)


def test_regression_model_learns_a_and_b(tmp_path):
    trainer = Trainer(model=RegressionModel(), args=args_for(tmp_path, num_train_epochs=30, lr_scheduler_type="constant"),
                      train_dataset=regression_data())
    out = trainer.train()
    w, b = float(trainer.model.linear.weight), float(trainer.model.linear.bias)
    assert w == pytest.approx(2.0, abs=0.05) and b == pytest.approx(-1.0, abs=0.05)
    assert out.training_loss < 0.5


def test_gradient_accumulation_4x2_equals_batch_8_after_one_step(tmp_path):
    def params_after_one_step(bs, ga):
        paddle.seed(7)
        model = RegressionModel()
        args = args_for(tmp_path, per_device_train_batch_size=bs, gradient_accumulation_steps=ga, max_steps=1,
                        learning_rate=0.5, lr_scheduler_type="constant", optim="sgd")
        trainer = Trainer(model=model, args=args, train_dataset=regression_data(16))
        trainer.train()
        return np.concatenate([p.numpy().ravel() for p in model.parameters()]), trainer.state.log_history

    p8, logs8 = params_after_one_step(8, 1)
    p2, logs2 = params_after_one_step(2, 4)
    np.testing.assert_allclose(p2, p8, rtol=0, atol=1e-6)
    # the logged loss is the mean per-sample loss of the whole optimizer step, not of the last micro-batch
    assert logs2[0]["loss"] == pytest.approx(logs8[0]["loss"], rel=1e-6)


def test_logged_loss_is_the_mean_over_the_step_samples(tmp_path):
    paddle.seed(3)
    model = RegressionModel()
    data = regression_data(8)
    x = paddle.to_tensor(np.stack([d["x"] for d in data]))
    y = paddle.to_tensor(np.array([d["labels"] for d in data]))
    expected = float(model(x, y)[0])  # the step's mean loss before any update, over all 8 samples
    args = args_for(tmp_path, per_device_train_batch_size=2, gradient_accumulation_steps=4, max_steps=1)
    trainer = Trainer(model=model, args=args, train_dataset=data)
    trainer.train()
    assert trainer.state.log_history[0]["loss"] == pytest.approx(expected, rel=1e-5)


def test_same_seed_gives_identical_losses(tmp_path):
    def losses():
        trainer = Trainer(model_init=RegressionModel, args=args_for(tmp_path, max_steps=5, per_device_train_batch_size=4),
                          train_dataset=regression_data())
        trainer.train()
        return [h["loss"] for h in trainer.state.log_history if "loss" in h]

    assert losses() == losses()


class EventRecorder(TrainerCallback):
    def __init__(self):
        self.events = []

    def __getattribute__(self, name):
        if name.startswith("on_"):
            events = object.__getattribute__(self, "events")
            return lambda args, state, control, **kw: events.append(name)
        return object.__getattribute__(self, name)


def test_callback_events_follow_the_documented_flow_for_steps_strategy(tmp_path):
    rec = EventRecorder()
    args = args_for(tmp_path, max_steps=2, gradient_accumulation_steps=2, per_device_train_batch_size=4,
                    evaluation_strategy="steps", eval_steps=2, logging_steps=2, save_strategy="no")
    trainer = Trainer(model=RegressionModel(), args=args, train_dataset=regression_data(32), eval_dataset=regression_data(8),
                      callbacks=[rec])
    trainer.train()
    step = ["on_load_data_end", "on_step_begin", "on_load_data_end", "on_substep_end", "on_optimizer_begin",
            "on_optimizer_end", "on_step_end"]
    expected = (["on_init_end", "on_train_begin", "on_epoch_begin"] + step + step
                + ["on_log", "on_prediction_step", "on_log", "on_evaluate", "on_epoch_end", "on_log", "on_train_end"])
    assert rec.events == expected


def test_epoch_strategy_evaluates_and_saves_once_per_epoch(tmp_path):
    rec = EventRecorder()
    args = args_for(tmp_path, num_train_epochs=2, per_device_train_batch_size=8, evaluation_strategy="epoch",
                    save_strategy="epoch", logging_strategy="epoch")
    trainer = Trainer(model=RegressionModel(), args=args, train_dataset=regression_data(16), eval_dataset=regression_data(8),
                      callbacks=[rec])
    trainer.train()
    assert rec.events.count("on_epoch_end") == 2
    assert rec.events.count("on_evaluate") == 2
    assert rec.events.count("on_save") == 2
    assert sorted(os.listdir(args.output_dir)) >= ["checkpoint-2", "checkpoint-4"]


def test_load_best_model_at_end_restores_the_best_checkpoint(tmp_path):
    # A learning rate that first helps then overshoots makes an early checkpoint the best one.
    class Scripted(TrainerCallback):
        """Forces eval losses 3, 1, 2 so checkpoint-2 (the second eval) is the best."""

        def __init__(self):
            self.values = iter([3.0, 1.0, 2.0])

        def on_evaluate(self, args, state, control, metrics=None, **kw):
            metrics["eval_loss"] = next(self.values)

    args = args_for(tmp_path, max_steps=3, per_device_train_batch_size=8, evaluation_strategy="steps", eval_steps=1,
                    save_strategy="steps", save_steps=1, load_best_model_at_end=True, metric_for_best_model="loss")
    trainer = Trainer(model=RegressionModel(), args=args, train_dataset=regression_data(32), eval_dataset=regression_data(8),
                      callbacks=[Scripted()])
    trainer.train()
    assert trainer.state.best_model_checkpoint.endswith("checkpoint-2")
    assert trainer.state.best_metric == 1.0


def test_best_metric_tracking_picks_the_checkpoint_with_the_lowest_eval_loss(tmp_path):
    args = args_for(tmp_path, max_steps=4, per_device_train_batch_size=8, evaluation_strategy="steps", eval_steps=1,
                    save_strategy="steps", save_steps=1, load_best_model_at_end=True, metric_for_best_model="loss",
                    lr_scheduler_type="constant")
    trainer = Trainer(model=RegressionModel(), args=args, train_dataset=regression_data(64), eval_dataset=regression_data(16))
    trainer.train()
    evals = [(h["step"], h["eval_loss"]) for h in trainer.state.log_history if "eval_loss" in h]
    best_step = min(evals, key=lambda e: e[1])[0]
    assert trainer.state.best_model_checkpoint.endswith(f"checkpoint-{best_step}")
    # the final model holds the best checkpoint's weights: evaluating again gives the best loss
    assert trainer.evaluate()["eval_loss"] == pytest.approx(min(e[1] for e in evals), rel=1e-5)


def test_early_stopping_stops_after_patience_without_improvement(tmp_path):
    args = args_for(tmp_path, max_steps=50, per_device_train_batch_size=8, evaluation_strategy="steps", eval_steps=1,
                    save_strategy="steps", save_steps=1, load_best_model_at_end=True, metric_for_best_model="loss",
                    learning_rate=0.0, lr_scheduler_type="constant", save_total_limit=2)
    trainer = Trainer(model=RegressionModel(), args=args, train_dataset=regression_data(64), eval_dataset=regression_data(8),
                      callbacks=[EarlyStoppingCallback(early_stopping_patience=2)])
    trainer.train()
    # lr=0: the loss never improves after the first eval, so training stops at step 1 + patience
    assert trainer.state.global_step == 3


def test_evaluate_and_predict_return_metrics_and_predictions_in_dataset_order(tmp_path):
    data = regression_data(13)

    def metrics(p: EvalPrediction):
        return {"mae": float(np.abs(p.predictions - p.label_ids).mean())}

    trainer = Trainer(model=RegressionModel(), args=args_for(tmp_path, per_device_eval_batch_size=4),
                      eval_dataset=data, compute_metrics=metrics)
    m = trainer.evaluate()
    assert {"eval_loss", "eval_mae", "eval_runtime"} <= set(m)
    pred = trainer.predict(data)
    x = paddle.to_tensor(np.stack([d["x"] for d in data]))
    np.testing.assert_allclose(pred.predictions, trainer.model(x)[0].numpy(), rtol=1e-6)
    assert pred.label_ids.shape == (13,)


def test_criterion_and_unused_columns(tmp_path):
    class LogitsOnly(paddle.nn.Layer):
        def __init__(self):
            super().__init__()
            self.linear = paddle.nn.Linear(1, 1)

        def forward(self, x):
            return self.linear(x).squeeze(-1)

    data = [dict(d, note="dropped: not a forward argument") for d in regression_data(16)]
    trainer = Trainer(model=LogitsOnly(), criterion=paddle.nn.MSELoss(), args=args_for(tmp_path, max_steps=2), train_dataset=data)
    assert trainer.train().training_loss > 0


def test_fp16_on_cpu_is_refused_at_construction_and_dry_run_trains(tmp_path):
    with pytest.raises(ValueError, match="fp16=True needs a GPU"):
        Trainer(model=RegressionModel(), args=args_for(tmp_path, fp16=True), train_dataset=regression_data())
    trainer = Trainer(model=RegressionModel(), args=args_for(tmp_path, fp16=True, amp_on_cpu="fp32_dry_run", max_steps=2),
                      train_dataset=regression_data())
    assert trainer.amp.dry_run and trainer.scaler is None
    trainer.train()
    assert trainer.scaler is not None  # the fp16 scaler is wired even in the dry run


def test_save_metrics_state_and_model(tmp_path):
    trainer = Trainer(model=RegressionModel(), args=args_for(tmp_path, max_steps=2), train_dataset=regression_data())
    out = trainer.train()
    trainer.save_metrics("train", out.metrics)
    trainer.save_state()
    trainer.save_model()
    outdir = trainer.args.output_dir
    assert json.load(open(os.path.join(outdir, "train_results.json")))["train_loss"] == pytest.approx(out.training_loss)
    assert json.load(open(os.path.join(outdir, "trainer_state.json")))["global_step"] == 2
    assert os.path.exists(os.path.join(outdir, "training_args.json"))
    # the merged weights load back into a fresh model and predict the same
    from safetensors.numpy import load_file

    fresh = RegressionModel()
    fresh.set_state_dict({k: paddle.to_tensor(v) for k, v in load_file(os.path.join(outdir, "model.safetensors")).items()})
    x = paddle.ones([3, 1])
    np.testing.assert_allclose(fresh(x)[0].numpy(), trainer.model(x)[0].numpy(), rtol=1e-6)


class RecomputableRegression(RegressionModel):
    """RegressionModel whose linear layer can be recomputed in backward (PaddleNLP's convention)."""

    def __init__(self):
        super().__init__()
        self.enable_recompute = False
        self.recomputed_calls = 0

    def forward(self, x, labels=None):
        if self.enable_recompute and self.training:
            from paddle.distributed.fleet.utils import recompute

            self.recomputed_calls += 1
            pred = recompute(self.linear, x, use_reentrant=False).squeeze(-1)  # x needs no grad
            return paddle.nn.functional.mse_loss(pred, labels), pred
        return super().forward(x, labels)


def test_recompute_is_switched_on_and_gives_the_same_losses(tmp_path):
    def run(recompute):
        paddle.seed(5)
        model = RecomputableRegression()
        trainer = Trainer(model=model, args=args_for(tmp_path, max_steps=3, recompute=recompute), train_dataset=regression_data())
        trainer.train()
        return model, [h["loss"] for h in trainer.state.log_history if "loss" in h]

    plain_model, plain = run(False)
    rc_model, rc = run(True)
    assert rc_model.recomputed_calls == 3 and plain_model.recomputed_calls == 0
    assert rc == pytest.approx(plain, rel=1e-6)
    with pytest.raises(ValueError, match="recompute=True but RegressionModel"):
        Trainer(model=RegressionModel(), args=args_for(tmp_path, recompute=True), train_dataset=regression_data())


def test_export_model_writes_an_inference_model_that_predicts_the_same(tmp_path):
    trainer = Trainer(model=RegressionModel(), args=args_for(tmp_path, max_steps=1), train_dataset=regression_data(),
                      eval_dataset=regression_data(8))
    trainer.train()
    path = trainer.export_model()
    loaded = paddle.jit.load(path)
    x = paddle.to_tensor(np.stack([d["x"] for d in regression_data(8)]))
    trainer.model.eval()
    out = loaded(x)
    out = out[0] if isinstance(out, (list, tuple)) else out  # a single output comes back bare
    np.testing.assert_allclose(out.numpy(), trainer.model(x)[0].numpy(), rtol=1e-6)


def test_visualdl_log_holds_the_trainers_loss_the_lr_schedule_and_phase_timers(tmp_path):
    import glob

    from visualdl import LogReader

    args = args_for(tmp_path, max_steps=6, per_device_train_batch_size=4, report_to="visualdl",
                    logging_dir=str(tmp_path / "vdl"), lr_scheduler_type="linear", warmup_steps=2,
                    learning_rate=0.1, log_phase_timers=True)
    trainer = Trainer(model=RegressionModel(), args=args, train_dataset=regression_data())
    trainer.train()
    (path,) = glob.glob(str(tmp_path / "vdl" / "**" / "vdlrecords.*.log"), recursive=True)
    reader = LogReader(file_path=path)
    scalars = lambda tag: [r.value for r in reader.get_data("scalar", tag)]  # noqa: E731
    logged = [h for h in trainer.state.log_history if "loss" in h]
    assert scalars("train/loss") == pytest.approx([h["loss"] for h in logged], rel=1e-6)
    # lr logged after step k (the schedule has advanced k times): warmup 2 steps, then linear decay over 4
    expected_lr = [0.1 * min(k / 2, (6 - k) / 4) for k in range(1, 7)]
    assert scalars("train/learning_rate") == pytest.approx(expected_lr, abs=1e-7)
    tags = set(reader.get_tags()["scalar"])
    assert {"train/grad_norm", "train/samples_per_second", "train/forward_backward_time", "train/optimizer_time"} <= tags


def test_report_to_visualdl_writes_one_record_file_per_run_including_evaluate_after_train(tmp_path):
    import glob

    from visualdl import LogReader

    args = args_for(tmp_path, max_steps=2, per_device_train_batch_size=4, report_to="visualdl",
                    logging_dir=str(tmp_path / "vdl"))
    trainer = Trainer(model=RegressionModel(), args=args, train_dataset=regression_data(),
                      eval_dataset=regression_data(8))
    trainer.train()
    trainer.evaluate()
    files = glob.glob(str(tmp_path / "vdl" / "**" / "vdlrecords.*.log"), recursive=True)
    assert len(files) == 1, files
    tags = set(LogReader(file_path=files[0]).get_tags()["scalar"])
    assert {"train/loss", "eval/loss"} <= tags


def test_resume_on_the_same_layout_is_bit_exact(tmp_path):
    """Interrupt after step 2, resume from checkpoint-2: steps 3-4 and the final weights equal an
    uninterrupted run exactly (optimizer moments, schedule, RNG and data position all restored)."""

    class StopAfter(TrainerCallback):
        def __init__(self, step):
            self.step = step

        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == self.step:
                control.should_training_stop = True

    def run(out, init_seed, resume=None, callbacks=()):
        paddle.seed(init_seed)
        model = RegressionModel()
        args = args_for(tmp_path, output_dir=str(out), max_steps=4, per_device_train_batch_size=4,
                        save_strategy="steps", save_steps=2, lr_scheduler_type="cosine", warmup_steps=1,
                        weight_decay=0.1, overwrite_output_dir=True)
        trainer = Trainer(model=model, args=args, train_dataset=regression_data(40), callbacks=list(callbacks))
        trainer.train(resume_from_checkpoint=resume)
        return model, [h["loss"] for h in trainer.state.log_history if "loss" in h]

    full_model, full = run(tmp_path / "full", 11)
    _, first_half = run(tmp_path / "part", 11, callbacks=[StopAfter(2)])  # "interrupted" after checkpoint-2
    assert first_half == full[:2]
    # another initialisation, as in a fresh process: resuming must overwrite all of it
    resumed_model, resumed = run(tmp_path / "part", 999, resume=str(tmp_path / "part" / "checkpoint-2"))
    assert resumed == full  # exact: the restored history (steps 1-2) plus steps 3-4 trained again
    for a, b in zip(full_model.parameters(), resumed_model.parameters()):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


class RecordingDataset(paddle.io.Dataset):
    """regression_data that records which indices the trainer reads."""

    def __init__(self, n):
        self.samples, self.read = regression_data(n), []

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, index):
        self.read.append(int(index))
        return self.samples[index]


def checkpointed_run(tmp_path, name, resume=None, max_steps=4, save_steps=2, **options):
    """Batch 4 over 32 samples (8 steps per epoch), checkpoints every ``save_steps``; returns
    (trainer, dataset, what the optimizer and schedule held at train begin)."""
    seen = {}

    class AtTrainBegin(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            seen["moments"] = sum(len(v) for v in trainer.optimizer._accumulators.values())
            seen["lr_step"] = trainer.lr_scheduler.last_epoch
            seen["global_step"] = state.global_step

    data = RecordingDataset(32)
    args = args_for(tmp_path, output_dir=str(tmp_path / name), max_steps=max_steps, per_device_train_batch_size=4,
                    save_strategy="steps", save_steps=save_steps, lr_scheduler_type="cosine",
                    overwrite_output_dir=True, **options)
    trainer = Trainer(model=RegressionModel(), args=args, train_dataset=data, callbacks=[AtTrainBegin()])
    trainer.train(resume_from_checkpoint=resume)
    return trainer, data, seen


def test_ignore_save_lr_and_optim_writes_weights_only_and_resuming_it_needs_ignore_load(tmp_path):
    from paddletrainer.checkpoint import CheckpointError, read_index

    checkpointed_run(tmp_path, "weights_only", ignore_save_lr_and_optim=True)
    ckpt = str(tmp_path / "weights_only" / "checkpoint-2")
    index = read_index(ckpt)
    assert index["tensors"] and not any(k.startswith("optim/") for k in index["tensors"])
    checkpointed_run(tmp_path, "full")
    assert any(k.startswith("optim/") for k in read_index(str(tmp_path / "full" / "checkpoint-2"))["tensors"])
    # a full resume from it would silently restart the optimizer and schedule: refused, as in PaddleNLP
    with pytest.raises(CheckpointError, match="ignore_load_lr_and_optim"):
        checkpointed_run(tmp_path, "resume_weights_only", resume=ckpt)
    checkpointed_run(tmp_path, "warm", resume=ckpt, ignore_load_lr_and_optim=True)


def test_ignore_load_lr_and_optim_is_a_warm_start_from_the_weights(tmp_path):
    def losses(trainer):
        return [h["loss"] for h in trainer.state.log_history if "loss" in h]

    first, _, _ = checkpointed_run(tmp_path, "first")
    ckpt = str(tmp_path / "first" / "checkpoint-2")
    _, _, seen = checkpointed_run(tmp_path, "full_resume", resume=ckpt)
    assert seen["moments"] > 0 and seen["lr_step"] == 2 and seen["global_step"] == 2
    warm, _, seen = checkpointed_run(tmp_path, "warm", resume=ckpt, ignore_load_lr_and_optim=True)
    assert seen["moments"] == 0 and seen["lr_step"] == 0 and seen["global_step"] == 0  # PaddleNLP: fresh state
    assert len(losses(warm)) == 4  # all 4 steps trained, on the data of steps 1-4
    # the same first batch as the first run, but the trained weights of checkpoint-2: a lower loss
    assert losses(warm)[0] < losses(first)[0]


def test_ignore_data_skip_restarts_the_current_epoch_and_keeps_finished_ones_skipped(tmp_path):
    # 8 steps per epoch; checkpoint-10 is 2 steps into epoch 1. The loader reads ahead within an epoch, so
    # compare the first 8 reads after the resume (its steps 11-12) with the uninterrupted run's epoch 1.
    _, fresh, _ = checkpointed_run(tmp_path, "first", max_steps=12, save_steps=10)
    epoch1 = fresh.read[32:]
    ckpt = str(tmp_path / "first" / "checkpoint-10")
    _, skipping, _ = checkpointed_run(tmp_path, "skip", resume=ckpt, max_steps=12, save_steps=10)
    _, restarting, _ = checkpointed_run(tmp_path, "noskip", resume=ckpt, max_steps=12, save_steps=10,
                                        ignore_data_skip=True)
    assert skipping.read[:8] == epoch1[8:16]  # where the uninterrupted run was at steps 11-12
    assert restarting.read[:8] == epoch1[:8]  # epoch 1 from its beginning, epoch 0 still skipped


def test_minimum_eval_times_lowers_eval_steps_like_paddlenlp(tmp_path):
    args = args_for(tmp_path, max_steps=40, per_device_train_batch_size=2, evaluation_strategy="steps",
                    eval_steps=100, minimum_eval_times=2)
    trainer = Trainer(model=RegressionModel(), args=args, train_dataset=regression_data(), eval_dataset=regression_data(8))
    trainer.train()
    assert trainer.args.eval_steps == 20  # 40 / 2, rounded down to a multiple of 10 (at least 10)
    assert [h["step"] for h in trainer.state.log_history if "eval_loss" in h] == [20, 40]


def test_data_parallel_finds_unused_parameters_unless_recompute_is_on(tmp_path):
    from paddletrainer.parallel.apply import _find_unused_parameters

    model = RegressionModel()
    assert _find_unused_parameters(model, None) is True  # ddp_find_unused_parameters unset
    assert _find_unused_parameters(model, False) is False
    model.enable_recompute = True
    assert _find_unused_parameters(model, None) is False


def test_sequence_parallel_registers_its_gradient_hooks_under_tensor_parallel(monkeypatch):
    # Wiring only: the hooks themselves are checked against one-process math in
    # tests/distributed/test_sequence_parallel.py (fused and unfused).
    from paddletrainer.parallel import apply

    calls = []
    monkeypatch.setattr(apply, "register_sequence_parallel_hooks",
                        lambda model, steps, fused: calls.append((model, steps, fused)))
    from paddletrainer.parallel.config import ParallelConfig
    from paddletrainer.parallel.topology import Topology

    class Wrapped(Exception):
        pass

    def stop_at_tensor_parallel(model, topology):
        raise Wrapped

    monkeypatch.setattr(apply, "apply_tensor_parallel", stop_at_tensor_parallel)
    model = RegressionModel()
    tp2 = Topology.of(rank=0, local_rank=0, tp_degree=2, hcg=object())  # a stand-in: groups "exist"
    optimizer = paddle.optimizer.AdamW(parameters=model.parameters())
    for sequence_parallel, expected in ((False, []), (True, [(model, 4, True)])):
        model.linear.bias.sequence_parallel = sequence_parallel  # the model agrees with the option
        args = ParallelConfig(layout=tp2.layout, sequence_parallel=sequence_parallel, accumulate_steps=4,
                              fuse_sequence_parallel_allreduce=True)
        with pytest.raises(Wrapped):
            apply.parallelize(model, optimizer, tp2, args)
        assert calls == expected


class TokenRegression(paddle.nn.Layer):
    """Mean embedding of input_ids → a scalar, trained towards ``labels``."""

    def __init__(self):
        super().__init__()
        self.embed = paddle.nn.Embedding(10, 4)
        self.head = paddle.nn.Linear(4, 1)

    def forward(self, input_ids, labels=None):
        pred = self.head(self.embed(input_ids).mean(axis=1)).squeeze(-1)
        return (paddle.nn.functional.mse_loss(pred, labels), pred) if labels is not None else (pred,)


def test_count_trained_tokens_counts_all_and_non_pad_tokens_like_paddlenlp(tmp_path):
    # 12 samples of 5 ids with 2 pads each (pad_token_id=0): 60 tokens, 36 of them real, per epoch
    data = [{"input_ids": np.array([i % 9 + 1, 3, 4, 0, 0], dtype="int64"), "labels": np.float32(i % 3)}
            for i in range(12)]
    args = args_for(tmp_path, per_device_train_batch_size=4, num_train_epochs=2, count_trained_tokens=True,
                    pad_token_id=0, save_strategy="steps", save_steps=3, overwrite_output_dir=True)
    trainer = Trainer(model=TokenRegression(), args=args, train_dataset=data)
    trainer.train()
    assert (trainer.trained_tokens, trainer.trained_effective_tokens) == (120, 72)
