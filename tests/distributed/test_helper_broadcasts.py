"""``paddletrainer.utils.helper``'s multi-process helpers give PaddleNLP's results on 2 CPU processes: a file only
one node has (``distributed_isfile``/``distributed_file``), an optimizer state only the data group's source loaded
(``broadcast_dp_optimizer``, ``broadcast_moe_optimizer``) and rank 0's model (``broadcast_dataset_rank0_model``)."""
import pytest

from launcher import launch, read_results

pytest.importorskip("paddlenlp.trainer.utils.helper")


@pytest.mark.parametrize("layout", ["dp", "sharding"])
def test_helper_broadcasts_match_paddlenlps(tmp_path, layout):
    launch("helper_broadcast_worker.py", 2, [tmp_path, layout], tmp_path, timeout=300)
    results = read_results(tmp_path, 2)
    for rank, r in enumerate(results):
        assert r["isfile"] == [True, True] and r["isfile_missing"] == [False, False]
        assert r["file"] == ["weights of node 1"] * 2  # node 0 got node 1's bytes, with the directory
        assert "no node has 'ckpt/none.bin'" in r["missing_file"]
        assert r["dp_ours"] == r["dp_theirs"] and r["moe_ours"] == r["moe_theirs"]
        assert r["model_ours"] == r["rank0_init"]
        if layout == "sharding":
            assert r["model_theirs"] == r["model_ours"]
    second = results[1]
    if layout == "dp":  # the data group is the job: rank 1 received rank 0's state
        assert second["dp_ours"] == results[0]["dp_ours"]
        assert second["dp_ours"]["shared.w_moment1_0"]["values"] == [[1.0, 2.0]]
        moe = second["moe_ours"]  # the shared part from rank 0, rank 1's own expert
        assert sorted(moe) == ["LR_Scheduler", "expert.w_moment1_0", "master_weights", "shared.w_moment1_0"]
        assert moe["expert.w_moment1_0"]["values"] == [[6.0]] and moe["LR_Scheduler"] == {"last_epoch": 3}
        assert moe["master_weights"]["expert.w"]["values"] == [[8.0]]
        assert moe["master_weights"]["shared.w"]["values"] == [[0.5, 0.25]]
        every = second["moe_all_keys_ours"]  # every key rank 0 has; rank 1's own entries kept over them
        assert every["expert.w_moment1_0"]["values"] == [[6.0]]
        assert every["shared.w_moment1_0"]["values"] == [[1.0, 2.0]]
    else:  # the data group has one rank: nothing moves
        assert second["dp_ours"] is None
