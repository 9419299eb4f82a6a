"""Pure layout math of the checkpoint format: names, placements, overlaps, writers, index, rotation."""
import numpy as np
import pytest

from paddletrainer.checkpoint import placement as L
from paddletrainer.checkpoint import reshard
from paddletrainer.parallel.layout import Layout


def test_file_names_use_paddlenlp_style_rank_suffixes():
    assert L.model_file_name(0, 1) == "model_state.tp00_pp01.safetensors"
    assert L.model_file_name(0, 1, 3) == "model_state.tp00_pp01_shard03.safetensors"
    assert L.optimizer_file_name(1, 0, 2) == "optimizer.tp01_pp00_shard02.safetensors"
    assert L.rng_file_name(Layout(world_size=1).cell_name({"dp": 1, "tp": 1})) == "rng_state.dp01_shard00_tp01_pp00.json"


def test_optim_key_round_trips_names_with_dots():
    key = L.optim_key("llama.layers.0.mlp.up_proj.weight", "moment1")
    assert key == "optim/llama.layers.0.mlp.up_proj.weight/moment1"
    assert L.split_optim_key(key) == ("llama.layers.0.mlp.up_proj.weight", "moment1")


def test_checkpoint_dir_names_and_tmp_dirs_are_told_apart():
    assert L.parse_checkpoint_step("checkpoint-120") == 120
    assert L.parse_checkpoint_step(L.tmp_dir_name("checkpoint-120", "abc")) is None
    assert L.is_tmp_dir_name(L.tmp_dir_name("checkpoint-7", "1-ff"))
    assert not L.is_tmp_dir_name("checkpoint-7")
    assert L.parse_checkpoint_step("checkpoint-x") is None


def test_tp_placement_for_column_and_row_splits():
    col = L.tp_placement((8, 3), split_axis=1, tp_rank=1, tp_degree=2)
    assert col.global_shape == (8, 6) and col.offsets == (0, 3) and col.shape == (8, 3)
    row = L.tp_placement((4, 6), split_axis=0, tp_rank=1, tp_degree=2)
    assert row.global_shape == (8, 6) and row.offsets == (4, 0)
    with pytest.raises(ValueError):
        L.tp_placement((4,), split_axis=1, tp_rank=0, tp_degree=2)


def test_place_rank_keys_states_by_the_first_tied_name_and_places_them_by_their_rules():
    w = L.HeldTensor("lm.w", (8, 3), ("w0",), 24, split_axis=1)  # tp rank 1's column half of a [8, 6] weight
    tied = L.HeldTensor("head.w", (8, 3), ("w0",), 24, split_axis=1)
    s3 = L.HeldTensor("b", (4,), ("b0", "slice@b0"), 2, flat=(2, 4))  # stage 3: sharding rank 1's half
    held = L.Holdings([w, tied, s3], [L.HeldState("w0", "moment1", (8, 3)), L.HeldState("w0", "beta1_pow_acc", (1,)),
                                      L.HeldState("slice@b0", "moment1", (2,)), L.HeldState("w0", "other", (5,))],
                      stepped=[("w0", None)], offloaded=["slice@b0", "not_held"], tp_rank=1, tp_degree=2)
    placed = L.place_rank(held)
    (wkey, wbox), (tkey, _), (bkey, bbox) = placed.tensors
    assert (wkey, tkey, bkey) == ("model/lm.w", "model/head.w", "model/b")
    assert wbox == L.tp_placement((8, 3), 1, 1, 2) and bbox == L.flat_placement(L.replicated((4,)), 2, 4)
    assert placed.states == [("optim/lm.w/moment1", wbox), ("optim/lm.w/beta1_pow_acc", L.replicated((1,))),
                             ("optim/b/moment1", bbox), ("optim/lm.w/other", L.replicated((5,)))]
    assert placed.offloaded == [("optim/b/master_weight", 2), None]
    assert placed.stepped == {"lm.w", "b"}  # the optimizer's, and the stage-3 slice it holds


def test_place_rank_places_split_param_states_as_flat_ranges_and_drops_padding_only_slices():
    w = L.HeldTensor("w", (4, 3), ("w",), 12)
    states = [L.HeldState("w", "moment1", (2,)), L.HeldState("w", "beta1_pow_acc", (1,))]
    kept = L.place_rank(L.Holdings([w], states, flat_ranges={"w": (5, 7)}, stepped=[("w", (5, 7))]))
    assert kept.states == [("optim/w/moment1", L.flat_placement(L.replicated((4, 3)), 5, 7)),
                           ("optim/w/beta1_pow_acc", L.replicated((1,)))]
    assert kept.stepped == {"w"}
    padding = L.place_rank(L.Holdings([w], states[:1], flat_ranges={"w": (12, 14)}, stepped=[("w", (12, 14))]))
    assert padding.states == [None] and padding.stepped == set()
    with pytest.raises(L.CheckpointError, match="moment1 of ghost belongs to no parameter"):
        L.place_rank(L.Holdings([w], [L.HeldState("ghost", "moment1", (12,))]))


def test_box_overlap_intersections_and_empty_cases():
    assert L.box_overlap((0, 3), (8, 3), (2, 0), (4, 6)) == ((2, 3), (4, 3))
    assert L.box_overlap((0, 0), (4, 6), (4, 0), (4, 6)) is None  # touching, not overlapping
    assert L.box_overlap((), (), (), ()) == ((), ())  # scalars always overlap


