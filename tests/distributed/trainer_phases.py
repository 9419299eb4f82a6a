"""Arguments and assertions of the ``trainer_phases_worker.py`` launches (layout matrix, two nodes)."""
from __future__ import annotations

import pytest

WORKER = "trainer_phases_worker.py"
RTOL = 1e-5
GLOBAL_BATCH, GA = 8, 2


def phase_args(model, out, result_dir, weights, **options):
    base = dict(model=model, output_dir=out, result_dir=result_dir, max_steps=3, save_steps=3, logging_steps=1,
                learning_rate=0.01 if model == "llama" else 0.05, max_grad_norm=0.8 if model == "llama" else 5.0,
                lr_scheduler_type="constant", seed=7, disable_tqdm=True, report_to="none",
                per_device_eval_batch_size=2, gradient_accumulation_steps=GA, dataloader_drop_last=False)
    if model == "llama":
        base["weights"] = weights
    base.update(options)
    args = []
    for key, value in base.items():
        args += [f"--{key}", str(value)]
    return args


def close(actual, expected, what, rtol=RTOL, atol=1e-7):
    assert len(actual) == len(expected), f"{what}: {len(actual)} values vs {len(expected)}"
    for i, (a, e) in enumerate(zip(actual, expected)):
        assert a == pytest.approx(e, rel=rtol, abs=atol), f"{what}[{i}]: {a} vs {e}"


def assert_curve(phase, reference_phase, steps, what):
    assert phase["global_step"] == phase["max_steps"] == len(phase["losses"]) == steps, what
    close(phase["losses"], reference_phase["losses"][:steps], f"{what} losses")
    close(phase["grad_norms"], reference_phase["grad_norms"][:steps], f"{what} grad norms")


def assert_predictions(predicted, reference_predicted, what):
    assert predicted["shape"][0] == 13 and predicted["shape"] == reference_predicted["shape"], what
    close(predicted["mean_abs"], reference_predicted["mean_abs"], f"{what} per-sample mean |prediction|")
    close(predicted["first"], reference_predicted["first"], f"{what} per-sample first value", atol=1e-6)
    if "per_position" in reference_predicted:  # sequence outputs: every position where one process has it
        close(predicted["per_position"], reference_predicted["per_position"], f"{what} per-position mean |prediction|")


def assert_finetune(result, reference, what):
    """Every fine-tuning phase of one rank (``finetune``, ``finetune_ga<n>``) against one process holding the whole
    global batch in one micro-batch: each logged loss and grad norm, and the eval loss (token means, 1e-5)."""
    phases = [name for name in result if name.startswith("finetune")]
    assert phases, f"{what}: no fine-tuning phase ran"
    for name in phases:
        assert_curve(dict(result[name], global_step=3, max_steps=3), reference, 3, f"{what} {name}")
        assert result[name]["eval_loss"] == pytest.approx(reference["eval_loss"], rel=RTOL), f"{what} {name} eval loss"


def assert_packed(result, reference, what):
    """Both packed-row phases of one rank (``packed_startend``, ``packed_attention_mask``) against one process: each
    logged loss and grad norm, and the eval loss (1e-5)."""
    phases = [name for name in reference if name.startswith("packed_")]
    assert len(phases) == 2, f"the reference ran {phases}"
    for name in phases:
        assert name in result, f"{what}: no {name} phase ran"
        assert_curve(dict(result[name], global_step=3, max_steps=3), reference[name], 3, f"{what} {name}")
        assert result[name]["eval_loss"] == pytest.approx(reference[name]["eval_loss"], rel=RTOL), f"{what} {name}"
