"""Run a worker under ``paddle.distributed.launch``, holding the machine-wide multi-process lock."""
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # tests/distributed: hang_retry
from hang_retry import run_retrying_hangs  # noqa: E402
LOCK = "/tmp/paddletrainer-mp.lock"


def launch(worker: str, args, nproc: int, log_dir: str, timeout: int = 300) -> None:
    """Raise with the worker logs' tails when the launch fails."""
    env = dict(os.environ, PT_WORKER_TIMEOUT=str(max(timeout - 20, 10)))  # workers dump stacks before the kill

    def attempt(n: int):
        run_dir = log_dir if n == 1 else log_dir.rstrip("/") + "_retry"
        cmd = ["flock", LOCK, "timeout", str(timeout), sys.executable, "-m", "paddle.distributed.launch",
               "--nproc_per_node", str(nproc), "--log_dir", run_dir, os.path.join(HERE, worker), *map(str, args)]
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        return (cmd, run_dir, proc), ([(proc.returncode, run_dir)] if proc.returncode else [])

    (cmd, log_dir, proc), _ = run_retrying_hangs(f"{worker} on {nproc} processes", attempt)
    if proc.returncode != 0:
        tails = []
        for name in sorted(os.listdir(log_dir)) if os.path.isdir(log_dir) else []:
            with open(os.path.join(log_dir, name), errors="replace") as f:
                tails.append(f"--- {name}\n" + "".join(f.readlines()[-25:]))
        raise AssertionError(f"launch failed rc={proc.returncode}: {' '.join(cmd)}\n" + "\n".join(tails))