def test_column_pieces_reassemble_into_row_slices_by_overlap_math():
    """Reshard col-split [8,6] (2 pieces) into row-split targets using only the pure functions."""
    full = np.arange(48).reshape(8, 6)
    pieces = [((0, 0), (8, 3)), ((0, 3), (8, 3))]
    for t_off, t_shape in (((0, 0), (4, 6)), ((4, 0), (4, 6))):
        out = np.full(t_shape, -1)
        for p_off, p_shape in pieces:
            ov = L.box_overlap(p_off, p_shape, t_off, t_shape)
            stored = full[reshard.relative_slices(p_off, p_shape, (0, 0))]
            out[reshard.relative_slices(*ov, t_off)] = stored[reshard.relative_slices(*ov, p_off)]
        np.testing.assert_array_equal(out, full[t_off[0]: t_off[0] + 4])


def test_flat_rows_selects_the_flat_part_inside_a_row_range():
    # box [4, 5] flattened; piece holds [7, 13): rows 1..2 hold flat 5..15
    assert reshard.flat_rows((4, 5), (7, 13), 1, 3) == (7, 13)
    assert reshard.flat_rows((4, 5), (7, 13), 0, 1) is None  # row 0 is 0..5, before the piece
    assert reshard.flat_rows((4, 5), (7, 13), 2, 4) == (10, 13)
    assert reshard.row_block_of_flat((4, 5), (7, 13)) == (1, 3)
    assert L.flat_placement(L.replicated((4, 5)), 15, 40).flat == (15, 20)  # clipped: stage-3 padding


def _entry(key, rank, offsets=(0,), shape=(4,), gshape=(4,), kind="model"):
    return L.PieceEntry(key, "float32", L.Placement(gshape, offsets, shape), rank, kind)


def test_assign_writers_writes_each_replica_once_by_the_lowest_rank():
    r0 = [_entry("model/w", 0), _entry("model/tp", 0, (0,), (2,))]
    r1 = [_entry("model/w", 1), _entry("model/tp", 1, (2,), (2,))]
    out = L.assign_writers([r0, r1])
    assert [e.key for e in out[0]] == ["model/w", "model/tp"]
    assert [e.key for e in out[1]] == ["model/tp"]  # its own slice only; the replica of w is skipped


def test_assign_writers_refuses_ranks_that_disagree_on_global_shape():
    with pytest.raises(L.CheckpointError, match="disagree"):
        L.assign_writers([[_entry("model/w", 0)], [_entry("model/w", 1, shape=(8,), gshape=(8,))]])


def test_file_names_add_shard_and_dp_only_when_writers_collide():
    coords = [(0, 0, 0, 0), (0, 0, 1, 0)]  # two sharding ranks of one (tp, pp) cell
    assigned = [[_entry("model/a", 0)], [_entry("model/b", 1)]]
    names = L.file_names_for_writers(coords, assigned)
    assert names[0]["model"] == "model_state.tp00_pp00_shard00.safetensors"  # stage 3 style
    assigned = [[_entry("model/a", 0)], [_entry("optim/b/moment1", 1, kind="optimizer")]]
    names = L.file_names_for_writers(coords, assigned)
    assert names[0] == {"model": "model_state.tp00_pp00.safetensors"}
    assert names[1] == {"optimizer": "optimizer.tp00_pp00_shard01.safetensors"}


def test_index_round_trip_and_coverage_check():
    pieces = [
        L.PieceEntry("model/w", "float32", L.tp_placement((8, 3), 1, r, 2), r, "model_state.tp0%d_pp00.safetensors" % r)
        for r in range(2)
    ]
    files = {p.file: {"size": 10, "crc32": 1} for p in pieces}
    index = L.build_index(pieces, files, {"world_size": 2, "tp_degree": 2})
    assert index["tensors"]["model/w"]["shape"] == [8, 6]
    assert [p["offsets"] for p in index["tensors"]["model/w"]["pieces"]] == [[0, 0], [0, 3]]
    target = L.Placement((8, 6), (4, 0), (4, 6))
    assert len(L.pieces_for(index, "model/w", target)) == 2
    with pytest.raises(L.CheckpointError, match="cover 24 of 48"):
        L.build_index(pieces[:1], files, {})


def test_compare_to_index_lists_missing_unexpected_and_shape_mismatches():
    index = {"tensors": {"model/a": {"shape": [4]}, "model/b": {"shape": [2, 2]}, "model/old": {"shape": [1]}}}
    expected = {"model/a": ((4,), "float32"), "model/b": ((4, 2), "float32"), "model/new": ((3,), "float32")}
    problems = L.compare_to_index(index, expected, complete_model=True)
    assert problems == [
        "shape mismatch: model/b checkpoint [2, 2] vs model [4, 2]",
        "missing in checkpoint: model/new [3]",
        "unexpected in checkpoint: model/old [1]",
    ]
    # a pipeline stage holds only part of the model: extra names are not its problem
    assert len(L.compare_to_index(index, expected, complete_model=False)) == 2
    err = L.CheckpointMismatchError(problems)
    assert "model/new" in str(err) and err.mismatches == problems


def test_rotation_keeps_limit_newest_and_best():
    assert L.select_checkpoints_to_delete([10, 20, 30, 40], 2) == [10, 20]
    assert L.select_checkpoints_to_delete([10, 20, 30, 40], 2, best_step=10) == [20, 30]
    # limit 1 with an older best keeps two: the best and the newest
    assert L.select_checkpoints_to_delete([10, 20, 30], 1, best_step=20) == [10]
    assert L.select_checkpoints_to_delete([10, 20], None) == []
    assert L.select_checkpoints_to_delete([], 1) == []
    assert L.select_checkpoints_to_delete([40], 1, best_step=40) == []
