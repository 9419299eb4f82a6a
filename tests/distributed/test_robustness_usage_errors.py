"""A bad option under ``paddle.distributed.launch``: every rank ends as argparse does (usage line, ``error: argument
--<option>: ...``, exit 2, no traceback) before any process group exists, and the launcher exits non-zero at once.

The script is the plain user script of the unit tests (tests/unit/fixtures/user_train_script.py), which has no error
handling of its own; the unit tests run every option row of docs/errors.md through it in one process.
"""
from __future__ import annotations

import fcntl
import json
import subprocess
import time
from pathlib import Path

import pytest

from launcher import LOCK, PYTHON, REPO, _env

SCRIPT = REPO / "tests" / "unit" / "fixtures" / "user_train_script.py"


def launch_user_script(tmp_path: Path, name: str, script_args: list) -> tuple:
    log_dir = tmp_path / name
    cmd = ["timeout", "120", PYTHON, "-m", "paddle.distributed.launch", "--nproc_per_node", "2",
           "--log_dir", str(log_dir), str(SCRIPT), *map(str, script_args)]
    with open(LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the machine-wide launch lock; waiting for it is not timed
        started = time.time()
        proc = subprocess.run(cmd, cwd=str(tmp_path), env=_env(120), capture_output=True, text=True)
        elapsed = time.time() - started
    return proc, elapsed, {p.name: p.read_text(errors="replace") for p in sorted(log_dir.glob("workerlog.*"))}


@pytest.mark.parametrize("name,args,option,expected", [
    ("pp4_on_2", ["--pipeline_parallel_degree", "4", "--gradient_accumulation_steps", "4"], "pipeline_parallel_degree",
     "does not divide the world size 2"),
    ("resume_missing_from_json", ["{cfg}", "--resume_from_checkpoint", "/nonexistent/checkpoint-7"],
     "resume_from_checkpoint", "'/nonexistent/checkpoint-7' does not exist"),
    ("workers_1e6", ["--dataloader_num_workers", "1000000"], "dataloader_num_workers",
     "must be >= 0 and <= 1024"),
    ("nan_lr_from_json", ["{cfg}", "--learning_rate", "nan"], "learning_rate", "invalid value for learning_rate: nan"),
])
def test_a_bad_option_under_the_launcher_is_a_usage_error_on_every_rank(tmp_path, name, args, option, expected):
    cfg = tmp_path / "cfg.json"
    cfg.write_text(json.dumps({"output_dir": str(tmp_path / "out"), "max_steps": 3}))
    args = [str(cfg) if a == "{cfg}" else a for a in args]
    if not args[0].endswith(".json"):
        args = ["--output_dir", str(tmp_path / "out"), *args]
    proc, elapsed, logs = launch_user_script(tmp_path, name, args)
    assert proc.returncode != 0, proc.stdout[-2000:]
    assert elapsed < 30, f"the launcher took {elapsed:.0f}s to give up"
    assert sorted(logs) == ["workerlog.0", "workerlog.1"], logs.keys()
    for log_name, text in logs.items():
        assert "Traceback" not in text, f"{log_name}:\n{text}"
        lines = [t for t in text.splitlines() if "Warning" not in t and "warnings.warn" not in t and "INFO" not in t]
        assert lines[0].startswith("usage: user_train_script.py"), f"{log_name}:\n{text}"
        error = next(t for t in lines if "error: " in t)
        assert f"user_train_script.py: error: argument --{option}: " in error and expected in error, error
    assert "code 2" in proc.stdout + proc.stderr  # the launcher reports the ranks' usage-error status
