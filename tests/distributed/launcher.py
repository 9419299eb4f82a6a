"""Run the distributed test workers: under ``paddle.distributed.launch`` or as one plain process.

Every multi-process launch takes ``/tmp/paddletrainer-mp.lock`` (one launch at a time on the machine:
each process imports paddle and paddlenlp, and the runs share two cores) and a hard ``timeout``.
Workers write ``rank<r>.json`` files; a failed launch raises :class:`LaunchError` with the tail of
every worker log, so a test failure shows the worker's traceback.
"""
from __future__ import annotations

import fcntl
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from hang_retry import run_retrying_hangs

REPO = Path(__file__).resolve().parents[2]
WORKERS = Path(__file__).resolve().parent / "workers"
LOCK = "/tmp/paddletrainer-mp.lock"
PYTHON = sys.executable


class LaunchError(RuntimeError):
    """A launch exited non-zero or a rank wrote no result."""


def _env(timeout: int) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH", "")]))
    # Workers dump their stacks and exit a little before the launch's own timeout.
    env["PT_WORKER_TIMEOUT"] = str(max(timeout - 20, 10))
    env.setdefault("GLOG_v", "0")
    return env


def _log_tails(log_dir: Path, lines: int = 40) -> str:
    parts = []
    for log in sorted(log_dir.glob("workerlog.*")):
        text = log.read_text(errors="replace").splitlines()
        kept = [t for t in text if "INFO" not in t][-lines:]
        parts.append(f"--- {log.name} ---\n" + "\n".join(kept))
    return "\n".join(parts)


def launch(worker: str, nproc: int, worker_args: list, work_dir: Path, timeout: int = 300) -> float:
    """Launch ``workers/<worker>`` on ``nproc`` processes; return the wall time in seconds.

    A launch that hung (see ``hang_retry``) is retried once in a fresh log directory.
    """
    def attempt(n: int):
        log_dir = Path(work_dir) / ("logs" if n == 1 else "logs_retry")
        cmd = ["flock", LOCK, "timeout", str(timeout), PYTHON, "-m", "paddle.distributed.launch", "--nproc_per_node",
               str(nproc), "--log_dir", str(log_dir), str(WORKERS / worker), *map(str, worker_args)]
        started = time.time()
        proc = subprocess.run(cmd, cwd=str(WORKERS), env=_env(timeout), capture_output=True, text=True)
        return (cmd, log_dir, proc, time.time() - started), ([(proc.returncode, log_dir)] if proc.returncode else [])

    (cmd, log_dir, proc, elapsed), failures = run_retrying_hangs(f"{worker} on {nproc} processes", attempt)
    if failures:
        raise LaunchError(f"{' '.join(cmd)}\nexit {proc.returncode} after {elapsed:.0f}s\n{_log_tails(log_dir)}\n"
                          f"--- launcher ---\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    return elapsed


def free_port() -> int:
    """A TCP port nobody listens on right now (for a launch's ``--master``)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def launch_nodes(worker: str, nproc_per_node: int, node_args: list, work_dir: Path, timeout: int = 300):
    """Several "nodes" on this machine: one ``paddle.distributed.launch --nnodes N --master 127.0.0.1:<port>
    --rank i`` per entry of ``node_args`` (that node's worker arguments), all started together under the lock.

    Returns ``(wall time, [each node's log directory])``; raises :class:`LaunchError` with every node's worker
    logs if any node fails. A launch that hung (see ``hang_retry``) is retried once, as in :func:`launch`.
    """
    def attempt(n: int):
        suffix = "" if n == 1 else "_retry"
        with open(LOCK, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # the same lock `flock LOCK` takes: one launch on the machine
            master = f"127.0.0.1:{free_port()}"
            started = time.time()
            procs = []
            for rank, args in enumerate(node_args):
                log_dir = Path(work_dir) / f"logs_node{rank}{suffix}"
                cmd = ["timeout", str(timeout), PYTHON, "-m", "paddle.distributed.launch", "--nnodes",
                       str(len(node_args)), "--master", master, "--rank", str(rank), "--nproc_per_node",
                       str(nproc_per_node), "--log_dir", str(log_dir), str(WORKERS / worker), *map(str, args)]
                procs.append((cmd, log_dir, subprocess.Popen(cmd, cwd=str(WORKERS), env=_env(timeout), text=True,
                                                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT)))
            outputs = [(cmd, log_dir, proc.communicate()[0], proc.returncode) for cmd, log_dir, proc in procs]
        return (outputs, time.time() - started), [(rc, log_dir) for _, log_dir, _, rc in outputs if rc != 0]

    (outputs, elapsed), failed = run_retrying_hangs(f"{worker} on {len(node_args)} nodes", attempt)
    if failed:
        raise LaunchError("\n".join(f"{' '.join(cmd)}\nexit {rc} after {elapsed:.0f}s\n{_log_tails(log_dir)}\n"
                                    f"--- launcher ---\n{out[-2000:]}" for cmd, log_dir, out, rc in outputs))
    return elapsed, [log_dir for _, log_dir, _, _ in outputs]


def run_single(worker: str, worker_args: list, timeout: int = 300) -> float:
    """Run ``workers/<worker>`` as one plain process (the single-process reference)."""
    cmd = [PYTHON, str(WORKERS / worker), *map(str, worker_args)]
    started = time.time()
    env = _env(timeout)
    for key in [k for k in env if k.startswith("PADDLE_")]:  # never inherit a launcher's rank variables
        del env[key]
    proc = subprocess.run(cmd, cwd=str(WORKERS), env=env, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise LaunchError(f"{' '.join(cmd)}\nexit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}")
    return time.time() - started


def read_results(out_dir: Path, nproc: int) -> list:
    """The ``rank<r>.json`` payloads of ranks 0..nproc-1, in rank order."""
    results = []
    for rank in range(nproc):
        path = Path(out_dir) / f"rank{rank}.json"
        if not path.exists():
            raise LaunchError(f"rank {rank} wrote no result ({path})")
        results.append(json.loads(path.read_text()))
    return results
