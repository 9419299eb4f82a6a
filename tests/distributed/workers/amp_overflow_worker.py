"""fp16 (CPU dry run, live GradScaler) through the public Trainer, with an inf injected on one rank at one step.

The inf enters the way a real fp16 overflow does: inside the backward pass, before any gradient
synchronisation (``paddletrainer.tools.gpu_smoke.instrument``: a forward post-hook on this rank's first ``LlamaMLP`` routes
its output through an identity whose backward multiplies the gradient by inf, on rank ``inject_rank`` during
step ``inject_step``; a forward pre-hook on the same layer records the auto_cast settings active inside the
model's forward, in training and in evaluation).

Output ``<result_dir>/rank<r>.json``: per logged step ``losses``, ``grad_norms``, ``loss_scales``,
``skipped_steps`` and ``learning_rates``; ``params_finite``; ``replicated`` (sha1 of every non-split
parameter by structural name, to compare across ranks); ``autocast`` (the settings seen in train and eval).
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
sys.path.insert(0, REPO)

import numpy as np  # noqa: E402
import paddle  # noqa: E402

from common import TrainerWorkerArguments, exit_cleanly, parse_worker_arguments, write_json  # noqa: E402
from paddletrainer import Trainer, TrainerCallback  # noqa: E402
from paddletrainer.tools.gpu_smoke import instrument, replicated_digests  # noqa: E402 - the smoke tool's injection and spy
from trainer_worker import build_model, token_data  # noqa: E402


@dataclass
class InjectionArguments:
    inject_step: int = field(default=3, metadata={"help": "global step (1-based) whose backward gets the inf"})
    inject_rank: int = field(default=0, metadata={"help": "the only rank that injects"})


def main():
    work, inject, args = parse_worker_arguments(TrainerWorkerArguments, InjectionArguments)
    model = build_model(work, args)
    injector, seen = instrument(model, TrainerCallback, inject.inject_step, inject.inject_rank)
    trainer = Trainer(model=model, args=args, train_dataset=token_data(work.num_samples, 0),
                      eval_dataset=token_data(8, 1), callbacks=[injector])
    trainer.train()
    eval_metrics = trainer.evaluate()
    logs = [h for h in trainer.state.log_history if "loss" in h and "grad_norm" in h]
    finite = all(bool(np.isfinite(p.numpy()).all()) for p in trainer.model.parameters() if p._is_initialized())
    write_json(
        os.path.join(work.result_dir, f"rank{paddle.distributed.get_rank()}.json"),
        {
            "losses": [h["loss"] for h in logs],
            "grad_norms": [h["grad_norm"] for h in logs],
            "loss_scales": [h.get("loss_scale") for h in logs],
            "skipped_steps": [h.get("skipped_steps") for h in logs],
            "learning_rates": [h["learning_rate"] for h in logs],
            "state_skipped_steps": trainer.state.skipped_steps,
            "eval_loss": eval_metrics["eval_loss"],
            "params_finite": finite,
            "replicated": replicated_digests(trainer.model),
            "autocast": {k: sorted(v) for k, v in seen.items()},
        },
    )
    exit_cleanly(trainer.topology)


if __name__ == "__main__":
    main()
