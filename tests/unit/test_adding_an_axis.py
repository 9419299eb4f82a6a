"""Adding a parallel axis is its ``AXES`` entry and ``Layout`` field (parallel/layout.py), its checks
(parallel/config.py) and its wrap function: nothing in the arguments layer (training_args, configs, compat)
names the axes. Shown in-process with a hypothetical context-parallel axis read from PaddleNLP's
``context_parallel_degree``, which is refused today."""
import dataclasses

import pytest

from paddletrainer.parallel import config as parallel_config
from paddletrainer.parallel import layout as parallel_layout
from paddletrainer.parallel.layout import AXES, Axis, Layout
from paddletrainer.training_args import TrainingArguments

LAUNCH_VARS = ("PADDLE_TRAINERS_NUM", "PADDLE_TRAINER_ID", "PADDLE_RANK_IN_NODE", "PADDLE_LOCAL_RANK")

# What layout.py would gain: the entry ...
CP = Axis("cp", "context_parallel_degree", "cp", "cp", False, "get_context_parallel_group",
          "get_context_parallel_rank", named_at_degree_1=False)


# ... and the degree field.
@dataclasses.dataclass(frozen=True)
class LayoutWithCp(Layout):
    cp: int = 1


@pytest.fixture
def world(monkeypatch):
    for name in LAUNCH_VARS:
        monkeypatch.delenv(name, raising=False)
    return lambda size: monkeypatch.setenv("PADDLE_TRAINERS_NUM", str(size))


@pytest.fixture
def with_cp(monkeypatch):
    """The two edits to parallel/layout.py, made in-process (Layout is built by parallel.config)."""
    monkeypatch.setattr(parallel_layout, "AXES", AXES + (CP,))
    monkeypatch.setattr(parallel_config, "Layout", LayoutWithCp)


def make(tmp_path, **kwargs):
    return TrainingArguments(output_dir=str(tmp_path), **kwargs)


def test_without_its_axes_entry_the_context_parallel_degree_is_refused(tmp_path, world):
    world(8)
    with pytest.raises(ValueError, match="^context_parallel_degree=2 is not supported by paddletrainer: use -1 or 1$"):
        make(tmp_path, context_parallel_degree=2)


def test_with_its_axes_entry_the_degree_option_is_read_into_the_layout_and_config(tmp_path, world, with_cp):
    world(8)
    args = make(tmp_path, context_parallel_degree=2, tensor_parallel_degree=2)
    layout = args.parallel_degrees
    assert layout.degrees == {"dp": 2, "sharding": 1, "tp": 2, "pp": 1, "sep": 1, "cp": 2}
    assert args.parallel_config.layout is layout and layout.use_hybrid
    assert layout.fleet_degrees()["cp_degree"] == 2
    # cp ranks read the same samples (splits_data=False): two data streams, one per dp rank
    assert layout.data_world_size == 2 and args.dataset_world_size == 2
    # the other refusals stay
    with pytest.raises(ValueError, match="^expert_parallel_degree=2 is not supported by paddletrainer"):
        make(tmp_path, expert_parallel_degree=2)


def test_the_new_degree_is_validated_against_the_world_size(tmp_path, world, with_cp):
    world(8)
    with pytest.raises(ValueError, match=r"^tensor_parallel_degree=2 x pipeline_parallel_degree=1 x "
                                         r"context_parallel_degree=3 = 6 does not divide the world size 8 "):
        make(tmp_path, context_parallel_degree=3, tensor_parallel_degree=2)
    with pytest.raises(ValueError, match=r"^context_parallel_degree=0 is invalid: use -1 \(unset\)"):
        make(tmp_path, context_parallel_degree=0)
    with pytest.raises(ValueError, match=r"\(tp 1 × pp 1 × sharding 1 × cp 4\) leave data parallel 2$"):
        make(tmp_path, context_parallel_degree=4, data_parallel_size=4)
    # sharding's unset degree takes what tp x cp leave
    args = make(tmp_path, context_parallel_degree=2, sharding="stage1")
    assert args.parallel_degrees.degrees == {"dp": 1, "sharding": 4, "tp": 1, "pp": 1, "sep": 1, "cp": 2}


def test_a_script_changing_the_new_degree_after_parsing_rebuilds_and_rechecks_the_layout(tmp_path, world, with_cp):
    world(8)
    args = make(tmp_path)
    assert args.parallel_config.layout.degree("cp") == 1
    args.context_parallel_degree = 4
    assert args.parallel_config.layout.degrees == {"dp": 2, "sharding": 1, "tp": 1, "pp": 1, "sep": 1, "cp": 4}
    args.context_parallel_degree = 3
    with pytest.raises(ValueError, match="context_parallel_degree=3 = 3 does not divide the world size 8"):
        args.parallel_config


def test_the_new_axis_has_coordinates_and_appears_in_checkpoint_names_only_when_active(tmp_path, world, with_cp):
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
