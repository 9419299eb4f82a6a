"""Paths and helpers for the example tests: the scripts run as subprocesses, the way a user runs them."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ERNIE = REPO / "llm_examples" / "ernie"
LLAMA = REPO / "llm_examples" / "llama"
PYTHON = sys.executable
LOCK = "/tmp/paddletrainer-mp.lock"
if str(REPO) not in sys.path:  # tests import paddletrainer.data.pretrain from the checkout, installed or not
    sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests" / "distributed"))  # hang_retry: the suite's one launch retry loop
from hang_retry import run_retrying_hangs  # noqa: E402,F401


def load_module(path: Path, name: str):
    """Import a script or example module by file path (they are not packages)."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def script_env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH", "")]))
    for key in [k for k in env if k.startswith("PADDLE_")]:  # never inherit a launcher's rank variables
        del env[key]
    env.setdefault("GLOG_v", "0")
    return env


def run_script(args, cwd, timeout=600) -> subprocess.CompletedProcess:
    """Run ``python <args>``; on failure show the tail of its output so the test says why."""
    proc = subprocess.run([PYTHON, *map(str, args)], cwd=str(cwd), env=script_env(),
                          capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        pytest.fail(f"{' '.join(map(str, args))} exited {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}")
    return proc


def trainer_ready() -> bool:
    """The end-to-end tests need the library's Trainer; skip (not fail) while it cannot even import."""
    try:
        from paddletrainer import Trainer  # noqa: F401
        return True
    except Exception:
        return False
