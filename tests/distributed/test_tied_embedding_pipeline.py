"""PaddleNLP's GPT and Qwen2 with tied embeddings (``tie_word_embeddings=True``) under pipeline parallel.

Their ``...ForCausalLMPipe`` classes put the embedding on the first stage and the output projection, the same
weight, on the last (``SharedLayerDesc``); after the backward both stages hold the summed gradient. Each launch
trains both models for 6 steps with clipping at 1.0 (the one-process norms are above it on the first steps) and
checks against one process: every step's loss and grad norm, and the eval loss. A tied weight counted on both
stages makes the norm too large, so the clipped updates and with them the losses drift. GPT's Pipe class brings
no ``_prepare_pipeline_inputs_func``: the Trainer splits its dict batches itself (inputs first, labels last).
"""
from __future__ import annotations

import pytest

from checks import assert_matches_single_process
from launcher import launch, read_results, run_single

WORKER = "tied_pipe_worker.py"
MAX_NORM = 1.0
TRAINING = dict(max_steps=6, logging_steps=1, learning_rate=0.01, max_grad_norm=MAX_NORM, lr_scheduler_type="constant",
                seed=7, disable_tqdm=True, report_to="none", per_device_train_batch_size=2,
                per_device_eval_batch_size=2, gradient_accumulation_steps=4, save_strategy="no")


def worker_args(work_dir, weights, **options) -> list:
    values = dict(TRAINING, output_dir=work_dir / "out", result_dir=work_dir / "res", weights=weights, **options)
    return [part for key, value in values.items() for part in (f"--{key}", str(value))]


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    """The tiny models' weights (built and saved by the one-process run) and that run's result."""
    work = tmp_path_factory.mktemp("tied_one_process")
    weights = work / "weights"
    run_single(WORKER, worker_args(work, weights, save_weights=True))
    return weights, read_results(work / "res", 1)[0]


@pytest.mark.parametrize("layout", [
    pytest.param(dict(pipeline_parallel_degree=2), id="pp2"),
    pytest.param(dict(pipeline_parallel_degree=2, virtual_pipeline_model_parallel_size=2), id="pp2_vpp2"),
])
def test_tied_embedding_pipe_models_train_like_one_process(tmp_path, one_process, layout):
    weights, reference = one_process
    launch(WORKER, 2, worker_args(tmp_path, weights, **layout), tmp_path / "launch", timeout=300)
    results = read_results(tmp_path / "res", 2)
    for model in ("gpt", "qwen2"):
        assert_matches_single_process([dict(r[model], rank=r["rank"]) for r in results], reference[model], MAX_NORM)
