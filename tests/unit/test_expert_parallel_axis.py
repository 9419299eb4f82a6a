"""Expert parallel as a degree of the layout (``Layout.ep``): carved from the data ranks, read from PaddleNLP's two
names, checked before any process group, its groups' ranks, the model check at wrap time and the checkpoint's
acceptance of the other ranks' experts."""
import types

import paddle
import pytest

from paddletrainer.checkpoint import placement as L
from paddletrainer.checkpoint.load import other_ranks_expert
from paddletrainer.parallel.expert import check_expert_model
from paddletrainer.parallel.layout import Layout
from paddletrainer.parallel.topology import expert_group_ranks
from paddletrainer.training_args import TrainingArguments


def make(tmp_path, **kwargs):
    return TrainingArguments(output_dir=str(tmp_path), **kwargs)


def test_expert_parallel_degree_is_carved_from_the_data_ranks(tmp_path, world):
    world(4)
    layout = make(tmp_path, expert_parallel_degree=2).parallel_config.layout
    assert (layout.dp, layout.ep, layout.world_size, layout.data_world_size) == (4, 2, 4, 4)
    assert layout.describe().endswith("·ep2") and layout.as_dict()["ep_degree"] == 2
    # data ranks 0..3: ep rank = data rank % 2, replica = data rank // 2
    assert [layout.ep_coordinates(layout.coordinates(r)) for r in range(4)] == [(0, 0), (1, 0), (0, 1), (1, 1)]
    # PaddleNLP's use_expert_parallel: experts over the data-parallel group; PaddleFormers' name is an alias
    assert make(tmp_path, use_expert_parallel=True).parallel_config.layout.ep == 4
    assert make(tmp_path, expert_model_parallel_size=2).parallel_config.layout.ep == 2
    plain = make(tmp_path).parallel_config.layout
    assert plain.ep == 1 and "ep_degree" not in plain.as_dict() and "ep" not in plain.describe()


def test_a_script_changing_the_degree_after_parsing_rebuilds_and_rechecks(tmp_path, world):
    world(4)
    args = make(tmp_path)
    args.expert_parallel_degree = 4
    assert args.parallel_config.layout.ep == 4
    args.expert_parallel_degree = 3
    with pytest.raises(ValueError, match=r"^expert_parallel_degree=3 does not divide the data ranks"):
        args.parallel_config


@pytest.mark.parametrize("world_size, kwargs, message", [
    (1, dict(expert_parallel_degree=2), r"^expert_parallel_degree=2 does not divide the data ranks .* = 1 "),
    (8, dict(expert_parallel_degree=2, pipeline_parallel_degree=2, gradient_accumulation_steps=2, sharding="stage1",
             sharding_parallel_degree=2), r"^expert_parallel_degree=2 with sharding_parallel_degree=2 is not supported"),
    (4, dict(expert_parallel_degree=2, sharding="stage2", sharding_parallel_degree=2),
     r"^expert_parallel_degree=2 with sharding='stage2' is not supported yet: use sharding='stage1'"),
    (4, dict(expert_parallel_degree=2, sharding="stage3", sharding_parallel_degree=2),
     r"^expert_parallel_degree=2 with sharding='stage3' is not supported yet"),
    (4, dict(expert_parallel_degree=2, sharding="stage1", sharding_parallel_degree=2,
             sharding_parallel_config="split_param"),
     r"^expert_parallel_degree=2 with split_param is not supported yet: use sharding='stage1' without split_param"),
    (4, dict(expert_parallel_degree=2, sep_parallel_degree=2), r"^expert_parallel_degree=2 with sep_parallel_degree"),
    (4, dict(expert_parallel_degree=2, use_expert_parallel=True), r"^use_expert_parallel=True splits the experts "
                                                                  r"over the data-parallel group \(dp=4\)"),
    (4, dict(expert_parallel_degree=0), r"^expert_parallel_degree=0 is invalid"),
])
def test_bad_expert_parallel_options_are_one_line_errors_before_any_group(tmp_path, world, world_size, kwargs,
                                                                            message):
    world(world_size)
    with pytest.raises(ValueError, match=message) as err:
        make(tmp_path, **kwargs)
    assert "\n" not in str(err.value)


