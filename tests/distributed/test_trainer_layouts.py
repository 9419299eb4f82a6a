"""The Trainer, end to end, on real multi-process CPU launches: same losses as one process, logs, resume.

Each launch runs ``workers/trainer_worker.py`` (PdArgumentParser → TrainingArguments → Trainer) and
several claims are checked from its outputs.
"""
from __future__ import annotations

import glob
import json
import os

import pytest

from launcher import launch, read_results, run_single
from trainer_phases import assert_finetune

WORKER = "trainer_worker.py"
STARTUP_KEYS = {f"startup/{phase}" for phase in
                ("import", "topology", "model", "optimizer", "wrap", "first_batch", "first_step", "other", "total")}
RTOL = 1e-5


def trainer_args(out_dir, result_dir, **options):
    base = dict(model="mlp", output_dir=out_dir, result_dir=result_dir, max_steps=4, logging_steps=1,
                learning_rate=0.05, seed=7, disable_tqdm=True, report_to="visualdl", save_steps=2,
                per_device_eval_batch_size=4, dataloader_drop_last=False)
    base.update(options)
    args = []
    for key, value in base.items():
        args += [f"--{key}", str(value)]
    return args


def assert_close_lists(actual, expected, rtol=RTOL, what="values"):
    assert len(actual) == len(expected), f"{what}: {len(actual)} vs {len(expected)}"
    for i, (a, e) in enumerate(zip(actual, expected)):
        assert a == pytest.approx(e, rel=rtol, abs=1e-7), f"{what}[{i}]: {a} vs {e}"


def visualdl_scalars(logging_root, tag):
    from visualdl import LogReader

    files = glob.glob(os.path.join(logging_root, "**", "vdlrecords.*.log"), recursive=True)
    assert len(files) == 1, f"expected exactly one VisualDL writer for the run, found {files}"
    reader = LogReader(file_path=files[0])
    return [r.value for r in reader.get_data("scalar", tag)]


@pytest.fixture(scope="module")
def single_mlp(tmp_path_factory):
    """One process, per-device batch 8: the reference run (checkpoints at steps 2 and 4)."""
    work = tmp_path_factory.mktemp("trainer_single")
    run_single(WORKER, trainer_args(work / "out", work / "res", per_device_train_batch_size=8))
    return work, read_results(work / "res", 1)[0]


def test_trainer_dp2_losses_grad_norms_and_eval_match_single_process_and_visualdl_logs_them(tmp_path, single_mlp):
    _, ref = single_mlp
    launch(WORKER, 2, trainer_args(tmp_path / "out", tmp_path / "res", per_device_train_batch_size=4,
                                   logging_dir=tmp_path / "vdl", metrics_output_path=tmp_path / "json"), tmp_path)
    ranks = read_results(tmp_path / "res", 2)
    for r in ranks:
        assert_close_lists(r["losses"], ref["losses"], what="loss")
        assert_close_lists(r["grad_norms"], ref["grad_norms"], what="grad_norm")
        assert r["eval_loss"] == pytest.approx(ref["eval_loss"], rel=RTOL)
    # one VisualDL writer for the whole run, and it holds the global-mean loss (float32 precision)
    assert_close_lists(visualdl_scalars(tmp_path / "vdl", "train/loss"), ranks[0]["losses"], rtol=1e-6, what="vdl loss")
    assert len(visualdl_scalars(tmp_path / "vdl", "startup/total")) == 1
    for rank in range(2):  # every rank reports its start once, with every phase, before its first log
        rows = [json.loads(line) for line in (tmp_path / "json" / f"metrics_rank{rank}.json").read_text().splitlines()]
        (startup,) = [row for row in rows if "startup/total" in row]
        assert STARTUP_KEYS <= set(startup) and rows.index(startup) < [("train/loss" in r) for r in rows].index(True)
        assert startup["startup/topology"] > 0 and startup["startup/first_step"] > 0


def test_trainer_gradient_accumulation2_with_dp2_matches_single_process(tmp_path, single_mlp):
    _, ref = single_mlp
    launch(WORKER, 2, trainer_args(tmp_path / "out", tmp_path / "res", per_device_train_batch_size=2,
                                   gradient_accumulation_steps=2, report_to="none"), tmp_path)
    for r in read_results(tmp_path / "res", 2):
        assert_close_lists(r["losses"], ref["losses"], what="loss")
        assert_close_lists(r["grad_norms"], ref["grad_norms"], what="grad_norm")


def test_resume_single_process_checkpoint_under_dp2_continues_the_same_loss_curve(tmp_path, single_mlp):
    work, ref = single_mlp
    ckpt = work / "out" / "checkpoint-2"
    assert (ckpt / ".checkpoint_complete").exists()
    launch(WORKER, 2, trainer_args(tmp_path / "out", tmp_path / "res", per_device_train_batch_size=4,
                                   resume_from_checkpoint=ckpt, report_to="none"), tmp_path)
    for r in read_results(tmp_path / "res", 2):
        assert r["global_step"] == 4 and r["consumed_samples"] == 32
        # the log history is restored from the checkpoint and continues: steps 1-2 as saved, 3-4 newly trained
        assert_close_lists(r["losses"][:2], ref["losses"][:2], rtol=0, what="restored loss history")
        assert_close_lists(r["losses"][2:], ref["losses"][2:], what="resumed loss")
        assert r["eval_loss"] == pytest.approx(ref["eval_loss"], rel=RTOL)


