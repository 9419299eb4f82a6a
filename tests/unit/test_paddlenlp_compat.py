"""PaddleNLP drop-in: its module paths and helper names, the Trainer hooks its scripts override, the collator
contract, the default callback order, and the reporting callbacks (TensorBoard, W&B, per-rank metrics)."""
import json
import logging
import os
import subprocess
import sys
import textwrap
import threading

import numpy as np
import paddle
import pytest

import paddletrainer
from paddletrainer import Trainer, TrainerCallback, TrainingArguments
from paddletrainer.trainer_callback import DefaultFlowCallback, PrinterCallback, ProgressCallback
from paddletrainer.data import WholeStepBatchSampler
from paddletrainer.metrics import MetricsCallback
from paddletrainer.runtime import RobustnessCallback

from toy_models import RegressionModel, regression_data

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def make_args(tmp_path, **kw):
    kw.setdefault("report_to", "none")
    kw.setdefault("disable_tqdm", True)
    return TrainingArguments(output_dir=str(tmp_path / "out"), **kw)


class Recorder(TrainerCallback):
    """Keeps every training micro-batch's x values (to see the data order the loop followed)."""

    def __init__(self):
        self.xs = []

    def on_load_data_end(self, args, state, control, inputs=None, **kwargs):
        self.xs.append(np.asarray(inputs["x"]).ravel().tolist())


# ------------------------------------------------------------------------------------------------ aliases
def test_paddlenlp_module_paths_import_and_name_our_objects():
    from paddletrainer import trainer_callback, trainer_utils
    from paddletrainer.data import nested
    from paddletrainer.integrations import TensorBoardCallback, VisualDLCallback, WandbCallback
    from paddletrainer.metrics import callback as metrics_callback
    from paddletrainer.trainer import DEFAULT_CALLBACKS, Trainer as TrainerFromModule, logger
    from paddletrainer.utils import distributed_concat
    from paddletrainer.utils.doc import add_start_docstrings
    from paddletrainer.utils.helper import nested_concat, nested_detach, nested_numpify, nested_truncate

    assert trainer_callback.TrainerState is paddletrainer.TrainerState
    assert {"TrainerCallback", "TrainerState", "TrainerControl", "CallbackHandler"} <= set(trainer_callback.__all__)
    assert (VisualDLCallback, TensorBoardCallback, WandbCallback) == (
        metrics_callback.VisualDLCallback, metrics_callback.TensorBoardCallback, metrics_callback.WandbCallback)
    assert TrainerFromModule is Trainer and isinstance(logger, logging.Logger)
    assert DEFAULT_CALLBACKS == [DefaultFlowCallback, RobustnessCallback]
    assert (nested_concat, nested_detach, nested_numpify, nested_truncate, distributed_concat) == (
        nested.nested_concat, nested.nested_detach, nested.nested_numpify, nested.nested_truncate,
        nested.distributed_concat)
    assert callable(add_start_docstrings) and callable(trainer_utils.find_batch_size)
    assert paddletrainer.strtobool("yes") is True and paddletrainer.strtobool("0") is False
    assert paddletrainer.logger is logging.getLogger("paddletrainer")


def test_add_start_docstrings_prepends_the_parent_docs():
    from paddletrainer.utils.doc import add_end_docstrings, add_start_docstrings

    @add_start_docstrings("Parent options.\n", None)
    class Child:
        """Child options."""

    @add_end_docstrings(" (end)")
    def f():
        """f"""

    assert Child.__doc__ == "Parent options.\nChild options."
    assert f.__doc__ == "f (end)"


