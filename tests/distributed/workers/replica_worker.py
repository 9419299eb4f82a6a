"""The replica-divergence check through the public Trainer, four runs of the MLP in one launch (one process group):

1. ``off``: a clean run with ``replica_check_steps=0``;
2. ``on``: the same run with ``replica_check_steps=2`` (its losses must be bit-identical to ``off``);
3. ``corrupt``: rank 1 changes one bit of its copy after the gradient sync at step ``--corrupt_step``: of a
   gradient, right before the optimizer step applies it (``--corrupt grad``), or of a weight right after the
   step (``--corrupt weight``: under sharding every owner broadcasts its updated share after each step, so a
   gradient changed on one rank never leaves the replicas apart; a weight changed after the broadcast does);
   the run must stop with ``ReplicaDivergenceError``;
4. ``rollback``: the same corruption at ``--rollback_step`` under ``nan_inf_policy=rollback`` (checkpoints every 2
   steps): the run rolls back and ends.

Output ``<result_dir>/rank<r>.json``: each run's logged losses, the error's message/step/ranks/parameter, the
rollback run's global step and losses, and each run's final weights' fingerprint.
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..")))

import numpy as np  # noqa: E402
import paddle  # noqa: E402
import paddle.distributed as dist  # noqa: E402

from common import exit_cleanly, write_json  # noqa: E402
from paddletrainer import Trainer, TrainerCallback, TrainingArguments  # noqa: E402
from paddletrainer.errors import ReplicaDivergenceError  # noqa: E402
from paddletrainer.runtime.replica_check import fingerprint, replicated_tensors  # noqa: E402
from trainer_worker import MLP, mlp_data  # noqa: E402

MAX_STEPS = 8


def flip_bit(tensor, bit: int = 22) -> None:
    """Flip one bit (a float32 mantissa bit: the value changes by up to 50%) of element 0, in place."""
    values = tensor.numpy().copy()
    values.reshape(-1).view(np.int32)[0] ^= 1 << bit
    tensor.set_value(values)


class CorruptRankOne(TrainerCallback):
    """On rank 1, the first time step ``step`` runs: one bit of ``net.0.weight``'s gradient after the sync (the
    optimizer's step is wrapped for that call), or of the weight (or its stage-3 slice) after the step."""

    def __init__(self, model, step: int, kind: str):
        self.param, self.step, self.kind, self.done = model.net[0].weight, step, kind, False
        self.rank = dist.get_rank()

    def _now(self, state) -> bool:
        return self.rank == 1 and not self.done and state.global_step + 1 == self.step

    def on_optimizer_begin(self, args, state, control, optimizer=None, **kwargs):
        if self.kind != "grad" or not self._now(state):
            return
        self.done = True
        step = optimizer.step

        def corrupted_step():  # Trainer: sync_gradients, unscale, clip, then optimizer.step(): we sit just before
            flip_bit(self.param.grad)
            del optimizer.step  # back to the class's method
            step()

        optimizer.step = corrupted_step

    def on_optimizer_end(self, args, state, control, **kwargs):
        if self.kind in ("weight", "slice") and self._now(state):
            self.done = True
            flip_bit(self.param.fw_storage if self.kind == "slice" else self.param)


def run(work, name: str, corrupt_step: int = 0, **options):
    paddle.seed(1234)  # identical initial weights on every rank and in every run
    model = MLP()
    args = dict(output_dir=os.path.join(work.out_dir, name), max_steps=MAX_STEPS, logging_steps=1, save_steps=100,
                learning_rate=0.05, per_device_train_batch_size=4, seed=7, disable_tqdm=True, report_to="none",
                replica_check_steps=2, **work.layout)
    args.update(options)
    callbacks = [CorruptRankOne(model, corrupt_step, work.corrupt)] if corrupt_step else []
    trainer = Trainer(model=model, args=TrainingArguments(**args), train_dataset=mlp_data(96, 0),
                      callbacks=callbacks)
    result = {}
    try:
        trainer.train()
    except ReplicaDivergenceError as err:
        result["error"] = dict(message=str(err), step=err.step, ranks=err.ranks, parameter=err.parameter,
                               global_step=trainer.state.global_step)
    result["losses"] = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    result["global_step"] = trainer.state.global_step
    result["fingerprint"] = fingerprint(replicated_tensors(model, trainer.args.sharding_stage)[1]).numpy().tolist()
    return trainer.topology, result


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out_dir", required=True)
    parser.add_argument("--result_dir", required=True)
    parser.add_argument("--sharding", default="")
    parser.add_argument("--sharding_parallel_degree", type=int, default=2)
    parser.add_argument("--corrupt", choices=("grad", "weight", "slice"), default="grad")
    parser.add_argument("--corrupt_step", type=int, default=3)
    parser.add_argument("--rollback_step", type=int, default=5)
    work = parser.parse_args()
    work.layout = {}
    if work.sharding:  # stage 3: slice every parameter (the MLP's are below the default segment size)
        work.layout = dict(sharding=work.sharding, sharding_parallel_degree=work.sharding_parallel_degree,
                           sharding_stage3_segment_size=0)
    results = {}
    _, results["off"] = run(work, "off", replica_check_steps=0)
    _, results["on"] = run(work, "on")
    _, results["corrupt"] = run(work, "corrupt", corrupt_step=work.corrupt_step)
    topology, results["rollback"] = run(work, "rollback", corrupt_step=work.rollback_step, save_steps=2,
                                        nan_inf_policy="rollback")
    results["dp_group"] = list(topology.group("dp").ranks) if topology.group("dp") is not None else [topology.rank]
    write_json(os.path.join(work.result_dir, f"rank{topology.rank}.json"), results)
    exit_cleanly(topology)


if __name__ == "__main__":
    main()