# ------------------------------------------------------------------------------------------ tiny Llama
def llama_args(out_dir, result_dir, weights, **options):
    """Global batch 8 = per-device batch × 2 accumulation steps × data ranks."""
    base = dict(model="llama", weights=weights, num_samples=48, per_device_train_batch_size=4,
                gradient_accumulation_steps=2, learning_rate=0.01, max_grad_norm=0.8, report_to="none")
    base.update(options)
    return trainer_args(out_dir, result_dir, **base)


@pytest.fixture(scope="module")
def single_llama(tmp_path_factory, llama_weights):
    work = tmp_path_factory.mktemp("trainer_single_llama")
    run_single(WORKER, llama_args(work / "out", work / "res", llama_weights))
    return work, read_results(work / "res", 1)[0]


def assert_matches(ranks, ref, resumed_from=0):
    for r in ranks:
        assert_close_lists(r["losses"][resumed_from:], ref["losses"][resumed_from:], what="loss")
        assert_close_lists(r["grad_norms"][resumed_from:], ref["grad_norms"][resumed_from:], what="grad_norm")
        assert r["eval_loss"] == pytest.approx(ref["eval_loss"], rel=RTOL)
        # compute_metrics saw the same logits (under pipeline parallel too: broadcast from the last stage)
        assert ref["eval_metrics"] and r["eval_metrics"].keys() == ref["eval_metrics"].keys()
        for key, value in ref["eval_metrics"].items():
            assert r["eval_metrics"][key] == pytest.approx(value, rel=RTOL), key
        # predict() without labels: the logits of every sample, in dataset order (6 samples: padded batches)
        assert r["predicted"]["shape"] == ref["predicted"]["shape"] == [6, 16, ref["predicted"]["shape"][2]]
        assert_close_lists(r["predicted"]["row_mean_abs"], ref["predicted"]["row_mean_abs"], what="predicted logits")


def test_trainer_tp2_pp2_llama_matches_single_process_and_its_checkpoint_resumes_in_dp2_and_one_process(
    tmp_path, single_llama, llama_weights
):
    _, ref = single_llama
    tp_pp = tmp_path / "tp2pp2"
    launch(WORKER, 4, llama_args(tp_pp / "out", tp_pp / "res", llama_weights,
                                 tensor_parallel_degree=2, pipeline_parallel_degree=2), tp_pp)
    assert_matches(read_results(tp_pp / "res", 4), ref)

    ckpt = tp_pp / "out" / "checkpoint-2"
    dp2 = tmp_path / "dp2"
    launch(WORKER, 2, llama_args(dp2 / "out", dp2 / "res", llama_weights, per_device_train_batch_size=2,
                                 resume_from_checkpoint=ckpt), dp2)
    assert_matches(read_results(dp2 / "res", 2), ref, resumed_from=2)

    one = tmp_path / "one"
    run_single(WORKER, llama_args(one / "out", one / "res", llama_weights, resume_from_checkpoint=ckpt))
    assert_matches(read_results(one / "res", 1), ref, resumed_from=2)


def test_trainer_sharding_stage2_llama_matches_single_process_and_resumes_under_pp2(
    tmp_path, single_llama, finetune_reference, llama_weights
):
    """stage2×2 and pp2 against one process, then on fine-tuning documents (``--finetune``) against one process
    holding the global batch in one micro-batch (the token mean, ``trainer_phases.assert_finetune``)."""
    _, ref = single_llama
    st2 = tmp_path / "stage2"
    launch(WORKER, 2, llama_args(st2 / "out", st2 / "res", llama_weights, per_device_train_batch_size=2,
                                 sharding="stage2", sharding_parallel_degree=2, finetune="own"), st2)
    assert_matches(read_results(st2 / "res", 2), ref)

    pp2 = tmp_path / "pp2"
    launch(WORKER, 2, llama_args(pp2 / "out", pp2 / "res", llama_weights, pipeline_parallel_degree=2,
                                 resume_from_checkpoint=st2 / "out" / "checkpoint-2", finetune="own"), pp2)
    assert_matches(read_results(pp2 / "res", 2), ref, resumed_from=2)
    for name, results in (("stage2x2", read_results(st2 / "res", 2)), ("pp2", read_results(pp2 / "res", 2))):
        for rank, r in enumerate(results):
            assert_finetune(r, finetune_reference, f"{name} rank {rank}")


def test_trainer_stage3_offload_llama_matches_single_process_and_checkpoints_resume_both_ways(
    tmp_path, single_llama, llama_weights
):
    # weight matrices sliced (segment 1000 elements), norms whole: both kinds of offload master weight
    work, ref = single_llama
    stage3 = dict(per_device_train_batch_size=2, sharding="stage3 offload", sharding_parallel_degree=2,
                  sharding_stage3_segment_size=1000)
    offload = tmp_path / "offload"
    launch(WORKER, 2, llama_args(offload / "out", offload / "res", llama_weights, **stage3), offload)
    assert_matches(read_results(offload / "res", 2), ref)

    # its checkpoint (slices + host master weights) continues in one process ...
    one = tmp_path / "one"
    run_single(WORKER, llama_args(one / "out", one / "res", llama_weights,
                                  resume_from_checkpoint=offload / "out" / "checkpoint-2"))
    assert_matches(read_results(one / "res", 1), ref, resumed_from=2)

    # ... and a one-process checkpoint (no master weights) continues under stage3 offload
    back = tmp_path / "back"
    launch(WORKER, 2, llama_args(back / "out", back / "res", llama_weights, **stage3,
                                 resume_from_checkpoint=work / "out" / "checkpoint-2"), back)
    assert_matches(read_results(back / "res", 2), ref, resumed_from=2)
