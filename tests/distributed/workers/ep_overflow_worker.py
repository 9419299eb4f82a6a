"""fp16 (CPU dry run, live GradScaler) through the public Trainer on the tiny MoE model, with an inf injected into
one expert's gradient at one step: only the rank holding that expert (global expert ``inject_expert``) sees it.

The inf enters through a gradient hook on ``mlp.experts.<inject_expert>.down_proj.weight`` during step
``inject_step`` (before any synchronisation; under ep2·dp2 that expert has a single replica, so no all-reduce
carries the inf to the other rank: only the job-wide verdict can make it skip).

Output ``<result_dir>/rank<r>.json``: per logged step ``losses``, ``grad_norms``, ``loss_scales``,
``skipped_steps``; ``params_finite``; ``injected`` (whether this rank held the expert).
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..")))

import numpy as np  # noqa: E402
import paddle  # noqa: E402

from common import TrainerWorkerArguments, exit_cleanly, parse_worker_arguments, write_json  # noqa: E402
from moe_model import build_moe_model  # noqa: E402
from paddletrainer import Trainer, TrainerCallback  # noqa: E402
from trainer_worker import token_data  # noqa: E402


@dataclass
class InjectionArguments:
    inject_step: int = field(default=3, metadata={"help": "global step (1-based) whose backward gets the inf"})
    inject_expert: int = field(default=2, metadata={"help": "global index of the expert whose gradient gets it"})


class Injector(TrainerCallback):
    armed = False

    def __init__(self, step):
        self.step = step

    def on_step_begin(self, args, state, control, **kwargs):
        self.armed = state.global_step + 1 == self.step

    def on_step_end(self, args, state, control, **kwargs):
        self.armed = False


def main():
    work, inject, args = parse_worker_arguments(TrainerWorkerArguments, InjectionArguments)
    model = build_moe_model(args)
    injector = Injector(inject.inject_step)
    params = dict(model.named_parameters())
    target = params.get(f"mlp.experts.{inject.inject_expert}.down_proj.weight")
    if target is not None:
        target.register_hook(lambda g: g * float("inf") if injector.armed else g)
    trainer = Trainer(model=model, args=args, train_dataset=token_data(work.num_samples, 0), callbacks=[injector])
    trainer.train()
    logs = [h for h in trainer.state.log_history if "loss" in h and "grad_norm" in h]
    finite = all(bool(np.isfinite(p.numpy()).all()) for p in trainer.model.parameters())
    write_json(os.path.join(work.result_dir, f"rank{paddle.distributed.get_rank()}.json"), {
        "losses": [h["loss"] for h in logs], "grad_norms": [h["grad_norm"] for h in logs],
        "loss_scales": [h.get("loss_scale") for h in logs], "skipped_steps": [h.get("skipped_steps") for h in logs],
        "params_finite": finite, "injected": target is not None})
    exit_cleanly(trainer.topology)


if __name__ == "__main__":
    main()
