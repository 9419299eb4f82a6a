"""Interruptions on real multi-process launches: SIGTERM saves and stops every rank together; a rank that never
reaches a collective is turned into an error by the watchdog instead of a hang.

Each launch takes the machine-wide lock (``/tmp/paddletrainer-mp.lock``) and a hard timeout, as
``launcher.launch`` does; here the launch runs in the background so the test can signal its workers.
"""
from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from launcher import LOCK, PYTHON, WORKERS, _env, _log_tails, launch, read_results, run_single

WORKER = "robust_train.py"
LOSS_RTOL = 1e-5


def train_args(out_dir, result_dir, **options):
    base = dict(output_dir=out_dir, result_dir=result_dir, max_steps=8, logging_steps=1, learning_rate=0.05, seed=7,
                disable_tqdm=True, report_to="none", save_steps=1000, per_device_eval_batch_size=4,
                dataloader_drop_last=False, collective_timeout_seconds=60)
    base.update(options)
    args = []
    for key, value in base.items():
        args += [f"--{key}", str(value)]
    return args


def start_launch(worker, nproc, worker_args, work_dir: Path, timeout: int):
    log_dir = work_dir / "logs"
    cmd = ["flock", "-w", str(timeout), LOCK, "timeout", str(timeout), PYTHON, "-m", "paddle.distributed.launch",
           "--nproc_per_node", str(nproc), "--log_dir", str(log_dir), str(WORKERS / worker), *map(str, worker_args)]
    proc = subprocess.Popen(cmd, cwd=str(WORKERS), env=_env(timeout), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    return proc, log_dir


def last_step(progress_dir: Path, rank: int) -> int:
    path = progress_dir / f"rank{rank}.steps"
    if not path.exists():
        return 0
    lines = path.read_text().split()
    return int(lines[-1]) if lines else 0


def test_sigterm_on_a_dp2_trainer_saves_one_checkpoint_on_all_ranks_and_resuming_matches_an_uninterrupted_run(tmp_path):
    ref = tmp_path / "ref"
    run_single(WORKER, train_args(ref / "out", ref / "res", per_device_train_batch_size=8), timeout=110)
    reference = read_results(ref / "res", 1)[0]

    work, progress = tmp_path / "run", tmp_path / "run" / "progress"
    proc, log_dir = start_launch(WORKER, 2, train_args(work / "out", work / "res", per_device_train_batch_size=4,
                                                       progress_dir=progress, step_sleep=0.5), work, timeout=110)
    try:
        deadline = time.time() + 100
        while time.time() < deadline and min(last_step(progress, 0), last_step(progress, 1)) < 2:
            assert proc.poll() is None, f"the launch ended early:\n{proc.stdout.read()}\n{_log_tails(log_dir)}"
            time.sleep(0.05)
        assert min(last_step(progress, 0), last_step(progress, 1)) >= 2, "the workers never reached step 2"
        for rank in (0, 1):  # a scheduler's pre-emption: every worker gets SIGTERM
            os.kill(int((progress / f"rank{rank}.pid").read_text()), signal.SIGTERM)
        output, _ = proc.communicate(timeout=100)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0, "an interrupted run must not exit 0"
    logs = _log_tails(log_dir, lines=200)
    assert "training interrupted by SIGTERM at step" in logs, logs + output
    assert "Traceback" not in logs, logs

    from paddletrainer.checkpoint import list_complete_checkpoints

    complete = list_complete_checkpoints(str(work / "out"))
    assert len(complete) == 1, complete  # save_steps=1000: the only checkpoint is the stop checkpoint
    step = int(complete[0].rsplit("-", 1)[1])
    assert 2 <= step < 8
    assert f"at step {step}; checkpoint saved to" in logs
    for rank in (0, 1):
        assert last_step(progress, rank) == step, "both ranks stopped at the same step"

    launch(WORKER, 2, train_args(work / "out", work / "res", per_device_train_batch_size=4,
                                 resume_from_checkpoint=complete[0]), tmp_path / "resume", timeout=110)
    for r in read_results(work / "res", 2):
        assert r["global_step"] == 8
        assert r["losses"] == pytest.approx(reference["losses"], rel=LOSS_RTOL)
        assert r["eval_loss"] == pytest.approx(reference["eval_loss"], rel=LOSS_RTOL)


def test_a_rank_that_never_reaches_the_collective_becomes_an_error_naming_the_other_rank_phase_and_step(tmp_path):
    started = time.time()
    proc, log_dir = start_launch("robust_hang.py", 2, [3], tmp_path, timeout=100)
    output, _ = proc.communicate(timeout=110)
    elapsed = time.time() - started
    assert proc.returncode != 0
    assert elapsed < 90, f"the hang was not cut short ({elapsed:.0f}s)"
    log0 = (log_dir / "workerlog.0").read_text(errors="replace")
    assert "rank 0 stuck in 'optimizer' at step 7 for 3s" in log0, log0[-3000:] + output[-2000:]
    assert "a collective is probably waiting for a rank that died or diverged" in log0
    assert "most recent call first" in log0  # the stack dump
