"""Adding a parallel axis is its ``AXES`` entry and ``Layout`` field (parallel/layout.py), its checks
(parallel/config.py) and its wrap function: nothing in the arguments layer (training_args, configs, compat)
names the axes. Shown with the context-parallel axis (``context_parallel_degree``), added that way after the
sep axis; an option without an entry (expert tensor parallel) is still refused. (Expert parallel is carved from the
data ranks rather than a grid axis: ``Layout.ep``, see test_expert_parallel_axis.py.)"""

import pytest

from paddletrainer.training_args import TrainingArguments


def make(tmp_path, **kwargs):
    return TrainingArguments(output_dir=str(tmp_path), **kwargs)


def test_an_option_without_an_axes_entry_is_refused(tmp_path, world):
    world(8)
    with pytest.raises(ValueError, match="^expert_tensor_parallel_degree=2 is not supported by paddletrainer: use -1 "
                                         "or 1$"):
        make(tmp_path, expert_tensor_parallel_degree=2)


def test_with_its_axes_entry_the_degree_option_is_read_into_the_layout_and_config(tmp_path, world):
    world(8)
    args = make(tmp_path, context_parallel_degree=2, tensor_parallel_degree=2)
    layout = args.parallel_degrees
    assert layout.degrees == {"dp": 2, "sharding": 1, "tp": 2, "pp": 1, "sep": 1, "cp": 2}
    assert args.parallel_config.layout is layout and layout.use_hybrid
    # PaddleNLP runs cp on fleet's sep groups: the shared fleet entry carries the cp degree
    assert layout.fleet_degrees()["sep_degree"] == 2 and "cp_degree" not in layout.fleet_degrees()
    # cp ranks read the same samples (splits_data=False): two data streams, one per dp rank
    assert layout.data_world_size == 2 and args.dataset_world_size == 2
    # the other refusals stay
    with pytest.raises(ValueError, match="^expert_tensor_parallel_degree=2 is not supported by paddletrainer"):
        make(tmp_path, expert_tensor_parallel_degree=2)


def test_the_new_degree_is_validated_against_the_world_size(tmp_path, world):
    world(8)
    with pytest.raises(ValueError, match=r"^tensor_parallel_degree=2 x pipeline_parallel_degree=1 x "
                                         r"context_parallel_degree=3 = 6 does not divide the world size 8 "):
        make(tmp_path, context_parallel_degree=3, tensor_parallel_degree=2)
    with pytest.raises(ValueError, match=r"^context_parallel_degree=0 is invalid: use -1 \(unset\)"):
        make(tmp_path, context_parallel_degree=0)
    with pytest.raises(ValueError, match=r"\(tp 1 × pp 1 × sharding 1 × cp 4\) leave data parallel 2$"):
        make(tmp_path, context_parallel_degree=4, data_parallel_size=4)
    # the axis's own checks (parallel/config.py): sharding's unset degree would take what tp x cp leave, but cp
    # with sharding is not proven equal to one process yet
    with pytest.raises(ValueError, match=r"^sharding='stage1' with context_parallel_degree=2 is not supported yet"):
        make(tmp_path, context_parallel_degree=2, sharding="stage1")


def test_a_script_changing_the_new_degree_after_parsing_rebuilds_and_rechecks_the_layout(tmp_path, world):
    world(8)
    args = make(tmp_path)
    assert args.parallel_config.layout.degree("cp") == 1
    args.context_parallel_degree = 4
    assert args.parallel_config.layout.degrees == {"dp": 2, "sharding": 1, "tp": 1, "pp": 1, "sep": 1, "cp": 4}
    args.context_parallel_degree = 3
    with pytest.raises(ValueError, match="context_parallel_degree=3 = 3 does not divide the world size 8"):
        args.parallel_config


def test_the_new_axis_has_coordinates_and_appears_in_checkpoint_names_only_when_active(tmp_path, world):
    world(8)
    layout = make(tmp_path, context_parallel_degree=2, tensor_parallel_degree=2).parallel_degrees
    # fleet's pp_first grid (dp, pp, sharding, sep, cp, mp), row-major: strides mp 1, cp 2, dp 4
    assert layout.coordinates(3) == {"dp": 0, "sharding": 0, "tp": 1, "pp": 0, "sep": 0, "cp": 1}
    assert layout.coordinates(6) == {"dp": 1, "sharding": 0, "tp": 0, "pp": 0, "sep": 0, "cp": 1}
    coords = layout.coordinates(7)
    assert layout.data_rank(coords) == 1
    assert layout.cell_name(coords) == "dp01_shard00_tp01_pp00_cp01"
    assert layout.as_dict() == {"world_size": 8, "dp_degree": 2, "sharding_degree": 1, "tp_degree": 2,
                                "pp_degree": 1, "cp_degree": 2}
    # at degree 1 the names are the ones checkpoints written before the axis existed carry
    plain = make(tmp_path, tensor_parallel_degree=2).parallel_degrees
    assert plain.cell_name(plain.coordinates(1)) == "dp00_shard00_tp01_pp00"
    assert "cp_degree" not in plain.as_dict()
