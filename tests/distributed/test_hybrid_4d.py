"""Three- and four-axis layouts (8 and 16 processes): the tiny Llama trains exactly like one process."""
from checks import LLAMA_MAX_NORM, assert_coordinates, assert_matches_single_process


def test_sharding2_tp2_pp2_loss_matches_single_process(launch_layout, single_process):
    results = launch_layout("llama", 8, sharding=2, stage=1, tp=2, pp=2, max_norm=LLAMA_MAX_NORM)
    assert_matches_single_process(results, single_process("llama", max_norm=LLAMA_MAX_NORM), LLAMA_MAX_NORM)
    assert_coordinates(results, sharding=2, tp=2, pp=2)


def test_dp2_tp2_pp2_loss_matches_single_process(launch_layout, single_process):
    results = launch_layout("llama", 8, dp=2, tp=2, pp=2, max_norm=LLAMA_MAX_NORM)
    assert_matches_single_process(results, single_process("llama", max_norm=LLAMA_MAX_NORM), LLAMA_MAX_NORM)
    assert_coordinates(results, dp=2, tp=2, pp=2)


def test_dp2_sharding2_tp2_pp2_loss_matches_single_process(launch_layout, single_process):
    results = launch_layout("llama", 16, dp=2, sharding=2, stage=1, tp=2, pp=2, max_norm=LLAMA_MAX_NORM)
    assert_matches_single_process(results, single_process("llama", max_norm=LLAMA_MAX_NORM), LLAMA_MAX_NORM)
    assert_coordinates(results, dp=2, sharding=2, tp=2, pp=2)
    # data ranks 0..3 each appear on all 4 (tp, pp) cells
    assert sorted(r["data_rank"] for r in results) == sorted(list(range(4)) * 4)
