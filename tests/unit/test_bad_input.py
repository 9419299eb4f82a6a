"""Every bad input fails with one clear error — naming the option, the value and what is valid —
before any process group is created where that is possible. ``docs/errors.md`` lists the same table.

Multi-process worlds are simulated with ``PADDLE_TRAINERS_NUM`` (TrainingArguments reads it and creates no
group). Trainer-level cases that would need a process group replace ``init_topology`` with a tripwire, so a
missing early check fails the test instead of hanging it.
"""
import json
import os

import numpy as np
import paddle
import pytest

from paddletrainer import Trainer, TrainingArguments
from paddletrainer.checkpoint import CheckpointCorruptError, CheckpointMismatchError
from paddletrainer.checks import (
    check_batch_keys,
    check_dataset,
    check_model_for_layout,
    check_output_dir,
    check_pipeline_split,
)
from paddletrainer.training_args import ParallelDegrees


@pytest.fixture(autouse=True)
def _clean_launch_env(monkeypatch):
    for key in ("PADDLE_TRAINERS_NUM", "PADDLE_TRAINER_ID", "PADDLE_RANK_IN_NODE", "PADDLE_LOCAL_RANK"):
        monkeypatch.delenv(key, raising=False)


def one_line(exc_info) -> str:
    text = str(exc_info.value)
    assert "\n" not in text, f"the message spans several lines: {text!r}"
    return text


