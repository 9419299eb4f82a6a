"""Ring context parallel (``context_parallel_degree``) as an axis of the Layout: read, checked before any process
group, named only when active, run on fleet's sep groups as PaddleNLP does, and the Trainer's load-balanced
cut (``parallel.context``). The multi-process claims (cp2 equal to one process) are in
tests/distributed/test_trainer_matrix.py."""
import numpy as np
import paddle
import pytest

from paddletrainer import TrainingArguments
from paddletrainer.checks import check_model_for_layout
from paddletrainer.parallel.config import ParallelConfig
from paddletrainer.parallel.context import shard_context
from paddletrainer.parallel.layout import Layout
from paddletrainer.parallel.ring_attention import undo_load_balanced


def test_the_cp_degree_is_a_model_axis_on_fleets_sep_groups(tmp_path, world):
    world(8)
    args = TrainingArguments(output_dir=str(tmp_path), context_parallel_degree=2, tensor_parallel_degree=2)
    layout = args.parallel_degrees
    assert layout.degrees == {"dp": 2, "sharding": 1, "tp": 2, "pp": 1, "sep": 1, "cp": 2}
    assert layout.data_world_size == 2 and args.dataset_world_size == 2  # cp ranks read the same samples
    # PaddleNLP 3.0.0b4 passes sep_degree = context_parallel_degree to fleet; Llama reads the sep group
    assert layout.fleet_degrees() == {"dp_degree": 2, "sharding_degree": 1, "mp_degree": 2, "pp_degree": 1,
                                      "sep_degree": 2}
    # fleet's pp_first grid (dp, pp, sharding, sep, cp, mp): strides mp 1, sep 2, dp 4; sep itself stays at 0
    assert layout.coordinates(3) == {"dp": 0, "sharding": 0, "tp": 1, "pp": 0, "sep": 0, "cp": 1}
    assert layout.cell_name(layout.coordinates(7)) == "dp01_shard00_tp01_pp00_cp01"
    assert layout.as_dict()["cp_degree"] == 2 and layout.describe() == "dp2·sharding1·tp2·pp1·cp2"
    # under sep the cp coordinate stays 0 (the two axes share fleet's entry, only the active one holds it)
    sep = Layout(world_size=4, dp=2, sep=2)
    assert sep.coordinates(1)["sep"] == 1 and sep.coordinates(1)["cp"] == 0


@pytest.mark.parametrize("options,message", [
    (dict(context_parallel_degree=3), "context_parallel_degree=3 = 3 does not divide the world size 4"),
    (dict(context_parallel_degree=2, sharding="stage2", sharding_parallel_degree=2),
     "sharding='stage2' cannot be combined with context_parallel_degree=2"),
    (dict(context_parallel_degree=2, sharding="stage1", sharding_parallel_degree=2),
     "sharding='stage1' with context_parallel_degree=2 is not supported yet"),
    (dict(context_parallel_degree=2, pipeline_parallel_degree=2, gradient_accumulation_steps=2),
     "pipeline_parallel_degree=2 with context_parallel_degree=2 is not supported yet"),
    (dict(context_parallel_degree=2, tensor_parallel_degree=2, sequence_parallel=True),
     "sequence_parallel=True with context_parallel_degree=2"),
    (dict(context_parallel_degree=2, split_inputs_sequence_dim=False), "split_inputs_sequence_dim=False with "
                                                                      "context_parallel_degree=2"),
])
def test_cp_combinations_are_refused_before_any_process_group(tmp_path, world, options, message):
    world(4)
    with pytest.raises(ValueError, match=message):
        TrainingArguments(output_dir=str(tmp_path), **options)


def test_cp_runs_with_dp_and_tp(tmp_path, world):
    world(4)
    for options in (dict(), dict(tensor_parallel_degree=2)):
        config = TrainingArguments(output_dir=str(tmp_path), context_parallel_degree=2, **options).parallel_config
        assert isinstance(config, ParallelConfig) and config.layout.cp == 2


def test_the_cut_keeps_chunks_r_and_2cp_minus_1_minus_r_and_the_gather_restores_the_order():
    ids = paddle.to_tensor(np.arange(32, dtype="int64").reshape(2, 16))
    batch = {"input_ids": ids, "labels": ids + 100}
    parts = []
    for rank, (first, second) in enumerate([(0, 3), (1, 2)]):
        piece = shard_context(batch, 2, rank)
        expect = np.concatenate([ids.numpy()[:, first * 4:(first + 1) * 4], ids.numpy()[:, second * 4:(second + 1) * 4]],
                                axis=1)
        assert piece["input_ids"].numpy().tolist() == expect.tolist()
        assert piece["labels"].numpy().tolist() == (expect + 100).tolist()
        parts.append(piece["input_ids"].unsqueeze(-1))  # as logits [batch, seq/cp, vocab]
    assert undo_load_balanced(parts, axis=1).squeeze(-1).numpy().tolist() == ids.numpy().tolist()
    assert shard_context(batch, 1, 0) is batch


@pytest.mark.parametrize("batch,message", [
    ({"input_ids": np.zeros((2, 16)), "attention_mask": np.ones((2, 16))}, "attention_mask \\(padding\\)"),
    ({"input_ids": np.zeros((2, 16)), "position_ids": np.zeros((2, 16))}, "position_ids must count up by one across"),
    ({"input_ids": np.zeros((2, 16)), "attention_mask": np.ones((2, 1, 16, 16))}, "is not causal with each key seen"),
    ({"input_ids": np.zeros((2, 12))}, "context_parallel_degree=4: the sequence length 12 of batch key .input_ids. does not divide into 8 pieces"),
    ({"input_ids": np.zeros((2, 16, 3))}, "must be \\[batch, sequence\\]"),
])
def test_padding_masks_inconsistent_positions_and_uneven_sequences_are_refused_under_cp(batch, message):
    batch = {k: paddle.to_tensor(v) for k, v in batch.items()}
    with pytest.raises(ValueError, match=message):
        shard_context(batch, 4, 0)


class _Config:
    def __init__(self, cp, seq=16, flash=True, fused_rope=False, alibi=False):
        self.context_parallel_degree, self.seq_length, self.use_flash_attention = cp, seq, flash
        self.use_fused_rope, self.alibi, self.sep_parallel_degree, self.tensor_parallel_degree = fused_rope, alibi, 1, 1


class LlamaAttention(paddle.nn.Layer):  # the name of PaddleNLP's attention with a ring path
    pass


class _Model(paddle.nn.Layer):
    def __init__(self, config, cp_path=True):
        super().__init__()
        self.config = config
        self.attn = LlamaAttention() if cp_path else paddle.nn.Linear(2, 2)


@pytest.mark.parametrize("model,message", [
    (_Model(_Config(1)), "has config.context_parallel_degree=1"),
    (_Model(_Config(2), cp_path=False), "needs a model with a ring-attention path"),
    (_Model(_Config(2, flash=False)), "use_flash_attention is False"),
    (_Model(_Config(2, alibi=True)), "alibi=True"),
    (_Model(_Config(2, fused_rope=True)), "use_fused_rope=True needs a GPU"),
    (_Model(_Config(2, seq=18)), "seq_length=18 is not divisible by 2 x context_parallel_degree = 4"),
])
def test_a_model_without_a_cp_path_or_a_length_cp_cannot_split_is_refused(model, message):
    with pytest.raises(ValueError, match=message):
        check_model_for_layout(model, Layout(world_size=2, cp=2))


def test_a_model_with_a_cp_path_passes():
    check_model_for_layout(_Model(_Config(2)), Layout(world_size=2, cp=2))
