"""Sequence-segment parallel (``sep_parallel_degree``) as an axis of the Layout: read, checked before any process
group, named only when active, and the Trainer's sequence cut (``parallel.segment``). The multi-process claims
(sep2, dp2·sep2, tp2·sep2 equal to one process) are in tests/distributed/test_trainer_matrix.py."""
import numpy as np
import paddle
import pytest

from paddletrainer import TrainingArguments
from paddletrainer.checks import check_model_for_layout
from paddletrainer.parallel.config import ParallelConfig
from paddletrainer.parallel.layout import Layout
from paddletrainer.parallel.segment import shard_sequence


def test_the_sep_degree_is_a_model_axis_of_the_layout_read_from_paddlenlps_option(tmp_path, world):
    world(8)
    args = TrainingArguments(output_dir=str(tmp_path), sep_parallel_degree=2, tensor_parallel_degree=2)
    layout = args.parallel_degrees
    assert layout.degrees == {"dp": 2, "sharding": 1, "tp": 2, "pp": 1, "sep": 2, "cp": 1}
    # sep ranks read the same samples (PaddleNLP multiplies sep into the model-parallel product)
    assert layout.data_world_size == 2 and args.dataset_world_size == 2
    assert layout.fleet_degrees()["sep_degree"] == 2 and layout.use_hybrid
    # fleet's pp_first grid (dp, pp, sharding, sep, cp, mp): strides mp 1, sep 2, dp 4
    assert layout.coordinates(3) == {"dp": 0, "sharding": 0, "tp": 1, "pp": 0, "sep": 1, "cp": 0}
    assert layout.cell_name(layout.coordinates(7)) == "dp01_shard00_tp01_pp00_sep01"
    assert layout.as_dict()["sep_degree"] == 2 and layout.describe() == "dp2·sharding1·tp2·pp1·sep2"


def test_at_sep_degree_1_names_and_fleet_config_are_those_of_checkpoints_written_before_the_axis():
    layout = Layout(world_size=4, dp=2, tp=2)
    assert layout.cell_name(layout.coordinates(1)) == "dp00_shard00_tp01_pp00"
    assert "sep_degree" not in layout.as_dict() and "sep_degree" not in layout.fleet_degrees()
    assert layout.describe() == "dp2·sharding1·tp2·pp1"


@pytest.mark.parametrize("options,message", [
    (dict(sep_parallel_degree=3), "sep_parallel_degree=3 = 3 does not divide the world size 4"),
    (dict(sep_parallel_degree=2, context_parallel_degree=2), "cannot both be > 1"),
    (dict(sep_parallel_degree=2, sharding="stage2", sharding_parallel_degree=2),
     "sharding='stage2' cannot be combined with sep_parallel_degree=2"),
    (dict(sep_parallel_degree=2, tensor_parallel_degree=2, sequence_parallel=True),
     "sequence_parallel=True with sep_parallel_degree=2"),
    (dict(sep_parallel_degree=2, split_inputs_sequence_dim=False), "split_inputs_sequence_dim=False"),
])
def test_sep_combinations_are_refused_before_any_process_group(tmp_path, world, options, message):
    world(4)
    with pytest.raises(ValueError, match=message):
        TrainingArguments(output_dir=str(tmp_path), **options)


def test_sep_runs_with_dp_tp_pp_and_sharding_stage1(tmp_path, world):
    world(4)
    for options in (dict(), dict(tensor_parallel_degree=2), dict(sharding="stage1", sharding_parallel_degree=2),
                    dict(pipeline_parallel_degree=2, gradient_accumulation_steps=2)):
        config = TrainingArguments(output_dir=str(tmp_path), sep_parallel_degree=2, **options).parallel_config
        assert isinstance(config, ParallelConfig) and config.layout.sep == 2


def test_the_cut_keeps_this_ranks_contiguous_segment_of_every_sequence():
    ids = paddle.to_tensor(np.arange(24, dtype="int64").reshape(2, 12))
    batch = {"input_ids": ids, "labels": ids + 100}
    for rank in range(3):
        piece = shard_sequence(batch, 3, rank)
        assert piece["input_ids"].numpy().tolist() == ids.numpy()[:, rank * 4:(rank + 1) * 4].tolist()
        assert piece["labels"].numpy().tolist() == (ids.numpy() + 100)[:, rank * 4:(rank + 1) * 4].tolist()
    assert shard_sequence(batch, 1, 0) is batch


@pytest.mark.parametrize("batch,message", [
    ({"input_ids": np.zeros((2, 12)), "attention_mask": np.ones((2, 12))}, "attention_mask \\(padding\\)"),
    ({"input_ids": np.zeros((2, 12)), "attention_mask": np.ones((2, 1, 12, 12))}, "is not causal with each key seen"),
    ({"input_ids": np.zeros((2, 10))}, "sep_parallel_degree=4: the sequence length 10 of batch key .input_ids. does not divide into 4 pieces"),
    ({"input_ids": np.zeros((2, 12, 3))}, "must be \\[batch, sequence\\]"),
])
def test_padding_masks_inconsistent_positions_and_uneven_sequences_are_refused_under_sep(batch, message):
    batch = {k: paddle.to_tensor(v) for k, v in batch.items()}
    with pytest.raises(ValueError, match=message):
        shard_sequence(batch, 4, 0)


class _Config:
    def __init__(self, sep, heads=4, kv=4, seq=16):
        self.sep_parallel_degree, self.num_attention_heads, self.num_key_value_heads = sep, heads, kv
        self.seq_length, self.tensor_parallel_degree = seq, 1


class ReshardLayer(paddle.nn.Layer):  # the name PaddleNLP's sep attention layer has
    pass


class _Model(paddle.nn.Layer):
    def __init__(self, config, sep_path=True):
        super().__init__()
        self.config = config
        self.reshard = ReshardLayer() if sep_path else paddle.nn.Linear(2, 2)


@pytest.mark.parametrize("model,tp,message", [
    (_Model(_Config(1), sep_path=False), 1, "config.sep_parallel_degree=1 and no ReshardLayer"),
    (_Model(_Config(2), sep_path=False), 1, "and no ReshardLayer"),
    (_Model(_Config(2, heads=6, kv=6)), 2, "num_attention_heads=6 is not divisible by tensor_parallel_degree x "
                                           "sep_parallel_degree = 2 x 2"),
    (_Model(_Config(2, kv=2)), 2, "num_key_value_heads=2 is not divisible"),
    (_Model(_Config(2, seq=15)), 1, "seq_length=15 is not divisible by sep_parallel_degree=2"),
])
def test_a_model_without_a_sep_path_or_with_heads_or_length_sep_cannot_split_is_refused(model, tp, message):
    with pytest.raises(ValueError, match=message):
        check_model_for_layout(model, Layout(world_size=2 * tp, tp=tp, sep=2))


def test_a_model_with_a_sep_path_passes():
    check_model_for_layout(_Model(_Config(2)), Layout(world_size=2, sep=2))