# ========================================================================= TrainingArguments (table-driven)
# (id, world size, options, substrings the message must contain: option, value, what is valid)
ARGS_CASES = [
    # degrees vs world size
    ("tp_does_not_divide_world", 4, dict(tensor_parallel_degree=3),
     ["tensor_parallel_degree=3", "does not divide the world size 4", "multiple of 3"]),
    ("tp_pp_do_not_divide_world", 6, dict(tensor_parallel_degree=2, pipeline_parallel_degree=2,
                                          gradient_accumulation_steps=2),
     ["tensor_parallel_degree=2 x pipeline_parallel_degree=2 = 4", "world size 6"]),
    ("tp_on_single_process", 1, dict(tensor_parallel_degree=2), ["tensor_parallel_degree=2", "world size 1"]),
    ("sharding_x_tp_do_not_divide", 4, dict(sharding="stage1", sharding_parallel_degree=4, tensor_parallel_degree=2),
     ["sharding_parallel_degree=4 x tensor_parallel_degree=2", "= 8", "world size 4"]),
    ("degree_zero", 2, dict(tensor_parallel_degree=0), ["tensor_parallel_degree=0", "-1 (unset) or a positive integer"]),
    ("degree_negative", 2, dict(pipeline_parallel_degree=-3), ["pipeline_parallel_degree=-3", "positive integer"]),
    # sharding
    ("sharding_degree_without_sharding", 2, dict(sharding_parallel_degree=2),
     ["sharding_parallel_degree=2", "without sharding", "stage1, stage2 or stage3"]),
    ("sharding_with_explicit_degree_1", 2, dict(sharding="stage1", sharding_parallel_degree=1),
     ["sharding='stage1'", "sharding_parallel_degree=1", "2-process"]),
    ("sharding_alias_contradiction", 4, dict(sharding="stage1", sharding_degree=2, sharding_parallel_degree=4),
     ["sharding_degree=2", "sharding_parallel_degree=4"]),
    ("sharding_offload_without_stage", 2, dict(sharding="offload"), ["sharding='offload'", "use 'stage3 offload'"]),
    ("sharding_two_stages", 2, dict(sharding="stage1 stage2"), ["sharding=", "2 stages", "stage1, stage2, stage3"]),
    ("sharding_unknown_stage", 2, dict(sharding="stage4"), ["sharding=", "stage4", "stage1"]),
    ("sharding_stage2_with_pp", 4, dict(sharding="stage2", sharding_parallel_degree=2, pipeline_parallel_degree=2,
                                        gradient_accumulation_steps=2),
     ["sharding='stage2'", "pipeline_parallel_degree=2", "stage1"]),
    ("sharding_stage3_with_pp", 4, dict(sharding="stage3", sharding_parallel_degree=2, pipeline_parallel_degree=2,
                                        gradient_accumulation_steps=2),
     ["sharding='stage3'", "pipeline_parallel_degree=2", "stage1"]),
    ("sharding_stage3_with_tp", 4, dict(sharding="stage3", sharding_parallel_degree=2, tensor_parallel_degree=2),
     ["sharding='stage3'", "tensor_parallel_degree=2", "stage1", "stage2"]),
    ("sharding_stage1_offload", 2, dict(sharding="stage1 offload"),
     ["sharding='stage1 offload'", "stage1 has no offload", "stage3 offload"]),
    ("sharding_stage2_offload_in_fp32", 2, dict(sharding="stage2 offload"),
     ["sharding='stage2 offload' is not supported", "use 'stage3 offload'"]),
    ("sharding_stage2_offload_with_dp", 4, dict(sharding="stage2 offload", sharding_parallel_degree=2),
     ["sharding='stage2 offload' is not supported", "use 'stage3 offload'"]),
    ("sharding_stage2_offload_refused", 2, dict(sharding="stage2 offload", bf16=True, fp16_opt_level="O2"),
     ["sharding='stage2 offload' is not supported", "checkpoint", "stage3 offload"]),
    ("stage3_segment_size_negative", 1, dict(sharding_stage3_segment_size=-1),
     ["sharding_stage3_segment_size=-1", ">= 0"]),
    ("skip_data_intervals_unsupported", 1, dict(skip_data_intervals=[[1, 2]]),
     ["skip_data_intervals=[[1, 2]]", "not supported", "dataset"]),
    ("offload_optim_unsupported", 1, dict(offload_optim=True), ["offload_optim=True", "not supported", "stage3 offload"]),
    ("stage1_allgather_overlap_refused", 2, dict(sharding="stage1", sharding_parallel_config="enable_stage1_allgather_overlap"),
     ["sharding_parallel_config=enable_stage1_allgather_overlap is not supported", "all-gathered during the next forward"]),
    ("amp_master_grad_multi_process", 2, dict(fp16=True, amp_master_grad=True),
     ["amp_master_grad=True is supported in one process only", "world size 2"]),
    # pipeline
    ("ga_below_pp", 2, dict(pipeline_parallel_degree=2, gradient_accumulation_steps=1),
     ["gradient_accumulation_steps=1", "pipeline_parallel_degree=2", "one micro-batch per stage"]),
    ("vpp_without_pp", 1, dict(virtual_pipeline_model_parallel_size=2),
     ["virtual_pipeline_model_parallel_size=2", "needs pipeline_parallel_degree >= 2"]),
    ("vpp_ga_between_pp_and_2pp", 2, dict(pipeline_parallel_degree=2, virtual_pipeline_model_parallel_size=2,
                                         gradient_accumulation_steps=3),
     ["gradient_accumulation_steps=3", "virtual_pipeline_model_parallel_size=2", "need 2", ">= 4"]),
    ("unknown_pipeline_option", 1, dict(pipeline_parallel_config="enable_magic"),
     ["pipeline_parallel_config", "enable_magic", "valid:", "enable_timer"]),
    ("unknown_tensor_option", 1, dict(tensor_parallel_config="sync_everything"),
     ["tensor_parallel_config", "sync_everything", "valid:", "sync_param"]),
    ("sep_and_context", 4, dict(sep_parallel_degree=2, context_parallel_degree=2),
     ["sep_parallel_degree=2", "context_parallel_degree=2", "cannot both be > 1"]),
    ("expert_not_dividing_data_ranks", 4, dict(expert_parallel_degree=3),
     ["expert_parallel_degree=3", "does not divide the data ranks", "use a divisor of 4"]),
    ("expert_with_pipeline_and_sharding", 8, dict(expert_parallel_degree=2, pipeline_parallel_degree=2,
                                                  gradient_accumulation_steps=2, sharding="stage1",
                                                  sharding_parallel_degree=2),
     ["expert_parallel_degree=2", "sharding_parallel_degree=2", "not supported yet"]),
    ("expert_with_sharding_stage2", 4, dict(expert_parallel_degree=2, sharding="stage2", sharding_parallel_degree=2),
     ["expert_parallel_degree=2", "sharding='stage2'", "not supported yet", "use sharding='stage1'"]),
    ("expert_names_disagree", 4, dict(expert_parallel_degree=2, use_expert_parallel=True),
     ["use_expert_parallel=True", "dp=4", "expert_parallel_degree=2", "set only one"]),
    ("unsupported_expert_tensor", 2, dict(expert_tensor_parallel_degree=2),
     ["expert_tensor_parallel_degree=2", "use -1 or 1"]),
    ("context_with_pipeline", 4, dict(context_parallel_degree=2, pipeline_parallel_degree=2,
                                      gradient_accumulation_steps=2),
     ["pipeline_parallel_degree=2", "context_parallel_degree=2", "not supported yet"]),
    ("unsupported_auto_parallel", 1, dict(enable_auto_parallel=True), ["enable_auto_parallel=True", "use False"]),
    ("unsupported_to_static", 1, dict(to_static=True), ["to_static=True", "use False"]),
    # enums
    ("bad_evaluation_strategy", 1, dict(evaluation_strategy="sometimes"),
     ["evaluation_strategy='sometimes'", "no, steps, epoch"]),
    ("bad_save_strategy", 1, dict(save_strategy="hourly"), ["save_strategy='hourly'", "steps"]),
    ("bad_logging_strategy", 1, dict(logging_strategy="always"), ["logging_strategy='always'", "epoch"]),
    ("bad_scheduler", 1, dict(lr_scheduler_type="wobble"), ["lr_scheduler_type='wobble'", "cosine"]),
    ("bad_optim", 1, dict(optim="adamx"), ["optim='adamx'", "adamw"]),
    ("bad_fp16_opt_level", 1, dict(fp16_opt_level="O3"), ["fp16_opt_level='O3'", "O0, O1, O2"]),
    ("bad_nan_inf_policy", 1, dict(nan_inf_policy="ignore"), ["nan_inf_policy='ignore'", "error, skip"]),
    ("bad_amp_on_cpu", 1, dict(amp_on_cpu="gpu"), ["amp_on_cpu='gpu'", "error, fp32_dry_run"]),
    ("bad_topo_order", 1, dict(hybrid_parallel_topo_order="tp_first"),
     ["hybrid_parallel_topo_order='tp_first'", "pp_first, sharding_first"]),
    # intervals and schedule
    ("eval_steps_needed", 1, dict(evaluation_strategy="steps", eval_steps=None, logging_steps=0),
     ["evaluation_strategy='steps'", "eval_steps > 0"]),
    ("logging_steps_zero", 1, dict(logging_steps=0), ["logging_steps=0", "must be > 0"]),
    ("save_steps_zero", 1, dict(save_steps=0), ["save_steps=0", "must be > 0"]),
    ("warmup_ratio_above_1", 1, dict(warmup_ratio=1.5), ["warmup_ratio=1.5", "[0, 1]"]),
    ("warmup_steps_negative", 1, dict(warmup_steps=-1), ["warmup_steps=-1", ">= 0"]),
    ("learning_rate_negative", 1, dict(learning_rate=-0.1), ["learning_rate=-0.1", ">= 0"]),
    # sizes
    ("train_batch_zero", 1, dict(per_device_train_batch_size=0), ["per_device_train_batch_size=0", "positive"]),
    ("eval_batch_zero", 1, dict(per_device_eval_batch_size=0), ["per_device_eval_batch_size=0", "positive"]),
    ("ga_zero", 1, dict(gradient_accumulation_steps=0), ["gradient_accumulation_steps=0", "positive"]),
    ("eval_accumulation_zero", 1, dict(eval_accumulation_steps=0), ["eval_accumulation_steps=0", "positive"]),
    ("collective_timeout_zero", 1, dict(collective_timeout_seconds=0), ["collective_timeout_seconds=0", "positive"]),
    ("peak_flops_negative", 1, dict(peak_flops_per_device=-1.0), ["peak_flops_per_device=-1.0", "positive"]),
    ("dataloader_workers_negative", 1, dict(dataloader_num_workers=-1), ["dataloader_num_workers=-1", ">= 0"]),
    ("dataloader_workers_above_bound", 1, dict(dataloader_num_workers=1000000),
     ["dataloader_num_workers=1000000", "<= 1024"]),
    ("train_batch_above_int32", 1, dict(per_device_train_batch_size=2**31), ["per_device_train_batch_size=2147483648",
                                                                            "<= 2147483647 (2**31 - 1)"]),
    ("samples_per_step_beyond_int32", 4, dict(per_device_train_batch_size=2**29, gradient_accumulation_steps=2),
     ["x 4 data rank(s) (dp x sharding)", "samples per optimizer step is invalid", "2**31 - 1"]),
    ("accumulation_of_1e11_steps", 1, dict(gradient_accumulation_steps=10**11),
     ["gradient_accumulation_steps=100000000000 x 1 data rank(s)", "<= 2147483647 (2**31 - 1"]),
    ("int_beyond_int64", 1, dict(max_steps=10**20), ["max_steps=100000000000000000000", "signed 64-bit"]),
    ("learning_rate_nan", 1, dict(learning_rate=float("nan")), ["learning_rate=nan", "finite"]),
    ("epochs_inf", 1, dict(num_train_epochs=float("inf")), ["num_train_epochs=inf", "finite"]),
    ("warmup_ratio_nan", 1, dict(warmup_ratio=float("nan")), ["warmup_ratio=nan", "finite"]),
    ("seed_negative", 1, dict(seed=-1), ["seed=-1", "[0, 4294967295]", "np.random.seed"]),
    ("adam_beta_1", 1, dict(adam_beta2=1.0), ["adam_beta2=1.0", "[0, 1)", "AdamW"]),
    ("adam_epsilon_negative", 1, dict(adam_epsilon=-1e-8), ["adam_epsilon=-1e-08", ">= 0"]),
    ("weight_decay_negative", 1, dict(weight_decay=-0.1), ["weight_decay=-0.1", ">= 0"]),
    ("scale_loss_zero", 1, dict(scale_loss=0.0), ["scale_loss=0.0", "> 0"]),
    ("eval_steps_negative", 1, dict(eval_steps=-5), ["eval_steps=-5", ">= 0"]),
    ("replica_check_steps_negative", 1, dict(replica_check_steps=-1), ["replica_check_steps=-1", ">= 0"]),
    # best model
    ("best_model_strategies_differ", 1, dict(load_best_model_at_end=True, evaluation_strategy="steps", eval_steps=2,
                                             save_strategy="epoch"),
     ["load_best_model_at_end", "save_strategy='epoch'", "evaluation_strategy='steps'"]),
    ("best_model_save_not_multiple", 1, dict(load_best_model_at_end=True, evaluation_strategy="steps", eval_steps=3,
                                             save_steps=4),
     ["save_steps=4", "eval_steps=3", "multiple"]),
    # precision and misc
    ("fp16_and_bf16", 1, dict(fp16=True, bf16=True), ["fp16=True and bf16=True", "choose one"]),
    ("fp16_and_bf16_full_eval", 1, dict(fp16_full_eval=True, bf16_full_eval=True), ["fp16_full_eval=True", "choose one"]),
    ("flatten_param_grads_on_cpu", 1, dict(flatten_param_grads=True), ["flatten_param_grads=True", "npu"]),
    ("unified_checkpoint_exclusive", 1, dict(unified_checkpoint=True,
                                             unified_checkpoint_config="skip_save_model_weight ignore_merge_optimizer"),
     ["skip_save_model_weight", "ignore_merge_optimizer", "exclusive"]),
    ("refined_recompute_syntax", 1, dict(refined_recompute="flash_attn"), ["refined_recompute", "op:count"]),
    ("refined_recompute_op", 1, dict(refined_recompute="mlp_magic:1"), ["refined_recompute", "mlp_magic", "valid:"]),
    # Hugging Face options (paddletrainer.config.hf_options)
    ("hf_use_ipex", 1, dict(use_ipex=True), ["use_ipex=True is not supported by paddletrainer", "Intel Extension"]),
    ("hf_per_gpu_batch", 1, dict(per_gpu_train_batch_size=8), ["per_gpu_train_batch_size=8", "per_device_train_batch_size"]),
    ("hf_save_safetensors_false", 1, dict(save_safetensors=False), ["save_safetensors=False", "never written"]),
    ("hf_bad_log_level", 1, dict(log_level="loud"), ["log_level='loud' is not valid", "passive"]),
    ("hf_use_cpu_vs_device", 1, dict(use_cpu=True, device="xpu"), ["use_cpu=True contradicts device='xpu'"]),
]


