"""Run a worker under ``paddle.distributed.launch``, holding the machine-wide multi-process lock."""
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
LOCK = "/tmp/paddletrainer-mp.lock"


def launch(worker: str, args, nproc: int, log_dir: str, timeout: int = 300) -> None:
    """Raise with the worker logs' tails when the launch fails."""
    cmd = ["flock", LOCK, "timeout", str(timeout), sys.executable, "-m", "paddle.distributed.launch",
           "--nproc_per_node", str(nproc), "--log_dir", log_dir, os.path.join(HERE, worker), *map(str, args)]
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if proc.returncode != 0:
        tails = []
        for name in sorted(os.listdir(log_dir)) if os.path.isdir(log_dir) else []:
            with open(os.path.join(log_dir, name), errors="replace") as f:
                tails.append(f"--- {name}\n" + "".join(f.readlines()[-25:]))
        raise AssertionError(f"launch failed rc={proc.returncode}: {' '.join(cmd)}\n" + "\n".join(tails))
