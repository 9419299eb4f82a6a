"""Expert parallel through the public Trainer, against one process with the same global batch (8).

The model (``workers/moe_model.py``): embedding → ``paddletrainer.moe.MoELayer`` (4 experts, top-2, dropless,
aux and z-loss on) → lm head, its groups from ``paddletrainer.parallel.expert``. One launch per layout
(``workers/trainer_phases_worker.py``) checks on every rank: every step's loss and grad norm, ``evaluate()`` on
13 samples against the loss computed sample by sample, the step-3 checkpoint resumed with ``max_steps`` 6 in the
same layout and the one-process checkpoint resumed in this layout (both on the one-process 6-step curve); then the
layout's checkpoint resumed in one process. ep2 (dp2: one replica of each expert) and dp4·ep2 (two replicas: the
expert-data-parallel sum) run in CI, dp4·ep2, ep4 and ep2·tp2 resuming the ep2 checkpoint; ep4 and ep2·tp2 with
``PT_FULL_MATRIX=1``. ep2·pp2 (pp2 × dp2; the pipeline variant ``TinyMoEPipe`` with an MoE block on each stage, the
auxiliary loss carried with the hidden states to the loss stage; against the two-block model in one process) runs in
CI: loss, grad norm, eval and its own resume (no checkpoint exchange with the non-pipeline model: the pipeline names
its layers differently). ep2 carved from sharding stage1×2 (world 2: experts outside the sharded partition, updated
locally) runs in CI (about 40 s): its claims, its step-3 model and optimizer states against one process's by global
name, the one-process checkpoint resumed in it and its checkpoint in one process; ep2 carved from stage1×4 (two
replicas of each expert) resuming the ep2 checkpoint with ``PT_FULL_MATRIX=1``.
An fp16 overflow injected into one expert's gradient (held by one rank only) makes every rank skip the step.
"""
from __future__ import annotations

import os

import numpy as np
import pytest
from safetensors.numpy import load_file

from launcher import launch, read_results, run_single
from trainer_phases import GLOBAL_BATCH, RTOL, WORKER, assert_curve, close, phase_args

FULL = os.environ.get("PT_FULL_MATRIX") == "1"
# below most steps' grad norm (0.10-0.13 unclipped): the clip coefficient, from the world-summed norm, acts
CLIP = 0.11


@pytest.fixture(scope="module")
def moe_reference(tmp_path_factory):
    """One process, global batch 8: the short run (with its checkpoint), the resume, the uninterrupted curve."""
    base = tmp_path_factory.mktemp("moe_one")
    run_single(WORKER, phase_args("moe", base / "out", base / "res", None, per_device_train_batch_size=4,
                                  direct_eval=True, uninterrupted=True, max_grad_norm=CLIP))
    ref = read_results(base / "res", 1)[0]
    return ref, base / "out" / "short" / "checkpoint-3"


def test_one_process_moe_reference_resumes_bit_exact(moe_reference):
    ref, _ = moe_reference
    assert ref["extended"]["losses"] == ref["uninterrupted"]["losses"]
    assert ref["extended"]["grad_norms"] == ref["uninterrupted"]["grad_norms"]
    assert ref["short"]["eval_loss"] == pytest.approx(ref["short"]["direct_eval_loss"], rel=1e-6)




def launch_layout(base, ref, nproc, ep, foreign, name, tp=1, pp=1, model="moe", **extra):
    """One launch of the phases worker: global batch 8 over ``nproc / (tp · pp)`` data ranks, ``ep`` of them per
    expert group; the layout's claims checked on every rank. Returns the launch's step-3 checkpoint."""
    options = dict(per_device_train_batch_size=GLOBAL_BATCH // (2 * nproc // (tp * pp)), expert_parallel_degree=ep,
                   max_grad_norm=CLIP, tensor_parallel_degree=tp, pipeline_parallel_degree=pp, **extra)
    if foreign is not None:
        options["foreign_checkpoint"] = foreign
    launch(WORKER, nproc, phase_args(model, base / "out", base / "res", None, **options), base, timeout=600)
    for r in read_results(base / "res", nproc):
        at = f"{name} rank {r['rank']}"
        assert_curve(r["short"], ref["short"], 3, f"{at} short run")
        assert r["short"]["eval_loss"] == pytest.approx(ref["short"]["direct_eval_loss"], rel=RTOL), at
        assert_curve(r["extended"], ref["uninterrupted"], 6, f"{at} resumed with max_steps 6")
        if foreign is not None:
            assert_curve(r["foreign"], ref["uninterrupted"], 6, f"{at} checkpoint {foreign} resumed")
    return base / "out" / "short" / "checkpoint-3"