@pytest.mark.parametrize("world,options,expected", [c[1:] for c in ARGS_CASES], ids=[c[0] for c in ARGS_CASES])
def test_training_arguments_refuse_bad_options_with_one_line(monkeypatch, tmp_path, world, options, expected):
    monkeypatch.setenv("PADDLE_TRAINERS_NUM", str(world))
    with pytest.raises(ValueError) as info:
        TrainingArguments(output_dir=str(tmp_path), **options)
    text = one_line(info)
    for part in expected:
        assert part in text, f"{part!r} not in {text!r}"


@pytest.mark.parametrize("world,options", [c[1:3] for c in ARGS_CASES if "offload" in c[0]],
                         ids=[c[0] for c in ARGS_CASES if "offload" in c[0]])
def test_no_offload_error_suggests_the_refused_stage2_offload(monkeypatch, tmp_path, world, options):
    monkeypatch.setenv("PADDLE_TRAINERS_NUM", str(world))
    with pytest.raises(ValueError) as info:
        TrainingArguments(output_dir=str(tmp_path), **options)
    text = one_line(info)
    assert "stage2 offload" not in text.replace("sharding='stage2 offload' is not supported", ""), text


@pytest.mark.parametrize("raw,expected", [("four", "PADDLE_TRAINERS_NUM='four' is not an integer"),
                                          ("0", "PADDLE_TRAINERS_NUM=0 is invalid: must be >= 1")])
