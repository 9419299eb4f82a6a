"""``nan_inf_policy=rollback`` on a dp2 launch: the loss of rank 0 alone turns NaN at a known step; both ranks take
the same decision (the global gradient norm is NaN everywhere), roll back to the newest checkpoint and skip the
samples trained on since it, and end on the curve of a one-process run that skipped the same window (built
independently: a normal resume from that checkpoint with its data position moved past the window)."""
from __future__ import annotations

import json
import zlib

import pytest

from launcher import launch, read_results, run_single

WORKER = "robust_train.py"
BAD_STEP, LAST_GOOD_SAVE, MAX_STEPS, GLOBAL_BATCH = 6, 4, 10, 8


def train_args(out_dir, result_dir, **options):
    base = dict(output_dir=out_dir, result_dir=result_dir, max_steps=MAX_STEPS, logging_steps=1, learning_rate=0.05,
                seed=7, disable_tqdm=True, report_to="none", save_steps=2, per_device_eval_batch_size=4,
                per_device_train_batch_size=GLOBAL_BATCH, lr_scheduler_type="linear", nan_inf_policy="rollback")
    base.update(options)
    args = []
    for key, value in base.items():
        args += [f"--{key}", str(value)]
    return args


def skip_window_reference(tmp_path):
    from paddletrainer.checkpoint import placement as L

    out, res = tmp_path / "ref_out", tmp_path / "ref_res"
    run_single(WORKER, train_args(out, res, stop_at_step=LAST_GOOD_SAVE), timeout=100)
    ckpt = out / f"checkpoint-{LAST_GOOD_SAVE}"
    data = json.dumps({"consumed_samples": BAD_STEP * GLOBAL_BATCH}).encode()
    (ckpt / L.DATA_STATE_NAME).write_bytes(data)
    index = json.loads((ckpt / L.INDEX_NAME).read_text())
    index["files"][L.DATA_STATE_NAME] = {"size": len(data), "crc32": zlib.crc32(data)}
    (ckpt / L.INDEX_NAME).write_text(json.dumps(index))
    run_single(WORKER, train_args(out, res, resume_from_checkpoint=ckpt), timeout=100)
    return read_results(res, 1)[0]


def test_a_nan_loss_on_one_rank_rolls_back_every_rank_and_ends_on_the_skipped_window_curve(tmp_path):
    reference = skip_window_reference(tmp_path)
    work = tmp_path / "dp2"
    launch(WORKER, 2, train_args(work / "out", work / "res", per_device_train_batch_size=GLOBAL_BATCH // 2,
                                 poison_step=BAD_STEP, poison_rank=0, collective_timeout_seconds=60),
           work, timeout=200)
    logs = {p.name: p.read_text(errors="replace") for p in (work / "logs").glob("workerlog.*")}
    for name, text in logs.items():
        assert f"step {BAD_STEP}: non-finite gradient norm; rolled back to" in text, f"{name} did not roll back"
    for r in read_results(work / "res", 2):
        assert r["global_step"] == MAX_STEPS
        assert r["losses"] == pytest.approx(reference["losses"], rel=1e-5)
        assert r["eval_loss"] == pytest.approx(reference["eval_loss"], rel=1e-5)