def test_expert_groups_are_consecutive_data_ranks_and_the_replicas_holding_the_same_experts():
    groups = expert_group_ranks(Layout(world_size=8, dp=8, ep=4))
    assert groups == {"ep": [[0, 1, 2, 3], [4, 5, 6, 7]], "edp": [[0, 4], [1, 5], [2, 6], [3, 7]]}
    # data rank = dp rank · sharding + sharding rank, within each cell of the other axes (here tp: rank % 2)
    groups = expert_group_ranks(Layout(world_size=8, dp=2, sharding=2, tp=2, ep=2))
    assert groups["ep"] == [[0, 2], [4, 6], [1, 3], [5, 7]] and groups["edp"] == [[0, 4], [2, 6], [1, 5], [3, 7]]


class _Experts(paddle.nn.Layer):
    def __init__(self, num_experts, marked=True, held=1):
        super().__init__()
        self.config = types.SimpleNamespace(num_experts=num_experts)
        self.experts = paddle.nn.LayerDict({str(g): paddle.nn.Linear(2, 2) for g in range(held)})
        for p in self.experts.parameters():
            p.is_expert = marked


def test_the_model_is_checked_against_the_degree_at_wrap_time():
    check_expert_model(_Experts(6, marked=False), 1)  # nothing to check without expert parallel
    check_expert_model(_Experts(4), 2)
    with pytest.raises(ValueError, match=r"^expert_parallel_degree=4 does not divide the model's num_experts=6"):
        check_expert_model(_Experts(6), 4)
    with pytest.raises(ValueError, match=r"^expert_parallel_degree=2 but _Experts has no expert parameter"):
        check_expert_model(_Experts(4, marked=False), 2)
    # built without the expert group: every expert on every rank
    with pytest.raises(ValueError, match=r"^expert_parallel_degree=2 but experts holds 4 of the 4 experts on this "
                                         r"rank \(expected 2\): build the model with expert_parallel_group\(\)"):
        check_expert_model(_Experts(4, held=4), 2)


def test_the_group_lookups_refuse_a_multi_process_launch_before_the_topology_exists(world):
    from paddletrainer.parallel import expert, reset_for_tests
    reset_for_tests()
    world(1)
    assert expert.expert_parallel_group() is None and expert.token_group() is None
    world(2)
    with pytest.raises(RuntimeError, match="call paddletrainer.parallel.init_topology"):
        expert.expert_parallel_group()


def test_a_checkpoint_holding_other_ranks_experts_loads_but_a_foreign_tensor_or_a_larger_moe_is_unexpected():
    model = _Experts(4)
    weight = model.experts["0"].weight
    local = {"model/mlp.experts.0.weight": types.SimpleNamespace(tensor=weight)}  # ep4: one expert per rank
    keys = ("model/mlp.experts.0.weight", "model/mlp.experts.3.weight", "model/mlp.experts.4.weight",
            "model/other.weight")
    index = {"tensors": {k: {"shape": [2, 2]} for k in keys}}
    expected = {"model/mlp.experts.0.weight": ((2, 2), "float32")}
    problems = L.compare_to_index(index, expected, complete_model=True, elsewhere=other_ranks_expert(local, 4))
    # expert 3 is another ep rank's; expert 4 belongs to a model with more experts than this one's 4
    assert sorted(problems) == ["unexpected in checkpoint: model/mlp.experts.4.weight [2, 2]",
                                "unexpected in checkpoint: model/other.weight [2, 2]"]
    assert other_ranks_expert(local, 1) is None  # without expert parallel every key the model lacks is unexpected
    weight.is_expert = False  # likewise without expert parameters
    assert other_ranks_expert(local, 4) is None


def test_the_trainer_refuses_a_model_the_expert_layout_cannot_run_before_any_process_group(tmp_path, world, monkeypatch):
    import paddletrainer.trainer as trainer_module

    def no_groups(*_):
        raise AssertionError("init_topology was reached")

    monkeypatch.setattr(trainer_module, "init_topology", no_groups)
    world(2)
    with pytest.raises(ValueError, match="expert_parallel_degree=2 but Linear has no expert parameter"):
        trainer_module.Trainer(model=paddle.nn.Linear(2, 2), args=make(tmp_path, expert_parallel_degree=2))
    # tp's sequence parallel: the MoE input would be a slice of the sequence (the Trainer passes the flag when tp > 1)
    with pytest.raises(ValueError, match=r"sequence_parallel=True with a mixture-of-experts model \(_Experts"):
        check_expert_model(_Experts(4), 1, sequence_parallel=True)
    check_expert_model(paddle.nn.Linear(2, 2), 1, sequence_parallel=True)  # a dense model: nothing to refuse
