"""Every *_parallel_config option paddletrainer accepts changes Paddle's strategy (built as on GPU); every other
one is refused by name, with its reason, while its axis is active — nothing is accepted and ignored silently: the
names PaddleNLP accepts only in its static-graph auto-parallel mode are accepted with a warning naming each as
without effect, and any other name is an error listing the valid ones."""
import logging

import pytest

from paddletrainer import AutoTrainingArguments, PdArgumentParser, TrainingArguments
from paddletrainer.parallel.config import ParallelConfig
from paddletrainer.parallel.layout import Layout
from paddletrainer.parallel.topology import build_strategy
from paddletrainer.config.paddlenlp_options import (INERT_PARALLEL_OPTIONS, PIPELINE_PARALLEL_OPTIONS,
                                                    REFUSED_PARALLEL_OPTIONS, SHARDING_PARALLEL_OPTIONS,
                                                    TENSOR_PARALLEL_OPTIONS)

CONFIGS = {  # config → (its option list, the attribute build_strategy reads, the degrees that activate it)
    "pipeline_parallel_config": (PIPELINE_PARALLEL_OPTIONS, "pipeline_options", dict(pp=2)),
    "sharding_parallel_config": (SHARDING_PARALLEL_OPTIONS, "sharding_options", dict(sharding=2)),
    "tensor_parallel_config": (TENSOR_PARALLEL_OPTIONS, "tensor_options", dict(tp=2)),
}
ACCEPTED = [(c, o) for c, (names, _, _) in CONFIGS.items() for o in sorted(names - REFUSED_PARALLEL_OPTIONS[c].keys())]
REFUSED = [(c, o) for c in CONFIGS for o in sorted(REFUSED_PARALLEL_OPTIONS[c])]
INERT = [(c, o) for c in sorted(INERT_PARALLEL_OPTIONS) for o in sorted(INERT_PARALLEL_OPTIONS[c])]
ACTIVE_AXIS = {"pipeline_parallel_config": dict(pipeline_parallel_degree=2, gradient_accumulation_steps=2),
               "sharding_parallel_config": dict(sharding="stage1", sharding_parallel_degree=2),
               "tensor_parallel_config": dict(tensor_parallel_degree=2)}


def strategy_args(degrees, **options):
    d = dict(world_size=2, dp=1, sharding=1, tp=1, pp=1)
    d.update(degrees)
    return ParallelConfig(layout=Layout(**d), sharding_stage=1 if d["sharding"] > 1 else 0, accumulate_steps=2,
                          micro_batch_size=2, seed=7, **options)


def strategy_text(args):
    strategy = build_strategy(args, on_cpu=False)
    return str(strategy.hybrid_configs) + str(strategy.pipeline_configs) + str(strategy.sync_param_name)


def test_every_option_name_is_either_accepted_or_refused_and_the_refusal_table_has_no_stale_names():
    for config, (names, _, _) in CONFIGS.items():
        assert set(REFUSED_PARALLEL_OPTIONS[config]) <= names, config
    assert ACCEPTED and REFUSED


@pytest.mark.parametrize("config, option", ACCEPTED, ids=[f"{c.split('_')[0]}:{o}" for c, o in ACCEPTED])
def test_an_accepted_option_reaches_the_gpu_strategy(config, option):
    _, attribute, degrees = CONFIGS[config]
    without = strategy_text(strategy_args(degrees))
    with_option = strategy_text(strategy_args(degrees, **{attribute: frozenset({option})}))
    assert with_option != without, f"{config}={option} is accepted but changes nothing in the strategy"


def test_tp_sync_options_only_switch_syncs_on_and_keep_paddles_defaults_when_none_is_given():
    from paddle.distributed import fleet

    paddle_default = fleet.DistributedStrategy()
    default_mp = paddle_default.hybrid_configs["mp_configs"]
    # Paddle broadcasts the replicated embedding / layer_norm / bias params across tp ranks by default.
    assert default_mp.sync_param and paddle_default.sync_param_name == ["embedding", "layer_norm", ".b_"]
    plain = build_strategy(strategy_args(dict(tp=2)), on_cpu=False)
    mp = plain.hybrid_configs["mp_configs"]
    assert (mp.sync_param, mp.sync_grad, mp.sync_moment) == (True, default_mp.sync_grad, default_mp.sync_moment)
    assert plain.sync_param_name == paddle_default.sync_param_name
    for option in ("sync_param", "sync_grad", "sync_moment"):
        given = build_strategy(strategy_args(dict(tp=2), tensor_options=frozenset({option})), on_cpu=False)
        mp = given.hybrid_configs["mp_configs"]
        assert getattr(mp, option) is True and mp.sync_param is True, option  # sync_grad alone keeps sync_param on
        assert given.sync_param_name == [""], option  # as PaddleNLP: every replicated parameter is synced


