"""A PaddleNLP unified checkpoint written by a 2-process PaddleNLP run (dp2, ``--unified_checkpoint true``) resumes
in our Trainer under its own layout and resharded (tp2) on PaddleNLP's own resumed losses; so do, in the same tp2
processes, PaddleNLP's checkpoints of a ``paddlenlp.peft.LoRAModel``: its default format written under tp2
(``lora_model_state.pdparams`` merged, ``optimizer.tp0X.pdopt``; a non-unified checkpoint resumes in the layout
that wrote it, in PaddleNLP too) and its unified format written by one process (``peft_model.safetensors``,
resharded to tp2).

``workers/paddlenlp_unified_worker.py`` runs either Trainer on the tiny Llama with the same sequential batches;
the one-process checkpoints are covered by ``tests/unit/test_paddlenlp_unified.py`` and
``test_paddlenlp_lora_checkpoint.py``. CI resumes them under tp2 (≈ 2 min with the PaddleNLP dp2 runs; the PaddleNLP
LoRA runs and the LoRA resumes add ≈ 1.5 min: a tp2 launch, one process, two resumes in the tp2 launch); the dp2 checkpoint under its own layout (dp2) with ``PT_FULL_MATRIX=1`` (one
more launch, ≈ 35 s). PaddleNLP's tp2 LoRA run uses our gloo fills for the tensor-parallel ops Paddle's CPU build
lacks (the worker says why).
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


@pytest.fixture(scope="module")
def paddlenlp_lora(tmp_path_factory, llama_weights):
    """PaddleNLP's LoRA checkpoint-3 in both formats, each with PaddleNLP's own resumed losses (same processes):
    ``{format: (checkpoint, {step: loss})}``; default written under tp2, unified by one process."""
    work = tmp_path_factory.mktemp("nlp_lora")
    lora = ["--lora_base", llama_weights, "--then_resume", "true", "--per_device_train_batch_size", 2]
    launch(WORKER, 2, ["theirs", work / "tp2", work / "tp2_res", "-", *lora, "--unified_checkpoint", "false",
                       "--tensor_parallel_degree", 2], work)
    run_single(WORKER, ["theirs", work / "one", work / "one_res", "-", *lora])
    default, unified = work / "tp2" / "checkpoint-3", work / "one" / "checkpoint-3"
    assert (default / "lora_model_state.pdparams").is_file() and (default / "optimizer.tp01.pdopt").is_file()
    assert (unified / "peft_model.safetensors.index.json").is_file()
    return {"default": (default, read_results(work / "tp2_res", 2)[0]["resumed_losses"]),
            "unified": (unified, read_results(work / "one_res", 1)[0]["resumed_losses"])}


def _check_resumed(result, expected):
    assert result["global_step"] == 6
    assert sorted(result["losses"], key=int) == sorted(expected, key=int) == ["4", "5", "6"]
    np.testing.assert_allclose([result["losses"][s] for s in "456"], [expected[s] for s in "456"], rtol=0, atol=1e-5)


FULL_ONLY = pytest.mark.skipif(os.environ.get("PT_FULL_MATRIX") != "1", reason="full matrix only: PT_FULL_MATRIX=1")


@FULL_ONLY
def test_a_dp2_paddlenlp_unified_checkpoint_resumes_in_its_own_layout_on_paddlenlp_resumed_losses(tmp_path,
                                                                                                   paddlenlp_dp2):
    checkpoint, expected = paddlenlp_dp2
    launch(WORKER, 2, ["ours", tmp_path / "out", tmp_path / "res", checkpoint, "--per_device_train_batch_size", 1],
           tmp_path)
    for rank in read_results(tmp_path / "res", 2):
        _check_resumed(rank, expected)


def test_paddlenlp_unified_and_lora_checkpoints_resume_under_tp2_on_paddlenlp_resumed_losses(
        tmp_path, paddlenlp_dp2, paddlenlp_lora, llama_weights):
    checkpoint, expected = paddlenlp_dp2
    lora = ",".join(f"{form}={path}" for form, (path, _) in sorted(paddlenlp_lora.items()))
    launch(WORKER, 2, ["ours", tmp_path / "out", tmp_path / "res", checkpoint, "--per_device_train_batch_size", 2,
                       "--tensor_parallel_degree", 2, "--then_lora", lora, "--then_lora_base", llama_weights],
           tmp_path)
    for rank in read_results(tmp_path / "res", 2):
        _check_resumed(rank, expected)
        for form, (_, resumed) in paddlenlp_lora.items():
            _check_resumed(rank["lora"][form], resumed)
