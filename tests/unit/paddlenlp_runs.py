"""What the tests that run PaddleNLP's Trainer beside ours share: the tiny token data, a loss-recording callback
for either Trainer, the sequential sampler both Trainers are given so that they see the same batches, and the run
of one of PaddleNLP's ``llm/`` scripts on a JSON configuration."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import numpy as np
import paddle

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# PaddleNLP's Trainer logs each step as "loss: L, learning_rate: R, global_step: N, ..."
STEP_LOSS = re.compile(r"\bloss: ([0-9.]+), learning_rate: [^,]+, global_step: (\d+)")

SEQ, VOCAB = 16, 96


def token_data(n=32):
    tokens = np.random.RandomState(0).randint(0, VOCAB, size=(n, SEQ + 1)).astype("int64")
    return [{"input_ids": t[:-1], "labels": t[1:]} for t in tokens]


def loss_log(base, losses):
    """A callback class (of ``base``, either Trainer's) keeping ``{step: loss}``."""
    def on_log(self, args, state, control, logs=None, **kw):
        if logs and "loss" in logs:
            losses[state.global_step] = logs["loss"]
    return type("LossLog", (base,), {"on_log": on_log})


def sequential_sampler(self):
    """A Trainer's ``_get_train_sampler``: the data set in order, one per-device batch at a time."""
    return paddle.io.BatchSampler(self.train_dataset, batch_size=self.args.per_device_train_batch_size, shuffle=False)


def script_step_losses(script, config_path, config):
    """Run ``script`` (one of PaddleNLP's ``llm/`` scripts, or its import-swapped copy) on ``config`` written to
    ``config_path``, in one process, and return the loss it logged at each step, in step order."""
    config_path.write_text(json.dumps(config))
    env = {k: v for k, v in os.environ.items() if not k.startswith("PADDLE_")}
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, script, str(config_path)], cwd=os.path.dirname(script), env=env,
                          capture_output=True, text=True, timeout=600)
    name = config_path.stem
    assert proc.returncode == 0, f"{name}: exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-4000:]}"
    steps = {int(step): float(loss) for loss, step in STEP_LOSS.findall(proc.stdout + proc.stderr)}
    return [steps[s] for s in sorted(steps)]
