"""The tiny Llama through the public Trainer with :class:`host_reads.HostReadCounter` installed.

Output ``<result_dir>/rank<r>.json``: ``outside`` (``{step: [read, ...]}`` for the steps from 2 on that did not
log and read something), ``step1`` (the first step's reads), ``model_reads_per_step`` (reads in the model's own
code), ``logged_steps``, ``reads_per_logged_step`` and ``losses`` (the logged losses, to show the run
trained).
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
sys.path.insert(0, REPO)
sys.path.append(os.path.join(REPO, "tests", "unit"))  # host_reads

import paddle  # noqa: E402

from common import TrainerWorkerArguments, exit_cleanly, parse_worker_arguments, write_json  # noqa: E402
from host_reads import HostReadCounter  # noqa: E402
from paddletrainer import Trainer  # noqa: E402
from trainer_worker import build_model, token_data  # noqa: E402


def main():
    work, args = parse_worker_arguments(TrainerWorkerArguments)
    model = build_model(work, args)
    counter = HostReadCounter()
    trainer = Trainer(model=model, args=args, train_dataset=token_data(work.num_samples, 0), callbacks=[counter])
    counter.install()
    try:
        trainer.train()
    finally:
        counter.uninstall()
    write_json(
        os.path.join(work.result_dir, f"rank{paddle.distributed.get_rank()}.json"),
        {
            # from step 2 on: the first step exchanges the pipeline's tensor shapes once (Paddle's p2p meta cache)
            "outside": {str(s): r for s, r in counter.reads_outside_logging_steps(args.max_steps, first=2).items()},
            "step1": counter.reads[1],
            "model_reads_per_step": {str(s): len(r) for s, r in counter.model_reads.items()},
            "logged_steps": sorted(counter.logged_steps),
            "reads_per_logged_step": [len(counter.reads[s]) for s in sorted(counter.logged_steps)],
            "losses": [h["loss"] for h in trainer.state.log_history if "loss" in h and "grad_norm" in h],
        },
    )
    exit_cleanly(trainer.topology)


if __name__ == "__main__":
    main()