def test_a_broken_launch_environment_is_named(monkeypatch, tmp_path, raw, expected):
    monkeypatch.setenv("PADDLE_TRAINERS_NUM", raw)
    with pytest.raises(ValueError) as info:
        TrainingArguments(output_dir=str(tmp_path))
    assert expected in one_line(info)


def test_samples_per_step_count_the_data_ranks_only(monkeypatch, tmp_path):
    """Tensor-parallel ranks share their batch: 4 processes at tp 4 are one data rank, so the samples of a step
    stay within the bound where 4 data ranks would not (refused above, ``samples_per_step_beyond_int32``)."""
    monkeypatch.setenv("PADDLE_TRAINERS_NUM", "4")
    args = TrainingArguments(output_dir=str(tmp_path), tensor_parallel_degree=4, per_device_train_batch_size=2**29,
                             gradient_accumulation_steps=2)
    assert args.parallel_degrees.tp == 4 and args.parallel_degrees.dp == 1


def test_degrees_are_checked_without_creating_a_process_group(monkeypatch, tmp_path):
    import paddle.distributed as dist

    monkeypatch.setenv("PADDLE_TRAINERS_NUM", "8")
    args = TrainingArguments(output_dir=str(tmp_path), tensor_parallel_degree=2, pipeline_parallel_degree=2,
                             gradient_accumulation_steps=2)
    assert args.parallel_degrees == ParallelDegrees(world_size=8, dp=2, sharding=1, tp=2, pp=2)
    assert not dist.is_initialized()


