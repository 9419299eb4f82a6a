"""dp and sharding (stage 1/2/3) on real processes: the same losses and grad norms as one process, and
each sharding rank holds about half of the optimizer state (and, under stage 3, of the parameters)."""
from checks import LLAMA_MAX_NORM, MLP_MAX_NORM, assert_about_half, assert_coordinates, assert_matches_single_process

# Llama parameters with more than this many elements are sliced under stage 3 (every weight matrix; the
# 32-element norms stay whole).
STAGE3_SEGMENT = 1000


def test_dp2_loss_and_grad_norm_match_single_process(launch_layout, single_process):
    results = launch_layout("mlp", 2, dp=2, max_norm=MLP_MAX_NORM)
    assert_matches_single_process(results, single_process("mlp", max_norm=MLP_MAX_NORM), MLP_MAX_NORM)
    assert [r["data_rank"] for r in results] == [0, 1]


def test_dp4_loss_and_grad_norm_match_single_process(launch_layout, single_process):
    # global micro-batch 4 over 4 data ranks: one sample per rank and micro-step
    results = launch_layout("mlp", 4, dp=4, max_norm=MLP_MAX_NORM)
    assert_matches_single_process(results, single_process("mlp", max_norm=MLP_MAX_NORM), MLP_MAX_NORM)
    assert [r["data_rank"] for r in results] == [0, 1, 2, 3]


def test_sharding_stage2_x2_with_dp2_matches_single_process(launch_layout, single_process):
    results = launch_layout("mlp", 4, sharding=2, dp=2, stage=2, max_norm=MLP_MAX_NORM)
    assert_matches_single_process(results, single_process("mlp", max_norm=MLP_MAX_NORM), MLP_MAX_NORM)
    assert_coordinates(results, dp=2, sharding=2)
    # dp replicas of one sharding rank hold the same optimizer shard
    by_shard = {}
    for r in results:
        by_shard.setdefault(r["sharding_rank"], set()).add(r["opt_state_bytes"])
    assert all(len(v) == 1 for v in by_shard.values())


def test_sharding_stage1_x2_matches_single_process_and_halves_optimizer_state(launch_layout, single_process):
    reference = single_process("llama", max_norm=LLAMA_MAX_NORM)
    results = launch_layout("llama", 2, sharding=2, stage=1, max_norm=LLAMA_MAX_NORM)
    assert_matches_single_process(results, reference, LLAMA_MAX_NORM)
    for r in results:
        assert_about_half(r["opt_state_bytes"], reference["opt_state_bytes"], f"stage1 rank {r['rank']} state")
    # whole parameters are partitioned: the shards add up to one process's state
    assert sum(r["opt_state_bytes"] for r in results) == reference["opt_state_bytes"]


def test_sharding_stage2_x2_matches_single_process_and_halves_optimizer_state(launch_layout, single_process):
    reference = single_process("llama", max_norm=LLAMA_MAX_NORM)
    results = launch_layout("llama", 2, sharding=2, stage=2, max_norm=LLAMA_MAX_NORM)
    assert_matches_single_process(results, reference, LLAMA_MAX_NORM)
    for r in results:
        assert_about_half(r["opt_state_bytes"], reference["opt_state_bytes"], f"stage2 rank {r['rank']} state")
    assert sum(r["opt_state_bytes"] for r in results) == reference["opt_state_bytes"]


def test_sharding_stage2_reduces_gradients_once_per_optimizer_step_whatever_the_accumulation(
    launch_layout, single_process
):
    # GroupShardedStage2 reduces in its backward hooks; the micro-batches before the last run inside no_sync,
    # so 4 accumulation steps reduce exactly as often as 1 (and still match one process).
    once = launch_layout("mlp", 2, sharding=2, stage=2, ga=1, max_norm=MLP_MAX_NORM)
    accumulated = launch_layout("mlp", 2, sharding=2, stage=2, ga=4, max_norm=MLP_MAX_NORM)
    assert_matches_single_process(accumulated, single_process("mlp", ga=4, max_norm=MLP_MAX_NORM), MLP_MAX_NORM)
    for r1, r4 in zip(once, accumulated):
        assert r1["reduce_calls_per_step"] > 0, "stage2 reduced nothing: the counter missed Paddle's reduce"
        assert r4["reduce_calls_per_step"] == r1["reduce_calls_per_step"], f"rank {r4['rank']}"


def test_sharding_stage3_x2_matches_single_process_and_halves_parameters_and_state(launch_layout, single_process):
    reference = single_process("llama", max_norm=LLAMA_MAX_NORM)
    results = launch_layout("llama", 2, sharding=2, stage=3, segment_size=STAGE3_SEGMENT, max_norm=LLAMA_MAX_NORM)
    assert_matches_single_process(results, reference, LLAMA_MAX_NORM)
    for r in results:
        assert_about_half(r["param_bytes"], reference["param_bytes"], f"stage3 rank {r['rank']} parameters")
        assert_about_half(r["opt_state_bytes"], reference["opt_state_bytes"], f"stage3 rank {r['rank']} state")


def test_sharding_stage3_offload_x2_matches_single_process_and_halves_state(launch_layout, single_process):
    # Paddle's offload path (fp32 host masters, host gradients, step under device_guard) through
    # parallel/cpu/stage3_offload.py; on CPU "host" and "device" are the same memory, so only the sharding halves.
    reference = single_process("llama", max_norm=LLAMA_MAX_NORM)
    results = launch_layout("llama", 2, sharding=2, stage=3, offload=True, segment_size=STAGE3_SEGMENT,
                            max_norm=LLAMA_MAX_NORM)
    assert_matches_single_process(results, reference, LLAMA_MAX_NORM)
    for r in results:
        assert r["offload_master_bytes"] > 0, "offload kept no host master weights"
        assert_about_half(r["opt_state_bytes"], reference["opt_state_bytes"], f"stage3 offload rank {r['rank']} state")
        assert_about_half(r["offload_master_bytes"], reference["param_bytes"],
                          f"stage3 offload rank {r['rank']} master weights")


def test_sharding_stage2_x2_with_tp2_matches_single_process(launch_layout, single_process):
    # PaddleNLP's stage2 + tp layout: TensorParallel inside GroupShardedStage2
    results = launch_layout("llama", 4, sharding=2, stage=2, tp=2, max_norm=LLAMA_MAX_NORM)
    assert_matches_single_process(results, single_process("llama", max_norm=LLAMA_MAX_NORM), LLAMA_MAX_NORM)
    assert_coordinates(results, sharding=2, tp=2)
