"""SIGKILL a single-process Trainer run at random points (saves included) several times; resuming each time
with the newest complete checkpoint ends with the losses of an uninterrupted run, and no checkpoint left on
disk is corrupt (every ``checkpoint-*`` loads; ``*.tmp-*`` leftovers of killed saves are ignored).
"""
from __future__ import annotations

import os
import random
import signal
import subprocess
import time
from pathlib import Path

import pytest

from launcher import PYTHON, WORKERS, _env, read_results, run_single

WORKER = "robust_train.py"
KILLS = 3
BALLAST = 2_000_000  # 8 MB of frozen weights: a save takes long enough for some kills to land inside one


def train_args(out_dir, result_dir, **options):
    base = dict(output_dir=out_dir, result_dir=result_dir, max_steps=16, logging_steps=1, learning_rate=0.05,
                seed=7, disable_tqdm=True, report_to="none", save_steps=1, save_total_limit=2,
                checkpoint_async_save=True, per_device_train_batch_size=8, per_device_eval_batch_size=4,
                ballast_floats=BALLAST)
    base.update(options)
    args = []
    for key, value in base.items():
        args += [f"--{key}", str(value)]
    return args


def plain_env(timeout):
    env = _env(timeout)
    for key in [k for k in env if k.startswith("PADDLE_")]:
        del env[key]
    return env


def steps_done(progress: Path) -> int:
    path = progress / "rank0.steps"
    lines = path.read_text().split() if path.exists() else []
    return int(lines[-1]) if lines else 0


def test_repeated_sigkill_and_resume_reaches_the_uninterrupted_result_without_corrupt_checkpoints(tmp_path):
    ref = tmp_path / "ref"
    run_single(WORKER, train_args(ref / "out", ref / "res"), timeout=100)
    reference = read_results(ref / "res", 1)[0]

    out, res, rng = tmp_path / "out", tmp_path / "res", random.Random(20261122)
    kills = []
    for attempt in range(KILLS):
        progress = tmp_path / f"progress{attempt}"
        cmd = [PYTHON, str(WORKERS / WORKER), *train_args(out, res, progress_dir=progress, step_sleep=0.05,
                                                          auto_resume=True)]
        proc = subprocess.Popen(cmd, cwd=str(WORKERS), env=plain_env(100), stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True)
        try:
            deadline = time.time() + 60
            while time.time() < deadline and steps_done(progress) < 1 and proc.poll() is None:
                time.sleep(0.01)
            assert proc.poll() is None, f"run {attempt} ended before the kill:\n{proc.stderr.read()[-3000:]}"
            time.sleep(rng.uniform(0.0, 0.6))  # somewhere in the next steps: compute, async write, publish
            proc.send_signal(signal.SIGKILL)
            proc.wait(30)
        finally:
            if proc.poll() is None:
                proc.kill()
        kills.append(steps_done(progress))
        assert_no_corrupt_checkpoint(out)

    # the last run is left alone: it resumes and finishes
    run_single(WORKER, train_args(out, res, auto_resume=True), timeout=100)
    final = read_results(res, 1)[0]
    assert final["resumed_from"] is not None, f"the last run did not resume (kills after steps {kills})"
    assert final["global_step"] == 16
    assert final["losses"] == pytest.approx(reference["losses"], rel=1e-5), f"kills after steps {kills}"
    assert final["eval_loss"] == pytest.approx(reference["eval_loss"], rel=1e-5)
    assert_no_corrupt_checkpoint(out)


def assert_no_corrupt_checkpoint(out: Path) -> None:
    """Every published ``checkpoint-*`` dir is complete and loads (crc32 checked); tmp dirs are never listed."""
    from paddletrainer.checkpoint import layout as L
    from paddletrainer.checkpoint import list_complete_checkpoints, load_checkpoint

    if not out.exists():
        return
    names = os.listdir(out)
    published = [n for n in names if L.parse_checkpoint_step(n) is not None]
    complete = list_complete_checkpoints(str(out))
    assert sorted(os.path.basename(c) for c in complete) == sorted(published), f"a published dir is incomplete: {names}"
    assert not any(L.is_tmp_dir_name(os.path.basename(c)) for c in complete)
    for path in complete:
        model = _ballast_mlp()
        loaded = load_checkpoint(path, model=model)
        assert loaded.trainer_state["global_step"] == L.parse_checkpoint_step(os.path.basename(path))
        assert float(model.ballast.numpy()[0]) == pytest.approx(0.5)


def _ballast_mlp():
    import sys

    sys.path.insert(0, str(WORKERS))
    from robust_train import BallastMLP

    return BallastMLP(BALLAST)
