"""fp16 overflow decided once for the whole job, on real launches through the public Trainer.

``--fp16 true --amp_on_cpu fp32_dry_run --scale_loss 1024`` runs Paddle's live GradScaler on CPU. An inf is
injected into the backward of one rank (the last one) at step 3. Every launch checks, on every rank: the weights
stay finite; step 3 is skipped (skipped_steps 0,0,1,1); the loss scale is 1024 then 512; the LR schedule holds
at step 3; losses, grad norms and the eval loss equal one process with the same injection (1e-5); every
parameter that is not split is bitwise equal on all ranks holding it; auto_cast is active inside the model's
forward in training and in evaluation (pipeline parallel included). The pp2 launch also uses
``enable_delay_scale_loss``, so it checks that option against one process too; every other accepted
``*_parallel_config`` option runs in one of the launches as well.
"""
from __future__ import annotations

import pytest

from launcher import launch, read_results, run_single

WORKER = "amp_overflow_worker.py"
RTOL = 1e-5
INJECT_STEP = 3


def overflow_args(out_dir, result_dir, weights, **options):
    base = dict(model="llama", weights=weights, num_samples=48, per_device_train_batch_size=4,
                gradient_accumulation_steps=2, learning_rate=0.01, max_grad_norm=0.8, report_to="none",
                max_steps=4, logging_steps=1, save_steps=100, seed=7, disable_tqdm=True, per_device_eval_batch_size=4,
                lr_scheduler_type="linear", warmup_steps=1, fp16=True, amp_on_cpu="fp32_dry_run", scale_loss=1024,
                inject_step=INJECT_STEP, inject_rank=0, output_dir=out_dir, result_dir=result_dir)
    base.update(options)
    args = []
    for key, value in base.items():
        args += [f"--{key}", str(value)]
    return args


@pytest.fixture(scope="module")
def reference(tmp_path_factory, llama_weights):
    work = tmp_path_factory.mktemp("amp_overflow_single")
    run_single(WORKER, overflow_args(work / "out", work / "res", llama_weights))
    return read_results(work / "res", 1)[0]


def assert_close(actual, expected, what):
    assert len(actual) == len(expected), f"{what}: {actual} vs {expected}"
    for i, (a, e) in enumerate(zip(actual, expected)):
        if i + 1 == INJECT_STEP:
            continue  # the norm of the overflowed step is inf or nan, by construction
        assert a == pytest.approx(e, rel=RTOL, abs=1e-7), f"{what}[{i}]: {a} vs {e}"


def assert_overflow_handled(rank, reference):
    assert rank["params_finite"]
    assert rank["skipped_steps"] == [0, 0, 1, 1] and rank["state_skipped_steps"] == 1
    assert rank["loss_scales"] == [1024.0, 1024.0, 512.0, 512.0]
    lrs = rank["learning_rates"]
    assert lrs[INJECT_STEP - 1] == lrs[INJECT_STEP - 2] and lrs == pytest.approx(reference["learning_rates"], rel=1e-12)
    assert_close(rank["losses"], reference["losses"], "loss")
    assert_close(rank["grad_norms"], reference["grad_norms"], "grad_norm")
    assert rank["eval_loss"] == pytest.approx(reference["eval_loss"], rel=RTOL)
    assert rank["autocast"] == {"train": ["float16/O1"], "eval": ["float16/O1"]}


def assert_replicated_params_bitwise_equal(ranks, some_replicated=True):
    holders = {}
    for r, rank in enumerate(ranks):
        for name, digest in rank["replicated"].items():
            holders.setdefault(name, {})[r] = digest
    shared = {name: by_rank for name, by_rank in holders.items() if len(by_rank) > 1}
    assert shared or not some_replicated, "no parameter is replicated across ranks in this layout"
    for name, by_rank in shared.items():
        assert len(set(by_rank.values())) == 1, f"{name} differs across ranks {sorted(by_rank)}"


def test_one_process_skips_the_overflowed_step_and_halves_the_scale(reference):
    assert_overflow_handled(reference, reference)
    assert all(n == n and n < float("inf") for i, n in enumerate(reference["grad_norms"]) if i + 1 != INJECT_STEP)
    assert not reference["grad_norms"][INJECT_STEP - 1] < float("inf")


# Each accepted *_parallel_config option (see test_parallel_options) runs in one of these launches too, except
# enable_timer (Paddle's pipeline timers synchronise CUDA; refused on CPU by check_cpu_options).
LAYOUTS = {
    "dp2": (2, dict(per_device_train_batch_size=2)),
    "tp2_sync_param_grad_moment": (2, dict(tensor_parallel_degree=2,
                                           tensor_parallel_config="sync_param sync_grad sync_moment")),
    "pp2_delay_scale_loss": (2, dict(pipeline_parallel_degree=2, pipeline_parallel_config="enable_delay_scale_loss")),
    "sharding_stage1_no_reduce_avg": (2, dict(per_device_train_batch_size=2, sharding="stage1", sharding_parallel_degree=2,
                                              sharding_parallel_config="disable_stage1_reduce_avg")),
    "sharding_stage1_split_param": (2, dict(per_device_train_batch_size=2, sharding="stage1", sharding_parallel_degree=2,
                                            sharding_parallel_config="split_param")),
    "sharding_stage2": (2, dict(per_device_train_batch_size=2, sharding="stage2", sharding_parallel_degree=2)),
    "sharding_stage3": (2, dict(per_device_train_batch_size=2, sharding="stage3", sharding_parallel_degree=2,
                                sharding_stage3_segment_size=1000)),
    "tp2_pp2": (4, dict(tensor_parallel_degree=2, pipeline_parallel_degree=2,
                        pipeline_parallel_config="disable_batch_p2p_comm enable_clear_every_step_cache "
                                                 "disable_p2p_cache_shape")),
}


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_an_inf_on_one_rank_is_skipped_by_every_rank_and_the_run_equals_one_process(
    layout, tmp_path, reference, llama_weights
):
    nproc, options = LAYOUTS[layout]
    launch(WORKER, nproc, overflow_args(tmp_path / "out", tmp_path / "res", llama_weights,
                                        inject_rank=nproc - 1, **options), tmp_path)
    ranks = read_results(tmp_path / "res", nproc)
    for rank in ranks:
        assert_overflow_handled(rank, reference)
    assert_replicated_params_bitwise_equal(ranks, some_replicated=not layout.startswith("pp2"))  # pp: none