# ========================================================================= models that cannot run the layout
class Plain(paddle.nn.Layer):
    def __init__(self):
        super().__init__()
        self.linear = paddle.nn.Linear(1, 1)

    def forward(self, x, labels=None):
        pred = self.linear(x).squeeze(-1)
        return paddle.nn.functional.mse_loss(pred, labels), pred


def data(n=16, extra=None):
    rng = np.random.RandomState(0)
    x = rng.uniform(-1, 1, size=(n, 1)).astype("float32")
    rows = [{"x": x[i], "labels": np.float32(2 * x[i, 0] - 1)} for i in range(n)]
    if extra:
        rows = [dict(r, **extra) for r in rows]
    return rows


def test_check_model_for_layout_refuses_a_plain_layer_for_pp_and_tp():
    with pytest.raises(ValueError) as info:
        check_model_for_layout(Plain(), ParallelDegrees(world_size=2, dp=1, sharding=1, tp=1, pp=2))
    text = one_line(info)
    assert "pipeline_parallel_degree=2 needs a PipelineLayer model" in text and "Plain" in text
    with pytest.raises(ValueError) as info:
        check_model_for_layout(Plain(), ParallelDegrees(world_size=2, dp=1, sharding=1, tp=2, pp=1))
    text = one_line(info)
    assert "tensor_parallel_degree=2: Plain has no tensor-parallel layers" in text and "ColumnParallelLinear" in text
    check_model_for_layout(Plain(), ParallelDegrees(world_size=2, dp=2, sharding=1, tp=1, pp=1))  # dp: any model


def fake_pipeline_layer(segment_parts, num_stages):
    """A PipelineLayer as built (its constructor needs a device and a topology we do not have here)."""
    from paddle.distributed.fleet.meta_parallel import PipelineLayer

    class FakePipe(PipelineLayer):
        def __init__(self):
            paddle.nn.Layer.__init__(self)
            self.segment_parts = segment_parts
            self._num_stages = num_stages

    return FakePipe()


def test_a_pipeline_whose_layers_do_not_split_over_the_stages_is_refused():
    pp2 = ParallelDegrees(world_size=2, dp=1, sharding=1, tp=1, pp=2)
    with pytest.raises(ValueError) as info:
        check_pipeline_split(1, 2)
    text = one_line(info)
    assert "num_hidden_layers=1 cannot be split over pipeline_parallel_degree=2" in text and "<= 1" in text
    check_pipeline_split(2, 2)
    with pytest.raises(ValueError) as info:
        check_model_for_layout(fake_pipeline_layer([0, 1, 1], 2), pp2)
    assert "leaves stage(s) [1] empty" in one_line(info)
    with pytest.raises(ValueError) as info:
        check_model_for_layout(fake_pipeline_layer([0, 1, 2, 3, 4], 4), pp2)
    assert "built for 4 stages" in one_line(info)
    check_model_for_layout(fake_pipeline_layer([0, 2, 4], 2), pp2)


@pytest.fixture
def no_process_group(monkeypatch):
    """Creating the topology fails the test (instead of waiting for ranks that were never launched)."""
    import paddletrainer.trainer as trainer_mod

    def tripwire(args):
        raise AssertionError("init_topology was called: the bad input was not refused before creating process groups")

    monkeypatch.setattr(trainer_mod, "init_topology", tripwire)


@pytest.mark.parametrize("degree,expected", [("pipeline_parallel_degree", "needs a PipelineLayer model"),
                                             ("tensor_parallel_degree", "Plain has no tensor-parallel layers")])
def test_trainer_refuses_a_plain_layer_for_tp_or_pp_before_creating_groups(monkeypatch, tmp_path, no_process_group,
                                                                          degree, expected):
    # NEEDS TRAINER CHANGE: Trainer.__init__ must call checks.check_model_for_layout before init_topology
    monkeypatch.setenv("PADDLE_TRAINERS_NUM", "2")
    args = TrainingArguments(output_dir=str(tmp_path), gradient_accumulation_steps=2, **{degree: 2})
    with pytest.raises(ValueError) as info:
        Trainer(model=Plain(), args=args, train_dataset=data())
    assert expected in one_line(info)


# ========================================================================= Trainer: device, data, options
def args_for(tmp_path, **kw):
    base = dict(output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, learning_rate=0.1, max_steps=2,
                logging_steps=1, save_strategy="no", disable_tqdm=True, report_to="none", seed=1)
    base.update(kw)
    return TrainingArguments(**base)


def test_fp16_on_a_device_without_fp16_kernels_is_refused(tmp_path):
    if paddle.is_compiled_with_cuda():
        pytest.skip("this Paddle build has fp16 kernels")
    with pytest.raises(ValueError) as info:
        Trainer(model=Plain(), args=args_for(tmp_path, fp16=True), train_dataset=data())
    text = one_line(info)
    assert "fp16=True needs a GPU/XPU" in text and "--amp_on_cpu fp32_dry_run" in text


