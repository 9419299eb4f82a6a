"""Expert parallel through the public Trainer, against one process with the same global batch (8).

The model (``workers/moe_model.py``): embedding → ``paddletrainer.moe.MoELayer`` (4 experts, top-2, dropless,
aux and z-loss on) → lm head, its groups from ``paddletrainer.parallel.expert``. One launch per layout
(``workers/trainer_phases_worker.py``) checks on every rank: every step's loss and grad norm, ``evaluate()`` on
13 samples against the loss computed sample by sample, the step-3 checkpoint resumed with ``max_steps`` 6 in the
same layout and the one-process checkpoint resumed in this layout (both on the one-process 6-step curve); then the
layout's checkpoint resumed in one process.
"""
from __future__ import annotations

import pytest

from launcher import launch, read_results, run_single
from trainer_phases import GLOBAL_BATCH, RTOL, WORKER, assert_curve, phase_args


@pytest.fixture(scope="module")
def moe_reference(tmp_path_factory):
    """One process, global batch 8: the short run (with its checkpoint), the resume, the uninterrupted curve."""
    base = tmp_path_factory.mktemp("moe_one")
    run_single(WORKER, phase_args("moe", base / "out", base / "res", None, per_device_train_batch_size=4,
                                  direct_eval=True, uninterrupted=True))
    ref = read_results(base / "res", 1)[0]
    return ref, base / "out" / "short" / "checkpoint-3"


def test_one_process_moe_reference_resumes_bit_exact(moe_reference):
    ref, _ = moe_reference
    assert ref["extended"]["losses"] == ref["uninterrupted"]["losses"]
    assert ref["extended"]["grad_norms"] == ref["uninterrupted"]["grad_norms"]
    assert ref["short"]["eval_loss"] == pytest.approx(ref["short"]["direct_eval_loss"], rel=1e-6)


def test_ep2_trains_evaluates_and_resumes_like_one_process_and_its_checkpoint_resumes_in_one_process(
        tmp_path, moe_reference):
    ref, one_process_checkpoint = moe_reference
    options = dict(per_device_train_batch_size=GLOBAL_BATCH // (2 * 2), expert_parallel_degree=2)
    launch(WORKER, 2, phase_args("moe", tmp_path / "out", tmp_path / "res", None,
                                 foreign_checkpoint=one_process_checkpoint, **options), tmp_path, timeout=420)
    for r in read_results(tmp_path / "res", 2):
        at = f"ep2 rank {r['rank']}"
        assert_curve(r["short"], ref["short"], 3, f"{at} short run")
        assert r["short"]["eval_loss"] == pytest.approx(ref["short"]["direct_eval_loss"], rel=RTOL), at
        assert_curve(r["extended"], ref["uninterrupted"], 6, f"{at} resumed with max_steps 6")
        assert_curve(r["foreign"], ref["uninterrupted"], 6, f"{at} one-process checkpoint resumed")
    run_single(WORKER, phase_args("moe", tmp_path / "one", tmp_path / "one_res", None, per_device_train_batch_size=4,
                                  foreign_checkpoint=tmp_path / "out" / "short" / "checkpoint-3", extended_steps=6))
    r = read_results(tmp_path / "one_res", 1)[0]
    assert_curve(r["foreign"], ref["uninterrupted"], 6, "ep2 checkpoint resumed in one process")