@pytest.fixture(scope="module")
def ep2_checkpoint(tmp_path_factory, moe_reference):
    """ep2 (dp2): its claims (the one-process checkpoint resumed under ep2 among them); its step-3 checkpoint."""
    ref, one_process_checkpoint = moe_reference
    return launch_layout(tmp_path_factory.mktemp("ep2"), ref, 2, 2, one_process_checkpoint, "ep2")


def test_ep2_trains_evaluates_and_resumes_like_one_process_and_its_checkpoint_resumes_in_one_process(
        tmp_path, moe_reference, ep2_checkpoint):
    ref, _ = moe_reference
    run_single(WORKER, phase_args("moe", tmp_path / "one", tmp_path / "one_res", None, per_device_train_batch_size=4,
                                  foreign_checkpoint=ep2_checkpoint, extended_steps=6, max_grad_norm=CLIP))
    r = read_results(tmp_path / "one_res", 1)[0]
    assert_curve(r["foreign"], ref["uninterrupted"], 6, "ep2 checkpoint resumed in one process")


def test_a_moe_model_under_plain_dp2_without_expert_parallel_reduces_its_expert_gradients_like_the_rest(
        tmp_path, moe_reference, ep2_checkpoint):
    launch_layout(tmp_path, moe_reference[0], 2, 1, ep2_checkpoint, "dp2 (ep1)")


def test_dp4_ep2_sums_expert_gradients_over_the_replicas_and_resumes_the_ep2_checkpoint(
        tmp_path, moe_reference, ep2_checkpoint):
    launch_layout(tmp_path, moe_reference[0], 4, 2, ep2_checkpoint, "dp4·ep2")


def test_ep2_with_sharding_stage1_keeps_experts_out_of_the_partition_and_its_checkpoint_resumes_in_one_process(
        tmp_path, moe_reference):
    """ep2 carved from a stage-1 sharding group of 2 (world 2): dense parameters sharded, each rank updating its
    own experts; the one-process checkpoint resumed in this layout and this layout's in one process."""
    ref, one_process_checkpoint = moe_reference
    checkpoint = launch_layout(tmp_path / "s1", ref, 2, 2, one_process_checkpoint, "ep2·sharding stage1×2",
                               sharding="stage1", sharding_parallel_degree=2)
    saved, expected = checkpoint_tensors(checkpoint), checkpoint_tensors(one_process_checkpoint)
    assert sorted(saved) == sorted(expected) and any(".experts.3." in name for name in saved)
    for name, value in expected.items():  # every expert by its global name, with its own Adam moments
        assert np.allclose(saved[name], value, rtol=1e-4, atol=1e-5), f"{name}: {np.abs(saved[name] - value).max()}"
    run_single(WORKER, phase_args("moe", tmp_path / "one", tmp_path / "one_res", None, per_device_train_batch_size=4,
                                  foreign_checkpoint=checkpoint, extended_steps=6, max_grad_norm=CLIP))
    r = read_results(tmp_path / "one_res", 1)[0]
    assert_curve(r["foreign"], ref["uninterrupted"], 6, "ep2·sharding stage1×2 checkpoint resumed in one process")


@pytest.mark.full_matrix
@pytest.mark.skipif(not FULL, reason="full matrix only: PT_FULL_MATRIX=1")
def test_ep2_with_sharding_stage1x4_sums_expert_gradients_over_the_replicas_and_resumes_the_ep2_checkpoint(
        tmp_path, moe_reference, ep2_checkpoint):
    """ep2 carved from a stage-1 sharding group of 4: two replicas of each expert (edp 2) outside the partition."""
    launch_layout(tmp_path, moe_reference[0], 4, 2, ep2_checkpoint, "ep2·sharding stage1×4", sharding="stage1",
                  sharding_parallel_degree=4)