def test_batch_keys_the_model_does_not_accept_are_named_with_the_forward_parameters(tmp_path):
    # NEEDS TRAINER CHANGE: with remove_unused_columns=False the model raises a raw TypeError today; the
    # Trainer's default RobustnessCallback (popped_keys=label_names when a criterion is given) checks the first batch.
    trainer = Trainer(model=Plain(), args=args_for(tmp_path, remove_unused_columns=False),
                      train_dataset=data(extra={"note": np.float32(0)}))
    with pytest.raises(ValueError) as info:
        trainer.train()
    text = one_line(info)
    assert "remove_unused_columns=False" in text and "Plain.forward(x, labels)" in text and "['note']" in text


def test_check_batch_keys_accepts_kwargs_models_and_popped_labels():
    class Kw(paddle.nn.Layer):
        def forward(self, x, **kwargs):
            return x

    class LogitsOnly(paddle.nn.Layer):
        def forward(self, x):
            return x

    check_batch_keys(Kw(), ["x", "anything"])
    check_batch_keys(LogitsOnly(), ["x", "labels"], popped=["labels"])  # a criterion takes the labels
    with pytest.raises(ValueError) as info:
        check_batch_keys(LogitsOnly(), ["x", "labels"])
    assert "LogitsOnly.forward(x) does not accept ['labels']" in one_line(info)


def test_an_empty_train_dataset_is_named(tmp_path):
    # today: "the dataset is empty: a sampler needs at least one sample" (ValueError, but not naming the option).
    # NEEDS TRAINER CHANGE: get_train_dataloader calls checks.check_dataset(self.train_dataset, "train_dataset").
    with pytest.raises(ValueError) as info:
        Trainer(model=Plain(), args=args_for(tmp_path), train_dataset=[]).train()
    assert "train_dataset is empty (0 samples)" in one_line(info)
    with pytest.raises(ValueError) as info:
        check_dataset([], "eval_dataset")
    assert "eval_dataset is empty (0 samples): there is nothing to evaluate" in one_line(info)
    check_dataset(iter([]), "train_dataset")  # no length: cannot be checked up front


def test_metric_for_best_model_that_evaluation_never_reports_is_named(tmp_path):
    args = args_for(tmp_path, evaluation_strategy="steps", eval_steps=1, save_strategy="steps", save_steps=1,
                    metric_for_best_model="accuracy")
    trainer = Trainer(model=Plain(), args=args, train_dataset=data(), eval_dataset=data(8))
    with pytest.raises(ValueError) as info:
        trainer.train()
    text = one_line(info)
    assert "metric_for_best_model='accuracy'" in text and "eval_loss" in text


# ========================================================================= resume and output_dir
def trained_run(tmp_path, **kw):
    """A finished run with checkpoint-2 in tmp_path/out."""
    trainer = Trainer(model=Plain(), args=args_for(tmp_path, save_strategy="steps", save_steps=2, **kw),
                      train_dataset=data())
    trainer.train()
    return tmp_path / "out" / "checkpoint-2"


def test_resume_from_a_missing_path_is_named(tmp_path):
    missing = tmp_path / "nowhere" / "checkpoint-7"
    with pytest.raises(ValueError) as info:
        Trainer(model=Plain(), args=args_for(tmp_path), train_dataset=data()).train(resume_from_checkpoint=str(missing))
    assert f"resume_from_checkpoint='{missing}' does not exist" in one_line(info)


def test_resume_true_without_any_checkpoint_is_named(tmp_path):
    with pytest.raises(ValueError) as info:
        Trainer(model=Plain(), args=args_for(tmp_path), train_dataset=data()).train(resume_from_checkpoint=True)
    assert "resume_from_checkpoint=True but" in one_line(info) and "holds no complete checkpoint" in str(info.value)


def test_resume_from_an_incomplete_checkpoint_is_refused_and_lists_the_complete_ones(tmp_path):
    good = trained_run(tmp_path)
    partial = good.parent / "checkpoint-4"
    partial.mkdir()
    (partial / "model_state.tp00_pp00.safetensors").write_bytes(b"half")
    with pytest.raises(ValueError) as info:
        Trainer(model=Plain(), args=args_for(tmp_path, overwrite_output_dir=True), train_dataset=data()).train(
            resume_from_checkpoint=str(partial))
    text = one_line(info)
    assert "is incomplete (no completion marker" in text and "['checkpoint-2']" in text


def test_output_dir_holding_a_previous_run_is_refused_without_overwrite_or_resume(tmp_path):
    # NEEDS TRAINER CHANGE: Trainer.train calls checks.check_output_dir(args, resume_from_checkpoint) first.
    trained_run(tmp_path)
    with pytest.raises(ValueError) as info:
        Trainer(model=Plain(), args=args_for(tmp_path, do_train=True), train_dataset=data()).train()
    text = one_line(info)
    assert f"output_dir='{tmp_path / 'out'}' already holds checkpoints" in text and "checkpoint-2" in text
    assert "--overwrite_output_dir" in text and "--resume_from_checkpoint" in text


