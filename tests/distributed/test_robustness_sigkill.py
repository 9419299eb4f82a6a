"""SIGKILL a Trainer run at random points (saves included) several times; resuming each time with the newest
complete checkpoint ends with the losses of an uninterrupted run, and no checkpoint left on disk is corrupt (every
``checkpoint-*`` loads; ``*.tmp-*`` leftovers of killed saves are ignored, then deleted).

* one process, restarted by the test itself;
* chaos: a dp2 launch under ``python -m paddletrainer.launch --max_restart`` (Paddle 3.3.1's own launcher restarts
  only with an etcd master, see ``paddletrainer/launch.py``), a random rank SIGKILLed at random moments — one of
  them while a save is in flight — and the job restarting and resuming by itself (``--resume_from_checkpoint auto``).
"""
from __future__ import annotations

import fcntl
import os
import random
import signal
import subprocess
import time
from pathlib import Path

import pytest

from launcher import LOCK, PYTHON, REPO, WORKERS, _env, _log_tails, read_results, run_single

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


def _lines(path: Path) -> int:
    return len(path.read_text().split()) if path.exists() else 0


def _pid(progress: Path, rank: int, newer_than: float):
    path = progress / f"rank{rank}.pid"
    if not path.exists() or path.stat().st_mtime <= newer_than:
        return None
    text = path.read_text().strip()
    return int(text) if text else None


def _in_save(out: Path) -> bool:
    return out.exists() and any(".tmp-" in n for n in os.listdir(out))


def test_chaos_sigkill_of_random_ranks_under_a_restarting_launch_ends_on_the_uninterrupted_losses(tmp_path):
    max_steps, save_steps, new_steps_before_kill = 24, 3, 3
    options = dict(max_steps=max_steps, save_steps=save_steps, checkpoint_async_save=False)
    ref = tmp_path / "ref"
    run_single(WORKER, train_args(ref / "out", ref / "res", **options), timeout=100)
    reference = read_results(ref / "res", 1)[0]

    out, res, progress, logs = tmp_path / "out", tmp_path / "res", tmp_path / "progress", tmp_path / "logs"
    rng = random.Random(int(os.environ.get("PT_CHAOS_SEED", "20261122")))
    cmd = [PYTHON, "-m", "paddletrainer.launch", "--max_restart", str(KILLS + 1), "--nproc_per_node", "2",
           "--log_dir", str(logs), str(WORKERS / WORKER),
           *train_args(out, res, per_device_train_batch_size=4, progress_dir=progress, step_sleep=0.1,
                       resume_from_checkpoint="auto", **options)]
    steps_file = progress / "rank0.steps"
    # one kill while a save is in flight, one between saves, the last wherever the dice say
    moments = ["mid-save", "mid-step", rng.choice(["mid-save", "mid-step"])]
    kills = []  # (rank, last step written before the kill, a save was in flight)
    with open(LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        env = _env(240)
        env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
        sup = subprocess.Popen(cmd, cwd=str(WORKERS), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True)
        try:
            last_kill, lines_at_kill = 0.0, 0
            for moment in moments:
                # wait for the (re)started job: both ranks up again and a few new steps trained
                deadline = time.time() + 90
                while time.time() < deadline and sup.poll() is None:
                    pids = [_pid(progress, r, last_kill) for r in (0, 1)]
                    if all(pids) and _lines(steps_file) >= lines_at_kill + new_steps_before_kill:
                        break
                    time.sleep(0.01)
                assert sup.poll() is None, f"the job ended before kill {len(kills) + 1}:\n{sup.stdout.read()[-3000:]}"
                assert all(pids), f"attempt {len(kills) + 1} did not start in time\n{_log_tails(logs)}"
                if moment == "mid-save":
                    while time.time() < deadline and not _in_save(out):
                        time.sleep(0.001)
                else:  # just after a step that saves nothing: the next step is computing, no save is in flight
                    seen = _lines(steps_file)
                    while time.time() < deadline and (_lines(steps_file) == seen or steps_done(progress) % save_steps == 0
                                                      or _in_save(out)):
                        time.sleep(0.001)
                    time.sleep(rng.uniform(0.0, 0.05))
                rank = rng.randrange(2)
                in_save = _in_save(out)
                os.kill(pids[rank], signal.SIGKILL)
                last_kill, lines_at_kill = time.time(), _lines(steps_file)
                kills.append((rank, steps_done(progress), in_save))
            output, _ = sup.communicate(timeout=240)
        finally:
            if sup.poll() is None:
                sup.kill()
                sup.wait()
    report = f"kills (rank, step, mid-save): {kills}"
    assert sup.returncode == 0, f"{report}\n{output[-3000:]}\n{_log_tails(logs)}"
    assert output.count("restarting the job") == KILLS, output[-3000:]
    assert any(k[2] for k in kills) and not all(k[2] for k in kills), report
    results = read_results(res, 2)
    for r in results:
        assert r["resumed_from"] is not None and r["global_step"] == max_steps, f"{report}: {r}"
        assert r["losses"] == pytest.approx(reference["losses"], rel=1e-5), report
        assert r["eval_loss"] == pytest.approx(reference["eval_loss"], rel=1e-5)
    assert_no_corrupt_checkpoint(out)
    assert not [n for n in os.listdir(out) if ".tmp-" in n], "half-written checkpoints were not cleaned up"


def assert_no_corrupt_checkpoint(out: Path) -> None:
    """Every published ``checkpoint-*`` dir is complete and loads (crc32 checked); tmp dirs are never listed."""
    from paddletrainer.checkpoint import placement as L
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
