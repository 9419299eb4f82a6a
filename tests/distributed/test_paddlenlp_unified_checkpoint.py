"""A PaddleNLP unified checkpoint written by a 2-process PaddleNLP run (dp2, ``--unified_checkpoint true``) resumes
in our Trainer under its own layout and resharded (tp2) on PaddleNLP's own resumed losses.

``workers/paddlenlp_unified_worker.py`` runs either Trainer on the tiny Llama with the same sequential batches;
the one-process checkpoint is covered by ``tests/unit/test_paddlenlp_unified.py``. CI resumes it resharded (tp2,
≈ 2 min with the PaddleNLP runs); under its own layout (dp2) with ``PT_FULL_MATRIX=1`` (one more launch, ≈ 35 s).
"""
from __future__ import annotations

import os

import numpy as np
import pytest

from launcher import launch, read_results, run_single

WORKER = "paddlenlp_unified_worker.py"
pytest.importorskip("paddlenlp.trainer")


@pytest.fixture(scope="module")
def paddlenlp_dp2(tmp_path_factory):
    """PaddleNLP's dp2 run saving unified checkpoint-3, and PaddleNLP resuming it in one process (the reference)."""
    work = tmp_path_factory.mktemp("nlp_dp2")
    launch(WORKER, 2, ["theirs", work / "nlp", work / "saved", "-", "--per_device_train_batch_size", 1], work)
    checkpoint = work / "nlp" / "checkpoint-3"
    assert (checkpoint / "optimizer.safetensors.index.json").is_file()
    assert not list(checkpoint.glob("*.pdparams"))[1:]  # only scheduler.pdparams: the tensors are safetensors
    run_single(WORKER, ["theirs", work / "nlp_resumed", work / "resumed", checkpoint,
                        "--per_device_train_batch_size", 2])
    reference = read_results(work / "resumed", 1)[0]
    assert sorted(reference["losses"], key=int) == ["4", "5", "6"]
    return checkpoint, reference["losses"]


FULL_ONLY = pytest.mark.skipif(os.environ.get("PT_FULL_MATRIX") != "1", reason="full matrix only: PT_FULL_MATRIX=1")


@pytest.mark.parametrize("layout", [
    pytest.param(["--per_device_train_batch_size", 1], id="dp2", marks=FULL_ONLY),  # the layout that wrote it
    pytest.param(["--per_device_train_batch_size", 2, "--tensor_parallel_degree", 2], id="tp2")])
def test_a_dp2_paddlenlp_unified_checkpoint_resumes_on_paddlenlp_resumed_losses(tmp_path, paddlenlp_dp2, layout):
    checkpoint, expected = paddlenlp_dp2
    launch(WORKER, 2, ["ours", tmp_path / "out", tmp_path / "res", checkpoint, *layout], tmp_path)
    for rank in read_results(tmp_path / "res", 2):
        assert rank["global_step"] == 6
        assert sorted(rank["losses"], key=int) == ["4", "5", "6"]
        np.testing.assert_allclose([rank["losses"][s] for s in "456"], [expected[s] for s in "456"], rtol=0, atol=1e-5)