def test_check_output_dir_allows_overwrite_resume_and_fresh_dirs(tmp_path):
    trained_run(tmp_path)
    out = str(tmp_path / "out")
    check_output_dir(TrainingArguments(output_dir=out, do_train=True, overwrite_output_dir=True))
    check_output_dir(TrainingArguments(output_dir=out, do_train=True), resume_from_checkpoint=True)
    check_output_dir(TrainingArguments(output_dir=out, do_train=True, resume_from_checkpoint=out + "/checkpoint-2"))
    check_output_dir(TrainingArguments(output_dir=out, do_train=False))  # evaluation only
    check_output_dir(TrainingArguments(output_dir=str(tmp_path / "fresh"), do_train=True))
    with pytest.raises(ValueError):
        check_output_dir(TrainingArguments(output_dir=out, do_train=True))


def test_a_checkpoint_of_another_model_is_refused_with_the_list_of_mismatches(tmp_path):
    class Other(paddle.nn.Layer):
        def __init__(self):
            super().__init__()
            self.linear = paddle.nn.Linear(1, 3)
            self.head = paddle.nn.Linear(3, 1)

        def forward(self, x, labels=None):
            pred = self.head(self.linear(x)).squeeze(-1)
            return paddle.nn.functional.mse_loss(pred, labels), pred

    ckpt = trained_run(tmp_path)
    with pytest.raises(CheckpointMismatchError) as info:
        Trainer(model=Other(), args=args_for(tmp_path, overwrite_output_dir=True), train_dataset=data()).train(
            resume_from_checkpoint=str(ckpt))
    text = str(info.value)
    assert text.startswith("checkpoint does not match the model")
    assert "shape mismatch: model/linear.weight checkpoint [1, 1] vs model [1, 3]" in text
    assert "missing in checkpoint: model/head.weight [3, 1]" in text


def test_a_corrupted_checkpoint_file_is_named(tmp_path):
    ckpt = trained_run(tmp_path)
    victim = sorted(p for p in os.listdir(ckpt) if p.startswith("model_state"))[0]
    path = ckpt / victim
    raw = bytearray(path.read_bytes())
    raw[-1] ^= 0xFF  # same size, different content: only the crc32 can tell
    path.write_bytes(bytes(raw))
    with pytest.raises(CheckpointCorruptError) as info:
        Trainer(model=Plain(), args=args_for(tmp_path, overwrite_output_dir=True), train_dataset=data()).train(
            resume_from_checkpoint=str(ckpt))
    text = one_line(info)
    assert f"corrupt checkpoint {ckpt}" in text and f"{victim}: crc32" in text and info.value.files == [victim]


# ========================================================================= the same rows from a plain user script
# Every option row of docs/errors.md (table 1, the resume rows of table 2) and common slips (--sharding stage4,
# --warmup_ratio 2, --fp16 with --bf16), given to a script that only calls PdArgumentParser(...).parse_*: argparse's
# error path — a usage line, then "error: argument --<option>: <what is wrong and what is valid>", exit status 2, no
# traceback. One interpreter imports paddletrainer once and forks a child per case (fixtures/user_train_script.py).
USER_SCRIPT = os.path.join(os.path.dirname(__file__), "fixtures", "user_train_script.py")


def _cli(options):
    argv = []
    for key, value in options.items():
        if value is None:
            continue  # the default already
        if isinstance(value, bool):
            argv += [f"--{key}", str(value).lower()]
        elif isinstance(value, list):  # list-of-lists options repeat the flag once per row
            for row in value:
                argv += [f"--{key}", *map(str, row)]
        else:
            argv += [f"--{key}", str(value)]
    return argv