def checkpoint_tensors(checkpoint) -> dict:
    """Every model and optimizer tensor a checkpoint holds (all ranks' files), by global name."""
    tensors = {}
    for path in sorted(checkpoint.glob("*.safetensors")):
        tensors.update(load_file(str(path)))
    return tensors


@pytest.mark.full_matrix
@pytest.mark.skipif(not FULL, reason="full matrix only: PT_FULL_MATRIX=1")
def test_ep4_one_expert_per_rank_resumes_the_ep2_checkpoint(tmp_path, moe_reference, ep2_checkpoint):
    launch_layout(tmp_path, moe_reference[0], 4, 4, ep2_checkpoint, "ep4")


@pytest.mark.full_matrix
@pytest.mark.skipif(not FULL, reason="full matrix only: PT_FULL_MATRIX=1")
def test_ep2_tp2_trains_like_one_process_and_resumes_the_ep2_checkpoint(tmp_path, moe_reference, ep2_checkpoint):
    """dp2·tp2·ep2: the lm head split over tp, the experts replicated over tp and split over the data ranks."""
    launch_layout(tmp_path, moe_reference[0], 4, 2, ep2_checkpoint, "ep2·tp2", tp=2)


def test_ep2_pp2_carries_every_stages_aux_loss_and_trains_like_one_process(tmp_path):
    """pp2 × dp2, ep2 carved from each stage's data ranks, two MoE blocks (``TinyMoEPipe``: one per stage, the
    first's load-balance and z-loss terms passed with the hidden states, the second's added on the last stage)."""
    run_single(WORKER, phase_args("moe2", tmp_path / "one" / "out", tmp_path / "one" / "res", None,
                                  per_device_train_batch_size=4, direct_eval=True, uninterrupted=True,
                                  max_grad_norm=CLIP))
    ref = read_results(tmp_path / "one" / "res", 1)[0]
    launch_layout(tmp_path / "pp", ref, 4, 2, None, "ep2·pp2", pp=2, model="moe2")


OVERFLOW = "ep_overflow_worker.py"
INJECT_STEP = 3


def overflow_args(base, **options):
    values = dict(num_samples=48, per_device_train_batch_size=4, gradient_accumulation_steps=2, learning_rate=0.05,
                  max_grad_norm=5.0, report_to="none", max_steps=4, logging_steps=1, save_steps=100, seed=7,
                  disable_tqdm=True, lr_scheduler_type="constant", fp16=True, amp_on_cpu="fp32_dry_run",
                  scale_loss=1024, inject_step=INJECT_STEP, inject_expert=2, output_dir=base / "out",
                  result_dir=base / "res")
    values.update(options)
    return [item for key, value in values.items() for item in (f"--{key}", str(value))]


@pytest.mark.parametrize("sharding", [{}, dict(sharding="stage1", sharding_parallel_degree=2)], ids=["dp2", "stage1x2"])
def test_an_overflow_in_one_experts_gradient_on_one_rank_makes_every_rank_skip_the_step(tmp_path, sharding):
    """ep2 over dp2, and carved from sharding stage1×2 (the expert updated outside the sharded step)."""
    run_single(OVERFLOW, overflow_args(tmp_path / "one"))
    ref = read_results(tmp_path / "one" / "res", 1)[0]
    launch(OVERFLOW, 2, overflow_args(tmp_path / "ep2", per_device_train_batch_size=2, expert_parallel_degree=2,
                                      **sharding), tmp_path / "ep2", timeout=420)
    ranks = read_results(tmp_path / "ep2" / "res", 2)
    assert [r["injected"] for r in ranks] == [False, True]  # expert 2 lives on ep rank 1 only
    for r in [ref] + ranks:
        assert r["params_finite"]
        assert r["skipped_steps"] == [0, 0, 1, 1]
        assert r["loss_scales"] == [1024.0, 1024.0, 512.0, 512.0]
        assert not r["grad_norms"][INJECT_STEP - 1] < float("inf")
        for series in ("losses", "grad_norms"):
            keep = [i for i in range(4) if i != INJECT_STEP - 1]
            close([r[series][i] for i in keep], [ref[series][i] for i in keep], f"rank {r.get('rank')} {series}")
