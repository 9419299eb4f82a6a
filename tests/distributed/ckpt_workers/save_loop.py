"""Saves a ~48 MiB model again and again under OUT until killed (used by the SIGKILL test).

checkpoint-1 is saved and reported first ("READY"), then checkpoint-2, -3, ... forever; weights are
set to the step number so a test can tell which save a loaded checkpoint came from.
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", ".."))
import paddle  # noqa: E402

from paddletrainer.checkpoint import save_checkpoint  # noqa: E402

out = sys.argv[1]
model = paddle.nn.Sequential(*[paddle.nn.Linear(1024, 1024) for _ in range(12)])
step = 1
while True:
    for p in model.parameters():
        p.set_value(paddle.full(p.shape, float(step), p.dtype))
    save_checkpoint(os.path.join(out, f"checkpoint-{step}"), model=model, trainer_state={"global_step": step})
    if step == 1:
        print("READY", flush=True)
    step += 1