def _user_cases(root):
    """(id, env, argv, options the error may name, substrings of the message)."""
    # (the wording of a row's message is checked by the test above; argparse words choice errors its own way)
    cases = [(f"row_{cid}", {"PADDLE_TRAINERS_NUM": str(world)}, _cli(options), list(options), [])
             for cid, world, options, _ in ARGS_CASES]
    ckpts = os.path.join(root, "ckpts")
    os.makedirs(os.path.join(ckpts, "checkpoint-2"))
    open(os.path.join(ckpts, "checkpoint-2", ".checkpoint_complete"), "w").close()
    os.makedirs(os.path.join(ckpts, "checkpoint-4"))  # a save that never finished
    json_cfg, yaml_cfg = os.path.join(root, "cfg.json"), os.path.join(root, "cfg.yaml")
    with open(json_cfg, "w") as f:
        json.dump({"output_dir": root, "tensor_parallel_degree": 3}, f)
    with open(yaml_cfg, "w") as f:
        f.write(f"output_dir: {root}\nsharding: stage4\n")
    w1, w2 = {"PADDLE_TRAINERS_NUM": "1"}, {"PADDLE_TRAINERS_NUM": "2"}
    cases += [
        ("issue_sharding_stage4", w2, ["--sharding", "stage4"], ["sharding"], ["stage4", "stage1, stage2, stage3"]),
        ("issue_warmup_ratio_2", w1, ["--warmup_ratio", "2"], ["warmup_ratio"], ["warmup_ratio=2.0", "[0, 1]"]),
        ("issue_tp3_on_2", w2, ["--tensor_parallel_degree", "3"], ["tensor_parallel_degree"], ["world size 2"]),
        ("issue_pp4_on_2", w2, ["--pipeline_parallel_degree", "4", "--gradient_accumulation_steps", "4"],
         ["pipeline_parallel_degree"], ["pipeline_parallel_degree=4", "world size 2"]),
        ("issue_fp16_and_bf16", w1, ["--fp16", "true", "--bf16", "true"], ["fp16", "bf16"], ["exclusive"]),
        ("issue_resume_missing", w1, ["--resume_from_checkpoint", "/nonexistent/checkpoint-7"],
         ["resume_from_checkpoint"], ["/nonexistent/checkpoint-7", "does not exist"]),
        ("resume_true_without_checkpoint", w1, ["--resume_from_checkpoint", "true"], ["resume_from_checkpoint"],
         ["holds no complete checkpoint"]),
        ("resume_incomplete", w1, ["--resume_from_checkpoint", os.path.join(ckpts, "checkpoint-4")],
         ["resume_from_checkpoint"], ["is incomplete", "checkpoint-2"]),
        ("type_error", w1, ["--seed", "abc"], ["seed"], ["invalid int value"]),
        ("json_first_arg", w2, [json_cfg, "--warmup_steps", "1"], ["tensor_parallel_degree"], ["cfg.json"]),
        ("json_file", w2, ["--via", "json_file", json_cfg], ["tensor_parallel_degree"], ["world size 2", "cfg.json"]),
        ("yaml_file", w2, ["--via", "yaml_file", yaml_cfg], ["sharding"], ["stage4", "cfg.yaml"]),
        ("yaml_first_arg_override", w1, [yaml_cfg, "--sharding", "stage5"], ["sharding"], ["stage5"]),
        ("launch_env_broken", {"PADDLE_TRAINERS_NUM": "four"}, [], [], ["PADDLE_TRAINERS_NUM='four'"]),
    ]
    for cid, env, argv, options, expected in cases:
        if not any(a.startswith("--output_dir") for a in argv) and not argv[:1] == ["--via"] \
                and not (argv and argv[0].endswith((".json", ".yaml"))):
            argv = ["--output_dir", os.path.join(root, "out"), *argv]
        yield cid, env, argv, options, expected


@pytest.fixture(scope="module")
def user_script_runs(tmp_path_factory):
    """Run every case once; ``{id: (exit code, log text, options, expected)}``."""
    import subprocess
    import sys

    root = str(tmp_path_factory.mktemp("user_script"))
    cases = list(_user_cases(root))
    with open(os.path.join(root, "cases.json"), "w") as f:
        json.dump([{"id": c[0], "env": c[1], "argv": c[2]} for c in cases], f)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PADDLE_")}
    env["PYTHONPATH"] = os.pathsep.join([os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                                         env.get("PYTHONPATH", "")])
    subprocess.run([sys.executable, USER_SCRIPT, "--run-cases", os.path.join(root, "cases.json"), root], env=env,
                   check=True, timeout=600, cwd=root)
    codes = json.load(open(os.path.join(root, "codes.json")))
    return {cid: (codes[cid], open(os.path.join(root, f"{cid}.log")).read(), options, expected)
            for cid, _, _, options, expected in cases}


USER_CASE_IDS = [f"row_{c[0]}" for c in ARGS_CASES] + [
    "issue_sharding_stage4", "issue_warmup_ratio_2", "issue_tp3_on_2", "issue_pp4_on_2", "issue_fp16_and_bf16",
    "issue_resume_missing", "resume_true_without_checkpoint", "resume_incomplete", "type_error", "json_first_arg",
    "json_file", "yaml_file", "yaml_first_arg_override", "launch_env_broken"]


@pytest.mark.parametrize("case", USER_CASE_IDS)
def test_a_bad_option_in_a_plain_user_script_is_a_usage_error_with_exit_2_and_no_traceback(user_script_runs, case):
    code, log, options, expected = user_script_runs[case]
    assert "Traceback" not in log, log
    assert code == 2, log
    lines = [line for line in log.splitlines() if "Warning" not in line and "warnings.warn" not in line]
    assert lines[0].startswith("usage: user_train_script.py"), log
    error = next(line for line in lines if "error: " in line)
    assert error.startswith("user_train_script.py: error: "), log
    if options:
        assert any(f"error: argument --{o}: " in error for o in options), error
    for part in expected:
        assert part in error, f"{part!r} not in {error!r}"


def test_a_good_command_line_still_parses_in_the_user_script(tmp_path):
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("PADDLE_")}
    env["PYTHONPATH"] = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    proc = subprocess.run([sys.executable, USER_SCRIPT, "--output_dir", str(tmp_path), "--warmup_ratio", "0.5",
                           "--resume_from_checkpoint", "auto"], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "parsed" in proc.stdout, proc.stderr
