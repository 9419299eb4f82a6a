"""A user's own optimizer — two parameter groups (their own learning rate and weight decay), frozen layers, and
no clip / the optimizer's ``grad_clip`` / a ``grad_clip`` per group — trains on every layout as PaddleNLP's own
Trainer trains it in one process (losses and eval loss within 1e-5).

One launch per layout runs all three clip variants (``workers/user_optimizer_worker.py``); the reference is
PaddleNLP's Trainer on one process, run once per session. Sharding stage 1 refuses parameter groups before any
process group exists (``tests/unit/test_user_optimizer_clip.py``).
"""
from __future__ import annotations

import pytest

from launcher import launch, read_results, run_single

WORKER = "user_optimizer_worker.py"
COMMON = ["--max_steps", "5", "--logging_steps", "1", "--save_strategy", "no", "--seed", "42", "--report_to", "none",
          "--disable_tqdm", "true", "--gradient_accumulation_steps", "2"]
# per-device batches giving the reference's global batch of 8 (4 × GA 2 in one process)
LAYOUTS = {
    "dp2": ["--per_device_train_batch_size", "2", "--per_device_eval_batch_size", "2"],
    "stage2x2": ["--per_device_train_batch_size", "2", "--per_device_eval_batch_size", "2",
                 "--sharding", "stage2", "--sharding_parallel_degree", "2"],
    "stage3x2": ["--per_device_train_batch_size", "2", "--per_device_eval_batch_size", "2",
                 "--sharding", "stage3", "--sharding_parallel_degree", "2"],
    "tp2": ["--per_device_train_batch_size", "4", "--per_device_eval_batch_size", "4", "--tensor_parallel_degree", "2"],
    "pp2": ["--per_device_train_batch_size", "4", "--per_device_eval_batch_size", "4",
            "--pipeline_parallel_degree", "2"],
}


@pytest.fixture(scope="module")
def paddlenlp_reference(tmp_path_factory, llama_weights):
    """PaddleNLP's Trainer, one process, the same model, data, seed and optimizers."""
    out = tmp_path_factory.mktemp("user_optimizer_paddlenlp")
    run_single(WORKER, ["--implementation", "paddlenlp", "--weights", llama_weights, "--result_dir", out,
                        "--output_dir", out / "run", "--per_device_train_batch_size", "4",
                        "--per_device_eval_batch_size", "4", *COMMON])
    return read_results(out, 1)[0]


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_user_optimizer_with_groups_and_clip_matches_paddlenlp_one_process(layout, tmp_path, llama_weights,
                                                                           paddlenlp_reference):
    out = tmp_path / "result"
    launch(WORKER, 2, ["--implementation", "paddletrainer", "--weights", llama_weights, "--result_dir", out,
                       "--output_dir", tmp_path / "run", *COMMON, *LAYOUTS[layout]], tmp_path, timeout=420)
    for rank, result in enumerate(read_results(out, 2)):
        for variant, expected in paddlenlp_reference.items():
            got = result[variant]
            assert len(got["losses"]) == len(expected["losses"]) == 5, (layout, variant, rank)
            errors = [abs(a - b) for a, b in zip(got["losses"], expected["losses"])]
            assert max(errors) < 1e-5, f"{layout} {variant} rank {rank}: losses {got['losses']} vs {expected['losses']}"
            assert abs(got["eval_loss"] - expected["eval_loss"]) < 1e-5, (layout, variant, rank)
    # the variants differ from each other, so each clip really acted
    ref = paddlenlp_reference
    assert ref["none"]["losses"] != ref["optimizer"]["losses"] != ref["per_group"]["losses"]
