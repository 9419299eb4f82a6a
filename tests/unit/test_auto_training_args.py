"""``AutoTrainingArguments``: PaddleNLP's auto-parallel argument class, its degrees mapped onto our layout, its
engine-only options refused by name and its static-pass switches accepted with a warning."""
import json
import logging

import pytest

from paddletrainer import AutoTrainingArguments, PdArgumentParser, Trainer, TrainingArguments
from toy_models import RegressionModel, regression_data


def test_a_config_of_an_auto_parallel_script_parses_and_trains_on_our_layout(tmp_path, caplog):
    config = {"output_dir": str(tmp_path / "out"), "enable_auto_parallel": True, "max_steps": 2,
              "fused_linear_param_grad_add": True, "fuse_allreduce_split_to_reducescatter": True,
              "eliminate_transpose": True, "amp_custom_black_list": ["reduce_sum", "sin"], "report_to": "none",
              "tensor_parallel_degree": 1, "disable_tqdm": True}
    path = tmp_path / "auto.json"
    path.write_text(json.dumps(config))
    with caplog.at_level(logging.WARNING, logger="paddletrainer"):
        (args,) = PdArgumentParser(AutoTrainingArguments).parse_json_file(str(path))
    assert args.enable_auto_parallel and args.fused_linear_param_grad_add and args.eliminate_transpose
    assert "no effect" in caplog.text and "eliminate_transpose=True" in caplog.text
    assert args.parallel_degrees.dp == 1
    assert Trainer(RegressionModel(), args=args, train_dataset=regression_data(32)).train().global_step == 2


def test_enable_auto_parallel_is_required_here_and_still_refused_by_training_arguments(tmp_path):
    with pytest.raises(ValueError, match="AutoTrainingArguments needs enable_auto_parallel=True"):
        AutoTrainingArguments(output_dir=str(tmp_path))
    with pytest.raises(ValueError, match="enable_auto_parallel=True is not supported"):
        TrainingArguments(output_dir=str(tmp_path), enable_auto_parallel=True)


@pytest.mark.parametrize("option, value", [
    ("use_intermediate_api", True), ("refined_ops_patterns", "[]"), ("save_model_with_sharding_tensor_fusion", True),
    ("load_model_with_sharding_tensor_fusion", True), ("job_schedule_profiler_start", 3),
    ("job_schedule_profiler_end", 5)])
def test_engine_only_options_are_refused_by_name(tmp_path, option, value):
    with pytest.raises(ValueError, match=f"{option}=.* is not supported by paddletrainer: "):
        AutoTrainingArguments(output_dir=str(tmp_path), enable_auto_parallel=True, **{option: value})
