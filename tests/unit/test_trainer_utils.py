"""trainer_utils: the shared enums and result types, seeding, checkpoint discovery and speed metrics."""

import ast
import os
import random
import sys
from pathlib import Path

import numpy as np
import pytest

from paddletrainer import trainer_utils
from paddletrainer.trainer_utils import (
    CHECKPOINT_COMPLETE_MARKER,
    PREFIX_CHECKPOINT_DIR,
    EvalLoopOutput,
    EvalPrediction,
    IntervalStrategy,
    OptimizerNames,
    PredictionOutput,
    SchedulerType,
    ShardingOption,
    TrainOutput,
    default_logdir,
    get_last_checkpoint,
    has_length,
    set_seed,
    speed_metrics,
)


def _import_roots(module) -> set:
    roots = set()
    tree = ast.parse(Path(module.__file__).read_text())
    mirrors = {id(n) for block in ast.walk(tree) if isinstance(block, ast.If)
               and getattr(block.test, "id", None) == "TYPE_CHECKING" for n in ast.walk(block)}
    for node in ast.walk(tree):
        if id(node) in mirrors:
            continue  # the lazy table's mirror for type checkers: never executed
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            roots.add("." + ",".join(a.name for a in node.names) if node.level else node.module.split(".")[0])
    return roots


def _relative_modules(module) -> set:
    """The package modules ``module`` imports (its lazy table's TYPE_CHECKING mirror left out: never executed)."""
    tree = ast.parse(Path(module.__file__).read_text())
    mirrors = {id(n) for block in ast.walk(tree) if isinstance(block, ast.If)
               and getattr(block.test, "id", None) == "TYPE_CHECKING" for n in ast.walk(block)}
    return {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level and n.module
            and id(n) not in mirrors}


def test_trainer_utils_and_seeding_import_only_stdlib_numpy_and_paddle():
    # leaves of the package's import graph, so every module may import them; trainer_utils (imported by
    # TrainingArguments, which must import without paddle) reaches seeding's names only through its PEP 562 alias,
    # and imports the paddle-free checkpoint naming and discovery, whose PaddleNLP names it re-exports, and the
    # stdlib-only PEP 562 mechanism
    from paddletrainer import lazy_exports
    from paddletrainer.runtime import seeding

    roots = _import_roots(trainer_utils) - set(sys.stdlib_module_names)
    assert {r for r in roots if not r.startswith(".")} <= {"numpy"}
    assert _relative_modules(trainer_utils) <= {"checkpoint.discovery", "checkpoint.placement", "lazy_exports"}
    assert _import_roots(lazy_exports) <= set(sys.stdlib_module_names)
    assert _import_roots(seeding) - set(sys.stdlib_module_names) <= {"numpy", "paddle"}
    assert trainer_utils.set_seed is seeding.set_seed


def test_enum_values_match_paddlenlp_spellings():
    assert [m.value for m in IntervalStrategy] == ["no", "steps", "epoch"]
    assert [m.value for m in SchedulerType] == ["linear", "cosine", "constant", "constant_with_warmup", "polynomial"]
    assert [m.value for m in ShardingOption] == ["stage1", "stage2", "stage3", "offload"]
    assert OptimizerNames("adamw") is OptimizerNames.ADAMW


def test_enum_members_compare_equal_to_their_strings():
    assert IntervalStrategy.STEPS == "steps" and str(SchedulerType.COSINE) == "cosine"
    assert f"{ShardingOption.SHARD_OP}" == "stage1"


def test_unknown_enum_value_error_lists_the_valid_values():
    with pytest.raises(ValueError) as err:
        OptimizerNames("adafactor")
    assert "'adafactor' is not a valid OptimizerNames" in str(err.value)
    assert all(m.value in str(err.value) for m in OptimizerNames)


def test_listed_optimizers_exist_in_paddle():
    import paddle

    names = {name.lower() for name in dir(paddle.optimizer)}
    assert all(m.value in names for m in OptimizerNames)


def test_eval_prediction_unpacks_and_indexes_like_a_tuple():
    p = EvalPrediction(predictions=np.ones(2), label_ids=np.zeros(2))
    preds, labels = p
    assert preds is p.predictions and labels is p[1] and len(p) == 2


def test_result_types_carry_their_fields():
    assert TrainOutput(10, 0.5, {"a": 1.0}).global_step == 10
    assert PredictionOutput(None, None, {"m": 1.0}).metrics == {"m": 1.0}
    assert EvalLoopOutput(None, None, None, 4).num_samples == 4


def test_set_seed_makes_python_numpy_and_paddle_repeat():
    import paddle

    def draw():
        return random.random(), float(np.random.rand()), float(paddle.rand([1]).item())

    set_seed(123)
    first = draw()
    set_seed(123)
    assert draw() == first
    set_seed(124)
    assert draw() != first


def _checkpoint(folder, step, complete=True):
    path = folder / f"{PREFIX_CHECKPOINT_DIR}-{step}"
    path.mkdir()
    if complete:
        (path / CHECKPOINT_COMPLETE_MARKER).touch()
    return str(path)


def test_last_checkpoint_is_the_highest_completed_step(tmp_path):
    _checkpoint(tmp_path, 5)
    expected = _checkpoint(tmp_path, 20)
    _checkpoint(tmp_path, 100, complete=False)  # the highest step, but an interrupted save
    _checkpoint(tmp_path, 9)
    (tmp_path / "checkpoint-300").write_text("a file, not a directory")
    (tmp_path / "checkpoint-final").mkdir()
    assert get_last_checkpoint(str(tmp_path)) == expected  # numeric order: 20 > 9


def test_last_checkpoint_is_none_without_completed_checkpoints(tmp_path):
    assert get_last_checkpoint(str(tmp_path)) is None
    _checkpoint(tmp_path, 3, complete=False)
    assert get_last_checkpoint(str(tmp_path)) is None
    assert get_last_checkpoint(str(tmp_path / "missing")) is None


def test_speed_metrics_reports_runtime_and_rates(monkeypatch):
    monkeypatch.setattr(trainer_utils.time, "time", lambda: 110.0)
    metrics = speed_metrics("train", 100.0, num_samples=50, num_steps=5, num_tokens=1000)
    assert metrics == {"train_runtime": 10.0, "train_samples_per_second": 5.0, "train_steps_per_second": 0.5,
                       "train_tokens_per_second": 100.0}
    assert speed_metrics("eval", 100.0) == {"eval_runtime": 10.0}


def test_default_logdir_is_runs_time_host():
    parts = default_logdir().split(os.sep)
    assert parts[0] == "runs" and len(parts) == 2 and "_" in parts[1]


def test_has_length_separates_sized_and_streaming_datasets():
    class Stream:
        def __iter__(self):
            yield 1

    assert has_length([1, 2]) and not has_length(Stream()) and not has_length(iter([1]))
