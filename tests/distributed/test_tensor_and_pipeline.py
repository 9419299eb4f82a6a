"""Tensor and pipeline parallel on real processes: the tiny Llama trains exactly like one process."""
from launcher import launch, read_results

from checks import LLAMA_MAX_NORM, assert_coordinates, assert_matches_single_process

TP_OP_TOLERANCE = 1e-5


def test_every_tensor_parallel_op_matches_single_process_forward_and_backward(tmp_path):
    launch("tp_ops_worker.py", 2, [tmp_path / "out"], tmp_path, timeout=200)
    for res in read_results(tmp_path / "out", 2):
        assert res.pop("patched") == 1.0 and res.pop("softmax_ce_shape") == 1.0
        assert set(res) == {"identity_fwd", "identity_bwd", "allreduce_fwd", "allreduce_bwd", "split_fwd",
                            "split_bwd", "concat_fwd", "concat_bwd", "softmax_ce_fwd", "softmax_ce_softmax",
                            "softmax_ce_bwd"}
        worst = {name: e for name, e in res.items() if e > TP_OP_TOLERANCE}
        assert not worst, worst


def test_tp2_loss_and_grad_norm_match_single_process(launch_layout, single_process):
    results = launch_layout("llama", 2, tp=2, max_norm=LLAMA_MAX_NORM)
    assert_matches_single_process(results, single_process("llama", max_norm=LLAMA_MAX_NORM), LLAMA_MAX_NORM)
    assert_coordinates(results, tp=2)
    # each tp rank holds half of every split matrix (norm weights stay whole)
    full = single_process("llama", max_norm=LLAMA_MAX_NORM)["param_bytes"]
    assert all(r["param_bytes"] < 0.51 * full for r in results)


def test_pp2_loss_and_grad_norm_match_single_process(launch_layout, single_process):
    results = launch_layout("llama", 2, pp=2, max_norm=LLAMA_MAX_NORM)
    assert_matches_single_process(results, single_process("llama", max_norm=LLAMA_MAX_NORM), LLAMA_MAX_NORM)
    assert [r["pp_rank"] for r in results] == [0, 1]


def test_pp4_loss_and_grad_norm_match_single_process(launch_layout, single_process):
    # 4 stages (one Llama layer each) need >= 4 micro-batches; pp > 2 exercises the pair-group p2p fill
    results = launch_layout("llama", 4, pp=4, ga=4, max_norm=LLAMA_MAX_NORM)
    assert_matches_single_process(results, single_process("llama", ga=4, max_norm=LLAMA_MAX_NORM), LLAMA_MAX_NORM)
    assert [r["pp_rank"] for r in results] == [0, 1, 2, 3]


def test_tp2_pp2_loss_matches_single_process(launch_layout, single_process):
    results = launch_layout("llama", 4, tp=2, pp=2, max_norm=LLAMA_MAX_NORM)
    assert_matches_single_process(results, single_process("llama", max_norm=LLAMA_MAX_NORM), LLAMA_MAX_NORM)
    assert_coordinates(results, tp=2, pp=2)


def test_dp2_tp2_loss_matches_single_process(launch_layout, single_process):
    results = launch_layout("llama", 4, dp=2, tp=2, max_norm=LLAMA_MAX_NORM)
    assert_matches_single_process(results, single_process("llama", max_norm=LLAMA_MAX_NORM), LLAMA_MAX_NORM)
    assert_coordinates(results, dp=2, tp=2)