@pytest.mark.parametrize("config, option", REFUSED, ids=[f"{c.split('_')[0]}:{o}" for c, o in REFUSED])
def test_a_refused_option_is_an_error_naming_it_while_its_axis_is_active(tmp_path, monkeypatch, config, option):
    monkeypatch.setenv("PADDLE_TRAINERS_NUM", "2")
    _, _, degrees = CONFIGS[config]
    kwargs = {"pipeline_parallel_config": dict(pipeline_parallel_degree=2, gradient_accumulation_steps=2),
              "sharding_parallel_config": dict(sharding="stage1", sharding_parallel_degree=2),
              "tensor_parallel_config": dict(tensor_parallel_degree=2)}[config]
    with pytest.raises(ValueError, match=rf"^{config}={option} is not supported by paddletrainer: \S"):
        TrainingArguments(output_dir=str(tmp_path), **kwargs, **{config: option})
    monkeypatch.setenv("PADDLE_TRAINERS_NUM", "1")  # an inactive axis: ignored, as in PaddleNLP
    TrainingArguments(output_dir=str(tmp_path), **{config: option})


def test_amp_master_grad_is_refused_in_a_multi_process_run(tmp_path, monkeypatch):
    monkeypatch.setenv("PADDLE_TRAINERS_NUM", "2")
    with pytest.raises(ValueError, match="amp_master_grad=True is supported in one process only"):
        TrainingArguments(output_dir=str(tmp_path), fp16=True, amp_master_grad=True)
    monkeypatch.setenv("PADDLE_TRAINERS_NUM", "1")
    assert TrainingArguments(output_dir=str(tmp_path), bf16=True, amp_master_grad=True).amp_master_grad


def test_paddlenlp_auto_parallel_names_are_listed_as_inert_and_no_name_is_both_acting_and_inert():
    # PaddleNLP 3.0.0b4's auto-parallel branch of TrainingArguments.__post_init__ accepts exactly these
    assert {c: set(o) for c, o in INERT_PARALLEL_OPTIONS.items()} == {
        "tensor_parallel_config": {"replace_with_c_embedding", "replace_with_parallel_cross_entropy"},
        "pipeline_parallel_config": {"enable_send_recv_overlap", "enable_split_backward"},
        "sharding_parallel_config": {"enable_tensor_fusion", "enable_overlap"},
        "data_parallel_config": {"enable_allreduce_avg_in_gradinent_scale", "gradient_sync_after_accumulate"},
        "sequence_parallel_config": {"enable_allreduce_avg_in_gradinent_scale"},
    }
    for config, (names, _, _) in CONFIGS.items():
        assert not names & set(INERT_PARALLEL_OPTIONS[config]), config


@pytest.mark.parametrize("config, option", INERT, ids=[f"{c.split('_')[0]}:{o}" for c, o in INERT])
def test_an_auto_parallel_name_is_accepted_with_a_warning_and_changes_no_strategy(tmp_path, monkeypatch, caplog,
                                                                                   config, option):
    monkeypatch.setenv("PADDLE_TRAINERS_NUM", "2")
    axis = ACTIVE_AXIS.get(config, {})
    with caplog.at_level(logging.WARNING):
        args = TrainingArguments(output_dir=str(tmp_path), **axis, **{config: f"{option}"})
    warned = [r.getMessage() for r in caplog.records if r.getMessage().startswith(f"{config}={option} has no effect")]
    assert len(warned) == 1, caplog.text
    plain = TrainingArguments(output_dir=str(tmp_path), **axis)
    assert args.parallel_config == plain.parallel_config
    assert strategy_text(args.parallel_config) == strategy_text(plain.parallel_config)


@pytest.mark.parametrize("config", sorted(INERT_PARALLEL_OPTIONS))
def test_a_name_paddlenlp_does_not_know_is_an_error_listing_the_valid_ones(tmp_path, config):
    with pytest.raises(ValueError, match=rf"^{config}: unknown option\(s\) enable_typo; valid: .*"
                                         rf"{sorted(INERT_PARALLEL_OPTIONS[config])[0]}"):
        TrainingArguments(output_dir=str(tmp_path), **{config: "enable_typo"})


def test_paddlenlp_auto_parallel_config_from_the_command_line_parses(tmp_path):
    argv = ["--output_dir", str(tmp_path), "--enable_auto_parallel", "true",
            "--tensor_parallel_config", "replace_with_parallel_cross_entropy",
            "--data_parallel_config", "enable_allreduce_avg_in_gradinent_scale gradient_sync_after_accumulate"]
    (args,) = PdArgumentParser(AutoTrainingArguments).parse_args_into_dataclasses(argv)
    assert args.tensor_parallel_config == "replace_with_parallel_cross_entropy"
    assert args.parallel_config.tensor_options == frozenset()