def test_nested_helpers_keep_containers_and_pad_ragged_batches():
    from paddletrainer.utils.helper import nested_concat, nested_detach, nested_numpify, nested_truncate

    a = (paddle.ones([2, 3]), {"ids": np.zeros((2, 2), "int64")})
    b = (paddle.full([1, 5], 2.0), {"ids": np.ones((1, 4), "int64")})
    joined = nested_concat(a, b, padding_index=-1)
    assert isinstance(joined, tuple) and isinstance(joined[1], dict)
    assert joined[0].shape == [3, 5] and float(joined[0][0, 4]) == -1.0 and float(joined[0][2, 4]) == 2.0
    np.testing.assert_array_equal(joined[1]["ids"], [[0, 0, -1, -1], [0, 0, -1, -1], [1, 1, 1, 1]])
    as_numpy = nested_numpify(nested_detach((paddle.ones([2], dtype="float16"),)))
    assert as_numpy[0].dtype == np.float32
    assert nested_truncate([np.arange(5), (np.arange(6),)], 2)[1][0].tolist() == [0, 1]
    with pytest.raises(TypeError, match="same type"):
        nested_concat((paddle.ones([1]),), [paddle.ones([1])])


def test_distributed_concat_on_one_process_truncates_and_lifts_scalars():
    from paddletrainer.utils import distributed_concat

    out = distributed_concat([paddle.arange(6).reshape([3, 2]), paddle.to_tensor(1.5)], num_total_examples=2)
    assert out[0].shape == [2, 2] and out[1].shape == [1]


def test_find_batch_size_finds_the_first_tensor_depth_first():
    from paddletrainer.trainer_utils import find_batch_size

    assert find_batch_size({"a": paddle.to_tensor(3.0), "b": [np.zeros((7, 2))]}) == 7
    assert find_batch_size((None, paddle.zeros([4, 1]))) == 4
    assert find_batch_size({"a": 1}) is None


def test_distributed_seeds_follow_paddlenlp_formula():
    from types import SimpleNamespace

    from paddletrainer.trainer_utils import _get_distributed_seeds

    assert _get_distributed_seeds(7) == (7, 8, 7)  # one process: world 1, every rank 0
    topo = SimpleNamespace(tp_rank=1, tp_degree=2, pp_rank=1, pp_degree=2, dp_rank=1, dp_degree=2, sharding_rank=0)
    original = paddle.distributed.get_world_size
    paddle.distributed.get_world_size = lambda *a: 8
    try:
        # global: seed + pp·mp + dp·mp·pp; local adds world and the mp rank; random: seed + 100·pp
        assert _get_distributed_seeds(100, topo) == (100 + 2 + 4, 100 + 8 + 1 + 2 + 4, 200)
    finally:
        paddle.distributed.get_world_size = original


# ------------------------------------------------------------------------------------------------ callbacks
def test_default_callbacks_in_paddlenlp_order(tmp_path):
    class Mine(TrainerCallback):
        pass

    trainer = Trainer(RegressionModel(), args=make_args(tmp_path, report_to=["jsonl", "visualdl"], disable_tqdm=False),
                      callbacks=[Mine])
    kinds = [type(cb) for cb in trainer.callback_handler.callbacks]
    from paddletrainer.integrations import VisualDLCallback

    assert kinds == [DefaultFlowCallback, RobustnessCallback, MetricsCallback, VisualDLCallback, Mine, ProgressCallback]
    trainer = Trainer(RegressionModel(), args=make_args(tmp_path), callbacks=[Mine])
    assert [type(cb) for cb in trainer.callback_handler.callbacks] == [
        DefaultFlowCallback, RobustnessCallback, Mine, PrinterCallback]


def test_duplicate_callback_warns_on_the_package_logger_naming_the_class(tmp_path, monkeypatch):
    class Twice(TrainerCallback):
        pass

    messages = []
    monkeypatch.setattr(paddletrainer.logger, "warning", lambda msg, *a, **k: messages.append(msg))
    Trainer(RegressionModel(), args=make_args(tmp_path), callbacks=[Twice, Twice])
    assert any(str(Twice) in m for m in messages)


def test_metrics_output_path_writes_each_ranks_logs_as_json_lines(tmp_path):
    out = tmp_path / "per_rank"
    trainer = Trainer(RegressionModel(), args=make_args(tmp_path, max_steps=2, logging_steps=1,
                                                         metrics_output_path=str(out)),
                      train_dataset=regression_data(16))
    trainer.train()
    rows = [json.loads(line) for line in (out / "metrics_rank0.json").read_text().splitlines()]
    assert [r["train/global_step"] for r in rows if "train/loss" in r] == [1, 2]


