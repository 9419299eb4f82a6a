"""A process SIGKILLed in the middle of a save leaves the previous checkpoint loadable and is ignored."""
import os
import signal
import subprocess
import sys
import time

import numpy as np
import paddle

from paddletrainer.checkpoint import placement as L
from paddletrainer.checkpoint import list_complete_checkpoints, load_checkpoint
from paddletrainer.trainer_utils import get_last_checkpoint

WORKER = os.path.join(os.path.dirname(__file__), "..", "distributed", "ckpt_workers", "save_loop.py")


def test_sigkill_mid_save_keeps_previous_checkpoint_and_ignores_the_partial_one(tmp_path):
    proc = subprocess.Popen([sys.executable, WORKER, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "READY"
        deadline = time.time() + 120
        while time.time() < deadline:  # kill as soon as a save is half-way: its tmp dir exists
            if any(L.is_tmp_dir_name(n) for n in os.listdir(tmp_path)):
                break
            time.sleep(0.001)
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
    names = os.listdir(tmp_path)
    assert any(L.is_tmp_dir_name(n) for n in names), f"the kill did not land mid-save: {names}"
    complete = list_complete_checkpoints(str(tmp_path))
    assert complete and all(L.parse_checkpoint_step(os.path.basename(p)) for p in complete)
    last = get_last_checkpoint(str(tmp_path))
    assert last == complete[-1]

    model = paddle.nn.Sequential(*[paddle.nn.Linear(1024, 1024) for _ in range(12)])
    state = load_checkpoint(last, model=model).trainer_state
    step = state["global_step"]
    assert last.endswith(f"checkpoint-{step}")
    for p in model.parameters():
        assert np.all(p.numpy() == step)
