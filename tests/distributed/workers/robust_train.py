"""A Trainer run (the MLP of ``trainer_worker.py``) for the interruption tests: SIGTERM, SIGKILL, resume.

Arguments: ``RobustArguments`` plus every ``TrainingArguments`` option (PdArgumentParser, as a user script).
The entry point is wrapped in ``paddletrainer.errors.friendly_errors``, as the example scripts should be.

* ``--progress_dir D``: after every optimizer step each rank appends ``<global_step>`` to ``D/rank<r>.steps``
  (and writes its pid to ``D/rank<r>.pid`` at start), so a test can wait for a step and signal the workers.
* ``--step_sleep S``: sleep S seconds at each step end (gives a test time to land a signal mid-training).
* ``--ballast_floats N``: an extra frozen parameter of N floats, so saves take long enough to be hit by a kill.
* ``--poison_step N`` / ``--poison_rank R``: the loss of rank R is NaN the first time step N runs (rollback tests).
* ``--stop_at_step N``: stop (after the step's save) at step N, keeping max_steps' schedule.
* ``--auto_resume``: resume from the newest complete checkpoint in output_dir if there is one (the script's own
  ``get_last_checkpoint``, as PaddleNLP scripts do; ``--resume_from_checkpoint auto`` is the Trainer's switch).

Output ``<result_dir>/rank<r>.json`` at the end of a completed run: per-step losses, global_step, eval loss.
If the Trainer does not (yet) install ``RobustnessCallback`` itself, the worker adds one.
"""
from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, field

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..")))
sys.path.append(os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "unit")))  # toy_models

import paddle  # noqa: E402

from common import write_json  # noqa: E402
from paddletrainer import PdArgumentParser, Trainer, TrainerCallback, TrainingArguments  # noqa: E402
from paddletrainer.errors import friendly_errors  # noqa: E402
from paddletrainer.runtime import RobustnessCallback  # noqa: E402
from paddletrainer.trainer_utils import get_last_checkpoint  # noqa: E402
from paddletrainer.checkpoint.discovery import resolve_resume_checkpoint  # noqa: E402
from toy_models import PoisonAt, StopAt, poisonable  # noqa: E402
from trainer_worker import MLP, mlp_data  # noqa: E402


@dataclass
class RobustArguments:
    result_dir: str = field(default=None, metadata={"help": "where rank<r>.json goes"})
    progress_dir: str = field(default=None, metadata={"help": "where rank<r>.steps / rank<r>.pid go"})
    step_sleep: float = field(default=0.0, metadata={"help": "seconds to sleep at each step end"})
    ballast_floats: int = field(default=0, metadata={"help": "size of an extra frozen parameter"})
    num_samples: int = field(default=64, metadata={"help": "train set size"})
    auto_resume: bool = field(default=False, metadata={"help": "resume from the newest complete checkpoint"})
    poison_step: int = field(default=0, metadata={"help": "make the loss NaN the first time this step runs"})
    poison_rank: int = field(default=0, metadata={"help": "the rank whose loss --poison_step poisons"})
    stop_at_step: int = field(default=0, metadata={"help": "stop training after this step"})


class BallastMLP(MLP):
    def __init__(self, floats: int):
        super().__init__()
        self.ballast = self.create_parameter([floats], default_initializer=paddle.nn.initializer.Constant(0.5))
        self.ballast.stop_gradient = True


class Progress(TrainerCallback):
    def __init__(self, path: str, sleep: float):
        self.path, self.sleep = path, sleep

    def on_step_end(self, args, state, control, **kwargs):
        if self.sleep:
            time.sleep(self.sleep)
        with open(self.path, "a") as f:
            f.write(f"{state.global_step}\n")


def build_model(work: RobustArguments, rank: int = 0):
    paddle.seed(1234)  # identical initial weights in every process and run
    poison = work.poison_step and rank == work.poison_rank
    if work.ballast_floats:
        return (poisonable(BallastMLP) if poison else BallastMLP)(work.ballast_floats)
    return (poisonable(MLP) if poison else MLP)()


@friendly_errors
def main():
    work, args = PdArgumentParser((RobustArguments, TrainingArguments)).parse_args_into_dataclasses()
    rank = paddle.distributed.get_rank() if int(os.environ.get("PADDLE_TRAINERS_NUM", "1")) > 1 else 0
    callbacks = []
    if work.progress_dir:
        os.makedirs(work.progress_dir, exist_ok=True)
        with open(os.path.join(work.progress_dir, f"rank{rank}.pid"), "w") as f:
            f.write(str(os.getpid()))
        callbacks.append(Progress(os.path.join(work.progress_dir, f"rank{rank}.steps"), work.step_sleep))
    model = build_model(work, rank)
    if work.poison_step and rank == work.poison_rank:
        callbacks.append(PoisonAt(model, steps=(work.poison_step,)))
    if work.stop_at_step:
        callbacks.append(StopAt(work.stop_at_step))
    trainer = Trainer(model=model, args=args, train_dataset=mlp_data(work.num_samples, 0),
                      eval_dataset=mlp_data(16, 1), callbacks=callbacks)
    if not any(isinstance(cb, RobustnessCallback) for cb in trainer.callback_handler.callbacks):
        trainer.add_callback(RobustnessCallback(trainer.topology, args.collective_timeout_seconds))
    resume = None
    if work.auto_resume:
        resume = get_last_checkpoint(args.output_dir)
    # what train() resumes from: `resume`, else --resume_from_checkpoint (a path, true or auto)
    resumed_from = resume or resolve_resume_checkpoint(args.resume_from_checkpoint, args.output_dir)
    out = trainer.train(resume_from_checkpoint=resume)
    eval_metrics = trainer.evaluate()
    history = trainer.state.log_history
    write_json(
        os.path.join(work.result_dir, f"rank{rank}.json"),
        {
            "losses": [h["loss"] for h in history if "loss" in h],
            "eval_loss": eval_metrics["eval_loss"],
            "global_step": trainer.state.global_step,
            "training_loss": out.training_loss,
            "resumed_from": resumed_from,
        },
    )


if __name__ == "__main__":
    main()