def test_metrics_output_path_writer_is_not_in_the_callback_list_as_in_paddlenlp(tmp_path):
    # PaddleNLP writes metrics_output_path outside its callbacks: a user's callbacks[-2] and len(callbacks) agree
    class Mine(TrainerCallback):
        pass

    out = tmp_path / "per_rank"
    trainer = Trainer(RegressionModel(), args=make_args(tmp_path, max_steps=2, logging_steps=1,
                                                         metrics_output_path=str(out)),
                      train_dataset=regression_data(16), callbacks=[Mine])
    assert [type(cb) for cb in trainer.callback_handler.callbacks] == [
        DefaultFlowCallback, RobustnessCallback, Mine, PrinterCallback]
    trainer.train()
    rows = [json.loads(line) for line in (out / "metrics_rank0.json").read_text().splitlines()]
    assert [r["train/global_step"] for r in rows if "train/loss" in r] == [1, 2]


# ------------------------------------------------------------------------------------------------ hooks
def test_subclass_train_sampler_decides_the_data_order(tmp_path):
    data = [{"x": np.array([float(i)], "float32"), "labels": np.float32(i)} for i in range(8)]

    class Reversed(paddle.io.BatchSampler):
        def __init__(self):
            self.batch_size = 2

        def __iter__(self):
            for start in range(6, -1, -2):
                yield [start, start + 1]

        def __len__(self):
            return 4

    class MyTrainer(Trainer):
        def _get_train_sampler(self):
            return Reversed()

    rec = Recorder()
    MyTrainer(RegressionModel(), args=make_args(tmp_path, per_device_train_batch_size=2, max_steps=3),
              train_dataset=data, callbacks=[rec]).train()
    assert rec.xs == [[6.0, 7.0], [4.0, 5.0], [2.0, 3.0]]


def test_subclass_sampler_is_cut_to_whole_steps_and_skips_on_resume():
    inner = paddle.io.BatchSampler(list(range(10)), batch_size=2, shuffle=False)  # 5 micro-batches
    sampler = WholeStepBatchSampler(inner, batch_size=2, data_world_size=1, step_span=4)  # 2 per step
    assert sampler.samples_per_epoch() == 8 and list(sampler) == [[0, 1], [2, 3], [4, 5], [6, 7]]
    sampler.set_epoch(0, consumed_in_epoch=4)
    assert list(sampler) == [[4, 5], [6, 7]]
    with pytest.raises(ValueError, match="no len"):
        WholeStepBatchSampler(iter([[0]]), batch_size=1, data_world_size=1, step_span=1)


def test_subclass_eval_sampler_is_used_and_evaluation_loop_takes_a_plain_iterator(tmp_path):
    data = regression_data(10)
    seen = []

    class MyTrainer(Trainer):
        def _get_eval_sampler(self, eval_dataset):
            seen.append(len(eval_dataset))
            return paddle.io.BatchSampler(eval_dataset, batch_size=5, shuffle=False)

    trainer = MyTrainer(RegressionModel(), args=make_args(tmp_path), eval_dataset=data)
    loader = trainer.get_eval_dataloader()
    assert seen == [10] and len(loader) == 2
    from_loader = trainer.evaluation_loop(loader, prediction_loss_only=True)
    from_iterator = trainer.evaluation_loop(loader(), prediction_loss_only=True, max_eval_iters=10)
    assert from_iterator.metrics["eval_loss"] == pytest.approx(from_loader.metrics["eval_loss"], rel=1e-6)
    assert from_iterator.num_samples == 10


