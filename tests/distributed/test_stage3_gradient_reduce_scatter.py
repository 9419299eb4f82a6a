"""Sharding stage 3 reduces each sliced gradient with a reduce-scatter into this rank's slice — never an
all-reduce of the whole gradient, which Paddle 3.3.1's ``GroupShardedStage3`` does (2× the traffic with NCCL)
— and still trains exactly as one process does (the Trainer, end to end, on real launches)."""
from __future__ import annotations

import pytest

from launcher import launch, read_results, run_single
from trainer_phases import close

WORKER = "stage3_collectives_worker.py"
REFERENCE = "trainer_worker.py"
STEPS, GA = 3, 2


def args(model, out, res, weights, **options):
    base = dict(model=model, output_dir=out, result_dir=res, max_steps=STEPS, logging_steps=1, save_strategy="no",
                learning_rate=0.01 if model == "llama" else 0.05, max_grad_norm=0.8 if model == "llama" else 5.0,
                lr_scheduler_type="constant", seed=7, disable_tqdm=True, report_to="none",
                gradient_accumulation_steps=GA, per_device_eval_batch_size=4, dataloader_drop_last=False)
    if model == "llama":
        base["weights"] = weights
    base.update(options)
    return [item for key, value in base.items() for item in (f"--{key}", str(value))]


@pytest.mark.parametrize("model,nproc,layout", [
    # every Llama weight matrix sliced (> 1000 elements), the norms whole
    pytest.param("llama", 2, dict(sharding_parallel_degree=2, sharding_stage3_segment_size=1000), id="llama-s3x2"),
    # dp on top: the reduced slice (not the whole gradient) is then all-reduced over dp
    pytest.param("mlp", 4, dict(sharding_parallel_degree=2, sharding_stage3_segment_size=100), id="mlp-dp2-s3x2"),
])
def test_stage3_reduce_scatters_each_sliced_gradient_and_trains_like_one_process(
    tmp_path, llama_weights, model, nproc, layout
):
    run_single(REFERENCE, args(model, tmp_path / "ref_out", tmp_path / "ref", llama_weights,
                               per_device_train_batch_size=4))
    ref = read_results(tmp_path / "ref", 1)[0]
    per_device = 8 // (GA * nproc)
    launch(WORKER, nproc, args(model, tmp_path / "out", tmp_path / "res", llama_weights, sharding="stage3",
                               per_device_train_batch_size=per_device, **layout), tmp_path)
    for r in read_results(tmp_path / "res", nproc):
        counts = r["stage3_gradient_collectives"]
        assert counts["sliced_params"] > 0, "nothing was sliced: the test would prove nothing"
        # one reduce-scatter per sliced parameter and backward (GA micro-batches per step), each delivering one slice
        assert counts["reduce_scatter"] == counts["sliced_params"] * GA * STEPS, counts
        assert counts["reduce_scatter_output_is_one_slice"], counts
        assert counts["all_reduce"] == 0, f"a full stage-3 gradient was all-reduced: {counts}"
        # the same training as one process: every step's loss and grad norm, and the trained weights' eval loss
        close(r["losses"], ref["losses"], "losses")
        close(r["grad_norms"], ref["grad_norms"], "grad norms")
        assert r["eval_loss"] == pytest.approx(ref["eval_loss"], rel=1e-5)
        assert len(r["losses"]) == STEPS
