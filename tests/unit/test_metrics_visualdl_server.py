"""Logs written by MetricsCallback are served by a real `visualdl` server (loopback only, < 30 s)."""
import json
import os
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from types import SimpleNamespace

import pytest

from paddletrainer.trainer_callback import TrainerControl, TrainerState
from paddletrainer.config.builders import metrics_config_of
from paddletrainer.metrics import MetricsCallback

VISUALDL = os.path.join(os.path.dirname(sys.executable), "visualdl")
START_TIMEOUT = 25.0


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(base, path):
    """GET base+path and return VisualDL's `data` field (its replies are {"status", "msg", "data"})."""
    with urllib.request.urlopen(base + path, timeout=5) as response:
        reply = json.load(response)
    assert reply["status"] == 0, reply
    return reply["data"]


def wait_until_serving(proc, base, log_path):
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"visualdl exited with {proc.returncode}: {log_path.read_text()}")
        try:
            return get(base, "/app/api/runs")
        except OSError:  # not listening yet
            time.sleep(0.2)
    raise AssertionError(f"visualdl did not answer within {START_TIMEOUT} s")


@pytest.mark.skipif(not os.path.exists(VISUALDL), reason=f"no visualdl executable at {VISUALDL}")
def test_visualdl_server_serves_the_logged_scalars(tmp_path):
    run_dir = str(tmp_path / "runs" / "run1")
    args = SimpleNamespace(output_dir=str(tmp_path), logging_dir=run_dir, report_to="visualdl", run_name=None)
    args.metrics_config = metrics_config_of(args)
    callback, state, control = MetricsCallback(), TrainerState(), TrainerControl()
    callback.on_train_begin(args, state, control)
    for step, loss in [(1, 2.5), (2, 2.0), (3, 1.5)]:
        state.global_step = step
        callback.on_log(args, state, control, logs={"loss": loss, "learning_rate": 0.01})
    callback.on_train_end(args, state, control)

    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log_path = tmp_path / "visualdl.out"
    with open(log_path, "w") as log:  # a file, not a pipe: an unread pipe could fill up and block the server
        proc = subprocess.Popen([VISUALDL, "--logdir", str(tmp_path / "runs"), "--host", "127.0.0.1",
                                 "--port", str(port)], stdout=log, stderr=subprocess.STDOUT)
    try:
        runs = wait_until_serving(proc, base, log_path)
        assert runs == [run_dir]  # runs are named by their directory path
        tags = get(base, "/app/api/tags")
        assert tags[f"{run_dir}/train%loss"] == "scalar"  # "/" in a tag shows up as "%"
        assert tags[f"{run_dir}/train%learning_rate"] == "scalar"
        query = urllib.parse.urlencode({"run": run_dir, "tag": "train/loss"})
        points = get(base, f"/app/api/scalar/list?{query}")  # [[timestamp_ms, step, value], ...]
        assert [(step, value) for _, step, value in points] == [(1, 2.5), (2, 2.0), (3, 1.5)]
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
