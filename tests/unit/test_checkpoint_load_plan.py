"""placement.plan_load: what one rank's load reads, planned once from the index."""
from paddletrainer.checkpoint import placement as L


def _index():
    # model/w [4, 2] saved by tp2 as two row halves; optim/w/moment1 saved whole
    return {"tensors": {
        "model/w": {"shape": [4, 2], "dtype": "float32", "pieces": [
            {"file": "model.tp0.safetensors", "key": "w", "offsets": [0, 0], "shape": [2, 2]},
            {"file": "model.tp1.safetensors", "key": "w", "offsets": [2, 0], "shape": [2, 2]}]},
        "optim/w/moment1": {"shape": [4, 2], "dtype": "float32", "pieces": [
            {"file": "optimizer.safetensors", "offsets": [0, 0], "shape": [4, 2]}]},
    }}


def test_a_target_equal_to_one_stored_piece_is_read_directly_and_a_resharded_one_from_every_overlapping_piece():
    whole = L.replicated([4, 2])
    second_half = L.tp_placement([2, 2], 0, 1, 2)
    plan = L.plan_load(_index(), {"model/w": (whole, "float32", 8)},
                       {"optim/w/moment1": (whole, "float32", 8)}, complete_model=True, stepped={"w"})
    assert plan.problems == [] and plan.unplaced == []
    assert plan.needed == {"model.tp0.safetensors": {"w"}, "model.tp1.safetensors": {"w"},
                           "optimizer.safetensors": {"optim/w/moment1"}}
    assert plan.whole == {"optim/w/moment1": ("optimizer.safetensors", "optim/w/moment1")}

    plan = L.plan_load(_index(), {"model/w": (second_half, "float32", 4)}, {}, complete_model=False)
    assert plan.needed == {"model.tp1.safetensors": {"w"}}
    assert plan.whole == {"model/w": ("model.tp1.safetensors", "w")}
    # another dtype (converted) or a padded storage is never read straight into the tensor
    assert L.plan_load(_index(), {"model/w": (second_half, "bfloat16", 4)}, {}, complete_model=False).whole == {}
    assert L.plan_load(_index(), {"model/w": (second_half, "float32", 6)}, {}, complete_model=False).whole == {}


def test_a_plan_with_misfits_lists_them_all_and_reads_nothing():
    plan = L.plan_load(_index(), {"model/w": (L.replicated([4, 3]), "float32", 12),
                                  "model/b": (L.replicated([2]), "float32", 2)},
                       {}, complete_model=True, stepped={"w"})
    assert plan.problems == ["missing in checkpoint: model/b [2]",
                             "shape mismatch: model/w checkpoint [4, 2] vs model [4, 3]"]
    assert plan.unplaced == ["optim/w/moment1"]  # its parameter is stepped here, and nothing receives it
    assert plan.needed == {} and plan.whole == {}
