"""DPO (``paddletrainer.trl.DPOTrainer``) on parallel layouts against one process holding the whole global
batch (8 rows of 1-2 packed pairs) in one micro-batch: every step's logged loss and DPO metrics (rewards,
accuracies, margins, log-probs), the eval metrics and predict's loss agree to 1e-5 — the loss is the mean over the
global batch's pairs on every layout, the reference model runs on the layout too (vocabulary-parallel log-probs
under tp; through the pipeline under pp, whose last stage computes the DPO loss, micro-batches of unequal pair
counts weighted by their pairs; under sep2 each rank holds half of every row, the preference mask and the
positions whole, and the pairs' log-prob sums cross the halves). CI runs dp2, tp2, pp2·GA2 and sep2;
``PT_FULL_MATRIX=1`` adds dp2·GA2, sharding stage2×2, reference-free pp2·GA2 and pp2·GA2 with a LoRA policy as its
own reference (its adapters off for the reference pass)."""
import os

import pytest

from launcher import launch, read_results, run_single

WORKER = "dpo_worker.py"
FULL = os.environ.get("PT_FULL_MATRIX") == "1"
FULL_ONLY = [pytest.mark.full_matrix] + ([] if FULL else [pytest.mark.skip(reason="full matrix only: PT_FULL_MATRIX=1")])
COMMON = dict(max_steps=4, logging_steps=1, learning_rate=0.01, lr_scheduler_type="constant", seed=7,
              save_strategy="no", report_to="none", disable_tqdm="true", device="cpu", per_device_eval_batch_size=4,
              max_grad_norm=1.0)


def worker_args(out, weights, **options):
    args = ["--output_dir", out / "out", "--result_dir", out / "res", "--weights", weights]
    for key, value in {**COMMON, **options}.items():
        args += [f"--{key}", value]
    return args


@pytest.fixture(scope="module")
def one_process(tmp_path_factory, llama_weights):
    """``one_process(**options)``: the one-process result with the whole global batch in one micro-batch."""
    cache = {}

    def get(**options):
        key = tuple(sorted(options.items()))
        if key not in cache:
            out = tmp_path_factory.mktemp("dpo_one")
            run_single(WORKER, worker_args(out, llama_weights, per_device_train_batch_size=8, **options))
            cache[key] = read_results(out / "res", 1)[0]
        return cache[key]

    return get


def close(actual: dict, expected: dict, at: str):
    assert sorted(actual) == sorted(expected), at
    for key in expected:
        assert actual[key] == pytest.approx(expected[key], rel=1e-5, abs=1e-6), f"{at} {key}"


@pytest.mark.parametrize("name,nproc,options", [
    pytest.param("dp2", 2, dict(per_device_train_batch_size=4), id="dp2"),
    pytest.param("tp2", 2, dict(per_device_train_batch_size=8, tensor_parallel_degree=2), id="tp2"),
    pytest.param("pp2_ga2", 2, dict(per_device_train_batch_size=4, gradient_accumulation_steps=2,
                                    pipeline_parallel_degree=2), id="pp2_ga2"),
    pytest.param("sep2", 2, dict(per_device_train_batch_size=8, sep_parallel_degree=2), id="sep2"),
    pytest.param("dp2_ga2", 2, dict(per_device_train_batch_size=2, gradient_accumulation_steps=2), id="dp2_ga2",
                 marks=FULL_ONLY),
    pytest.param("s2x2", 2, dict(per_device_train_batch_size=4, sharding="stage2", sharding_parallel_degree=2),
                 id="s2x2", marks=FULL_ONLY),
    pytest.param("pp2_ga2_reference_free", 2, dict(per_device_train_batch_size=4, gradient_accumulation_steps=2,
                                                   pipeline_parallel_degree=2, reference_free="true"),
                 id="pp2_ga2_reference_free", marks=FULL_ONLY),
    # a LoRA policy (paddlenlp.peft) as its own reference: the reference pass runs through the policy's own
    # pipeline with its adapters off, then its 1F1B with them on
    pytest.param("pp2_ga2_lora_policy_as_reference", 2,
                 dict(per_device_train_batch_size=4, gradient_accumulation_steps=2, pipeline_parallel_degree=2,
                      lora_policy="true"),
                 id="pp2_ga2_lora_policy_as_reference", marks=FULL_ONLY),
])
def test_dpo_losses_and_metrics_on_a_layout_equal_one_process(tmp_path, llama_weights, one_process, name, nproc,
                                                                options):
    dpo_reference = one_process(**{k: v for k, v in options.items() if k in ("reference_free", "lora_policy")})
    launch(WORKER, nproc, worker_args(tmp_path, llama_weights, **options), tmp_path, timeout=300)
    assert len(dpo_reference["steps"]) == 4
    for r in read_results(tmp_path / "res", nproc):
        at = f"{name} rank {r['rank']}"
        assert len(r["steps"]) == 4, at
        for step, (mine, ref) in enumerate(zip(r["steps"], dpo_reference["steps"]), 1):
            close(mine, ref, f"{at} step {step}")
        close(r["eval"], dpo_reference["eval"], f"{at} eval")
        assert r["test_loss"] == pytest.approx(dpo_reference["eval"]["eval_loss"], rel=1e-5), f"{at} predict"