def test_small_hooks_rank_queries_num_examples_gather_and_rotation(tmp_path):
    trainer = Trainer(RegressionModel(), args=make_args(tmp_path, max_steps=3, save_steps=1),
                      train_dataset=regression_data(24), eval_dataset=regression_data(6))
    assert trainer.is_world_process_zero() and trainer.is_local_process_zero()
    assert trainer.num_examples(trainer.get_eval_dataloader()) == 6
    t = paddle.ones([2])
    assert trainer._nested_gather(t) is t and trainer._nested_gather(None) is None
    trainer.train()
    out = tmp_path / "out"
    assert sorted(p.name for p in out.iterdir() if p.name.startswith("checkpoint-")) == [
        "checkpoint-1", "checkpoint-2", "checkpoint-3"]
    trainer.args.save_total_limit = 1
    trainer._rotate_checkpoints(use_mtime=False)
    assert sorted(p.name for p in out.iterdir() if p.name.startswith("checkpoint-")) == ["checkpoint-3"]


# ------------------------------------------------------------------------------------------------ collation
def test_collator_sees_raw_samples_and_unused_keys_are_dropped_after_collation(tmp_path):
    data = [dict(s, text=f"doc {i}", idx=i) for i, s in enumerate(regression_data(8))]
    got = []

    def collate(features):
        got.append(sorted(features[0]))
        batch = {k: np.stack([f[k] for f in features]) for k in ("x", "labels", "idx")}
        batch["n_chars"] = np.array([len(f["text"]) for f in features])
        return batch

    rec = Recorder()
    keys = []

    class Keys(TrainerCallback):
        def on_load_data_end(self, args, state, control, inputs=None, **kwargs):
            keys.append(sorted(inputs))

    Trainer(RegressionModel(), args=make_args(tmp_path, max_steps=1, per_device_train_batch_size=4),
            train_dataset=data, data_collator=collate, callbacks=[rec, Keys()]).train()
    assert got[0] == ["idx", "labels", "text", "x"]  # the collator saw every field, "text" included
    assert keys == [["labels", "x"]]  # the model only gets what its forward takes (plus labels)


def test_hf_dataset_columns_are_removed_like_paddlenlp(tmp_path):
    datasets = pytest.importorskip("datasets")
    rows = regression_data(8)
    ds = datasets.Dataset.from_dict({"x": [r["x"].tolist() for r in rows], "labels": [float(r["labels"]) for r in rows],
                                     "text": [f"t{i}" for i in range(8)]})
    trainer = Trainer(RegressionModel(), args=make_args(tmp_path), train_dataset=ds)
    assert trainer._remove_unused_columns(ds).column_names == ["x", "labels"]
    plain = [dict(r, text="t") for r in rows]
    assert trainer._remove_unused_columns(plain) is plain  # other datasets reach the collator whole
    trainer.args.remove_unused_columns = False
    assert trainer._remove_unused_columns(ds).column_names == ["x", "labels", "text"]


@pytest.mark.parametrize("workers", [0, 1])
def test_collator_exception_ends_the_run_with_the_error(tmp_path, workers):
    script = tmp_path / "bad_collator.py"
    script.write_text(textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {os.path.join(REPO, "tests", "unit")!r})
        import numpy as np
        from paddletrainer import Trainer, TrainingArguments
        from toy_models import RegressionModel, regression_data

        def collate(features):
            return {{"x": np.stack([f["text"] for f in features])}}

        args = TrainingArguments(output_dir={str(tmp_path / "out")!r}, max_steps=2, report_to="none",
                                 dataloader_num_workers={workers}, disable_tqdm=True)
        Trainer(RegressionModel(), args=args, train_dataset=regression_data(8), data_collator=collate).train()
    """))
    # Before the fix the reader thread died and the loop waited forever (the timeout turns that into a failure).
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=180, cwd=REPO)
    # workers=1: Paddle's worker sends the KeyError back and the reader fails with it (its traceback is printed)
    assert proc.returncode != 0 and "KeyError" in proc.stderr and "text" in proc.stderr.split("KeyError", 1)[1]


def test_a_worker_error_is_printed_before_the_loaders_own_error_ends_the_run():
    # Paddle's reader thread kills the queue (the caller's next() fails) before it prints the worker's
    # exception: the loader must wait for that thread, or a fast exit loses the message (seen in CI under load)
    import threading
    import time

    from paddletrainer.data import worker_error_printed_first

    printed = []

    class KilledQueueIterator:
        def __init__(self):
            self._thread = threading.Thread(target=lambda: (time.sleep(0.3), printed.append("KeyError: 'text'")))
            self._thread.start()

        def __next__(self):
            raise SystemError("(Fatal) Blocking queue is killed because the data reader raises an exception.")

    with pytest.raises(SystemError, match="Blocking queue is killed"):
        next(worker_error_printed_first(KilledQueueIterator()))
    assert printed == ["KeyError: 'text'"]


# ------------------------------------------------------------------------------------------------ writers
def test_tensorboard_callback_writes_event_files_read_back_by_tensorboard(tmp_path):
    pytest.importorskip("tensorboardX")
    event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    from paddletrainer import TrainerControl, TrainerState
    from paddletrainer.integrations import TensorBoardCallback

    args = make_args(tmp_path, logging_dir=str(tmp_path / "tb"))
    cb, state = TensorBoardCallback(), TrainerState()
    assert cb.tb_writer is None
    cb.on_train_begin(args, state, TrainerControl())
    assert cb.tb_writer.log_dir == str(tmp_path / "tb")
    for step in (1, 2):
        state.global_step = step
        cb.on_log(args, state, TrainerControl(), logs={"loss": 10.0 - step, "eval_acc": 0.5})
    cb.on_train_end(args, state, TrainerControl())
    assert cb.tb_writer is None
    ea = event_accumulator.EventAccumulator(str(tmp_path / "tb"))
    ea.Reload()
    assert [(s.step, s.value) for s in ea.Scalars("train/loss")] == [(1, 9.0), (2, 8.0)]
    assert [s.value for s in ea.Scalars("eval/acc")] == [0.5, 0.5]


def test_wandb_callback_offline_run_named_by_trial_and_grouped_by_run_name(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    from paddletrainer import TrainerControl, TrainerState
    from paddletrainer.integrations import WandbCallback

    args = make_args(tmp_path, logging_dir=str(tmp_path / "wb"), run_name="group-a")
    cb, state = WandbCallback(), TrainerState(trial_name="trial-1")
    assert not cb._initialized
    cb.on_train_begin(args, state, TrainerControl())
    run = cb._wandb.run
    assert cb._initialized and (run.name, run.group) == ("trial-1", "group-a")
    state.global_step = 3
    cb.on_log(args, state, TrainerControl(), logs={"loss": 1.25})
    assert run.summary["train/loss"] == 1.25 and run.summary["train/global_step"] == 3
    cb.on_train_end(args, state, TrainerControl())
    assert cb._wandb.run is None and (tmp_path / "wb" / "wandb").is_dir()


def test_missing_writer_library_fails_with_an_install_hint(monkeypatch, tmp_path):
    from paddletrainer.integrations import TensorBoardCallback, WandbCallback

    monkeypatch.setitem(sys.modules, "tensorboardX", None)
    monkeypatch.setitem(sys.modules, "wandb", None)
    hint = r"report_to=tensorboard needs the 'tensorboardX' package: pip install \"paddletrainer\[tensorboard\]\""
    with pytest.raises(ImportError, match=hint):
        TensorBoardCallback()
    with pytest.raises(ImportError, match=r"pip install \"paddletrainer\[wandb\]\""):
        WandbCallback()
    with pytest.raises(ImportError, match=r"pip install \"paddletrainer\[wandb\]\""):
        Trainer(RegressionModel(), args=make_args(tmp_path, report_to="wandb"))


# ------------------------------------------------------------------------------------------------ memory
def test_skip_memory_metrics_false_reports_host_memory_of_train_eval_and_predict(tmp_path):
    def trainer(**kw):
        return Trainer(RegressionModel(), args=make_args(tmp_path, max_steps=2, **kw),
                       train_dataset=regression_data(16), eval_dataset=regression_data(8))

    quiet = trainer()
    assert not [k for k in quiet.train().metrics if "_mem_" in k]
    loud = trainer(skip_memory_metrics=False, evaluation_strategy="steps", eval_steps=1)
    train_metrics = loud.train().metrics
    # the evaluations inside train() belong to the train stage; they add no eval_mem_* keys of their own
    assert all("eval_mem" not in k for entry in loud.state.log_history for k in entry)
    assert isinstance(train_metrics["train_mem_cpu_alloc_delta"], int)
    assert train_metrics["train_mem_cpu_peaked_delta"] >= 0
    assert {"eval_mem_cpu_alloc_delta", "eval_mem_cpu_peaked_delta"} <= set(loud.evaluate())
    assert "test_mem_cpu_alloc_delta" in loud.predict(regression_data(4)).metrics


def test_memory_tracker_sees_a_host_allocation_inside_the_stage():
    from paddletrainer.metrics.process_memory import MemoryTracker

    tracker = MemoryTracker(enabled=True)
    tracker.start("train")
    block = np.ones(64 * 2**20, dtype=np.uint8)  # 64 MiB, touched
    metrics = tracker.stop("train")
    assert metrics["train_mem_cpu_alloc_delta"] > 48 * 2**20
    del block
    assert MemoryTracker(enabled=False).stop("train") == {}


# ------------------------------------------------------------------------------------------------ PaddleFormers names
def test_paddleformers_parallel_names_are_aliases_of_the_paddlenlp_degrees(tmp_path, monkeypatch):
    from paddletrainer import PdArgumentParser

    monkeypatch.setenv("PADDLE_TRAINERS_NUM", "8")
    config = {"output_dir": str(tmp_path / "o"), "tensor_model_parallel_size": 2, "pipeline_model_parallel_size": 2,
              "sharding": "stage1", "sharding_parallel_size": 2, "data_parallel_size": 1,
              "virtual_pipeline_model_parallel_size": 1, "gradient_accumulation_steps": 2}
    (args,) = PdArgumentParser(TrainingArguments).parse_dict(config)
    assert (args.tensor_parallel_degree, args.pipeline_parallel_degree, args.sharding_parallel_degree) == (2, 2, 2)
    assert args.parallel_degrees.dp == 1
    with pytest.raises(ValueError, match="tensor_model_parallel_size=2 and tensor_parallel_degree=4 disagree"):
        TrainingArguments(output_dir=str(tmp_path), tensor_model_parallel_size=2, tensor_parallel_degree=4)
    with pytest.raises(ValueError, match="data_parallel_size=4 does not match the layout.*data parallel 2"):
        TrainingArguments(output_dir=str(tmp_path), tensor_model_parallel_size=4, data_parallel_size=4)
    (args,) = PdArgumentParser(TrainingArguments).parse_dict({**config, "virtual_pipeline_model_parallel_size": 2})
    assert args.parallel_config.virtual_pp_degree == 2
    with pytest.raises(ValueError, match="virtual_pipeline_model_parallel_size=2 needs pipeline_parallel_degree >= 2"):
        TrainingArguments(output_dir=str(tmp_path), virtual_pipeline_model_parallel_size=2)
    assert TrainingArguments(output_dir=str(tmp_path), context_parallel_size=2).parallel_degrees.cp == 2
    assert TrainingArguments(output_dir=str(tmp_path), expert_model_parallel_size=2).parallel_degrees.ep == 2
    with pytest.raises(ValueError, match="expert_tensor_parallel_degree=2 is not supported"):
        TrainingArguments(output_dir=str(tmp_path), expert_tensor_model_parallel_size=2)


def test_unknown_report_to_fails_before_any_process_group(tmp_path, monkeypatch):
    import paddletrainer.trainer as trainer_module

    monkeypatch.setattr(trainer_module, "init_topology", lambda args: pytest.fail("groups created before the check"))
    with pytest.raises(ValueError, match="report_to: unknown writer 'comet'; valid values are .*tensorboard.*wandb"):
        Trainer(RegressionModel(), args=make_args(tmp_path, report_to="comet"))


# ------------------------------------------------------------------------------------------------ checkpoint interop
def _sequential_sampler(self):
    return paddle.io.BatchSampler(self.train_dataset, batch_size=self.args.per_device_train_batch_size, shuffle=False)


def test_a_paddlenlp_checkpoint_resumes_on_paddlenlp_loss_curve_and_is_found_by_get_last_checkpoint(tmp_path):
    paddlenlp_trainer = pytest.importorskip("paddlenlp.trainer")
    from paddletrainer import get_last_checkpoint

    data = regression_data(32)
    common = dict(max_steps=6, logging_steps=1, learning_rate=0.1, per_device_train_batch_size=4, seed=3,
                  lr_scheduler_type="linear", warmup_steps=0, report_to="none", disable_tqdm=True)
    theirs_dir = tmp_path / "paddlenlp"
    # Each run in its own name scope, as each would be in its own process: the optimizer state is keyed by the
    # parameters' and accumulators' generated names.
    with paddle.utils.unique_name.guard():
        paddle.seed(0)
        NLPTrainer = type("NLPTrainer", (paddlenlp_trainer.Trainer,), {"_get_train_sampler": _sequential_sampler})
        their_losses = []  # PaddleNLP 3.0.0b4 keeps no log_history: record on_log
        LossLog = type("LossLog", (paddlenlp_trainer.TrainerCallback,), {
            "on_log": lambda self, args, state, control, logs=None, **kw: their_losses.extend(
                [logs["loss"]] if logs and "loss" in logs else [])})
        theirs = NLPTrainer(model=RegressionModel(), train_dataset=data, callbacks=[LossLog()],
                            args=paddlenlp_trainer.TrainingArguments(output_dir=str(theirs_dir), save_steps=3, **common))
        theirs.train()
    assert get_last_checkpoint(str(theirs_dir)).endswith("checkpoint-6")  # no completion marker needed

    with paddle.utils.unique_name.guard():
        paddle.seed(1)  # different initial weights: everything must come from the checkpoint
        Ours = type("Ours", (Trainer,), {"_get_train_sampler": _sequential_sampler})
        ours = Ours(RegressionModel(), train_dataset=data,
                    args=TrainingArguments(output_dir=str(tmp_path / "ours"), **common))
        ours.train(resume_from_checkpoint=str(theirs_dir / "checkpoint-3"))
    our_losses = [h["loss"] for h in ours.state.log_history if "loss" in h]
    assert ours.state.global_step == 6
    np.testing.assert_allclose(our_losses, their_losses[3:], rtol=0, atol=1e-5)


def test_a_script_declaring_virtual_pp_degree_in_its_model_arguments_parses_as_under_paddlenlp():
    from paddletrainer import PdArgumentParser

    # PaddleNLP's llm scripts (run_pretrain.py, run_finetune.py) declare virtual_pp_degree in ModelArguments:
    # TrainingArguments must not declare an option of that name, or their parser fails to build.
    import dataclasses

    @dataclasses.dataclass
    class ModelArguments:
        virtual_pp_degree: int = dataclasses.field(default=1)

    model_args, training_args = PdArgumentParser((ModelArguments, TrainingArguments)).parse_args_into_dataclasses(
        ["--output_dir", "out", "--virtual_pp_degree", "2"])
    assert model_args.virtual_pp_degree == 2 and training_args.parallel_config.virtual_pp_degree == 1


def test_an_evaluation_that_raises_ends_its_memory_stage_so_the_next_predict_is_measured(tmp_path):
    def failing_metrics(_):
        raise RuntimeError("metric failed")

    trainer = Trainer(RegressionModel(), args=make_args(tmp_path, skip_memory_metrics=False),
                      eval_dataset=regression_data(8), compute_metrics=failing_metrics)
    with pytest.raises(RuntimeError, match="metric failed"):
        trainer.evaluate()
    assert not any(t.name == "paddletrainer-memory" and t.is_alive() for t in threading.enumerate())
    trainer.compute_metrics = None
    assert "test_mem_cpu_alloc_delta" in trainer.predict(regression_data(4)).metrics
