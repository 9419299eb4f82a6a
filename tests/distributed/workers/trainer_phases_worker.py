"""One layout, every Trainer claim in one launch: train, evaluate, predict, save, resume (same and other layout).

Phases, each a fresh model and ``Trainer`` built from the parsed ``TrainingArguments`` (as a user's script
would on a rerun), in one process:

1. ``short``: train ``--max_steps`` (3) and save there; ``evaluate()`` on 13 labelled samples and ``predict()``
   on 13 unlabelled ones (13 is a multiple of no batch, so the last batch is short on every layout).
2. ``extended``: the same run resumed from its own checkpoint with ``--extended_steps`` (6).
3. ``foreign`` (with ``--foreign_checkpoint``): a checkpoint written by another layout, resumed the same way.
4. ``uninterrupted`` (with ``--uninterrupted``): ``--extended_steps`` in one go, the curve the others continue.
5. ``stream`` (with ``--stream``): the data as ``paddle.io.IterableDataset`` streams, train/evaluate/predict.
6. ``finetune``, ``finetune_ga<n>`` (with ``--finetune``): fine-tuning documents of different trained-token
   counts (``trainer_worker.finetune_phases``); ``--finetune_only`` runs just these (the one-micro-batch reference).
7. ``packed_startend``, ``packed_attention_mask`` (with ``--packed``): packed rows in PaddleNLP's two zero-padding
   formats (``packed_phases``); with ``--finetune_only`` too.

``node`` records the rank facts (``local_process_index``, ``should_log``, ``should_save``) and, with
``--node_files``, what the short phase's Trainer writes through them: ``log_metrics`` (printed where
``should_log``) and ``save_state`` into ``output_dir`` (where ``should_save``), first with the arguments as
given, then with ``log_on_each_node`` / ``save_on_each_node`` flipped (``save_metrics("flipped")``).

With ``--direct_eval`` (one process) it also computes the eval loss straight from the model, sample by sample.
Output ``<result_dir>/rank<r>.json``: per phase the logged losses and grad norms, eval loss, prediction digests.
"""
from __future__ import annotations

import copy
import os
import sys
from dataclasses import dataclass, field

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..")))

import numpy as np  # noqa: E402
import paddle  # noqa: E402

from common import TrainerWorkerArguments, exit_cleanly, parse_worker_arguments, write_json  # noqa: E402
from paddletrainer import Trainer  # noqa: E402
from packed_phases import packed_phases  # noqa: E402
from trainer_worker import build_model, finetune_phases, mlp_data, token_data  # noqa: E402

EVAL_SIZE = 13


@dataclass
class PhaseArguments(TrainerWorkerArguments):
    # the phases' own defaults for two of the shared options
    model: str = field(default="llama", metadata={"help": "llama | mlp | moe | moe2"})
    num_samples: int = field(default=48, metadata={"help": "train set size"})
    extended_steps: int = field(default=6, metadata={"help": "max_steps of the resumed runs (0: no resume)"})
    foreign_checkpoint: str = field(default=None, metadata={"help": "a checkpoint saved by another layout"})
    uninterrupted: bool = field(default=False, metadata={"help": "also train extended_steps in one go"})
    stream: bool = field(default=False, metadata={"help": "also run on paddle.io.IterableDataset streams"})
    direct_eval: bool = field(default=False, metadata={"help": "one process: eval loss computed sample by sample"})
    node_files: bool = field(default=False, metadata={"help": "log_metrics/save_state/save_metrics as given and flipped"})
    finetune_only: bool = field(default=False, metadata={"help": "run only the --finetune (and --packed) phases"})
    packed: bool = field(default=False, metadata={"help": "also train on packed rows, both mask formats"})


class Stream(paddle.io.IterableDataset):
    def __init__(self, samples):
        self.samples = samples

    def __iter__(self):
        return iter(self.samples)


def datasets(work: PhaseArguments):
    make = mlp_data if work.model == "mlp" else token_data
    train, evaluation = make(work.num_samples, 0), make(EVAL_SIZE, 1)
    unlabelled = [{k: v for k, v in s.items() if k != "labels"} for s in make(EVAL_SIZE, 2)]
    return train, evaluation, unlabelled


def digest(predictions):
    """Per sample: mean |prediction| and its first value — enough to see each sample once, in order — and, for
    sequence outputs ``[sample, position, ...]``, the mean |prediction| at every position (the positions in order:
    what a sequence cut must put back, e.g. context parallel's head/tail chunks)."""
    p = np.asarray(predictions, dtype="float64").reshape(len(predictions), -1)
    out = {"shape": list(np.shape(predictions)), "mean_abs": np.abs(p).mean(axis=1).tolist(), "first": p[:, 0].tolist()}
    if np.ndim(predictions) >= 3:
        q = np.asarray(predictions, dtype="float64").reshape(len(predictions), np.shape(predictions)[1], -1)
        out["per_position"] = np.abs(q).mean(axis=2).reshape(-1).tolist()
    return out


def curve(trainer):
    history = trainer.state.log_history
    return {"losses": [h["loss"] for h in history if "loss" in h],
            "grad_norms": [h["grad_norm"] for h in history if "grad_norm" in h],
            "global_step": trainer.state.global_step, "max_steps": trainer.state.max_steps}


def run(work, args, output_dir, *, train, max_steps, resume=None, eval_set=None, predict_set=None):
    args = copy.copy(args)
    args.output_dir, args.max_steps, args.resume_from_checkpoint = output_dir, max_steps, resume
    trainer = Trainer(model=build_model(work, args), args=args, train_dataset=train, eval_dataset=eval_set)
    trainer.train()
    result = curve(trainer)
    if eval_set is not None:
        result["eval_loss"] = trainer.evaluate()["eval_loss"]
    if predict_set is not None:
        result["predicted"] = digest(trainer.predict(predict_set).predictions)
    return trainer, result


def direct_eval_loss(model, samples):
    """The mean over exactly these samples of each one's own loss, without the Trainer."""
    model.eval()
    losses = []
    with paddle.no_grad():
        for s in samples:
            inputs = {k: paddle.to_tensor(np.asarray(v)[None]) for k, v in s.items()}
            out = model(**inputs)
            losses.append(float(out[0] if isinstance(out, (tuple, list)) else out))
    return float(np.mean(losses))


def node_facts(trainer, write_files: bool):
    args = trainer.args
    facts = {"process_index": args.process_index, "local_process_index": args.local_process_index,
             "should_log": args.should_log, "should_save": args.should_save,
             "is_local_process_zero": trainer.state.is_local_process_zero,
             "is_world_process_zero": trainer.state.is_world_process_zero}
    if write_files:
        trainer.log_metrics("node", {"marker": 1.0})
        trainer.save_state()
        args.log_on_each_node, args.save_on_each_node = not args.log_on_each_node, not args.save_on_each_node
        facts["flipped"] = {"should_log": args.should_log, "should_save": args.should_save}
        trainer.save_metrics("flipped", {"marker": 1.0}, combined=False)
        sys.stdout.flush()
    return facts


def main():
    work, args = parse_worker_arguments(PhaseArguments)
    train, evaluation, unlabelled = datasets(work)
    base, short_steps = args.output_dir, args.max_steps
    out, trainer = finetune_phases(work, args, os.path.join(base, "finetune"), direct_eval=work.direct_eval)
    if work.packed:
        packed, trainer = packed_phases(work, args, os.path.join(base, "packed"))
        out.update(packed)
    if work.finetune_only:
        out["rank"] = paddle.distributed.get_rank()
        write_json(os.path.join(work.result_dir, f"rank{out['rank']}.json"), out)
        exit_cleanly(trainer.topology)
        return
    trainer, out["short"] = run(work, args, os.path.join(base, "short"), train=train, max_steps=short_steps,
                                eval_set=evaluation, predict_set=unlabelled)
    if work.direct_eval:
        out["short"]["direct_eval_loss"] = direct_eval_loss(trainer.model, evaluation)
    out["node"] = node_facts(trainer, work.node_files)
    # parameters Paddle marks sequence-parallel (their grads need the tp allreduce hook): > 0 iff SP is on
    out["sequence_parallel_params"] = sum(bool(getattr(p, "sequence_parallel", False))
                                          for p in trainer.model.parameters())
    # parameters GroupShardedStage3 sliced across the sharding group (it keeps each one's slice ranges)
    out["stage3_sliced_params"] = len(getattr(trainer.model_wrapped, "_param2buffer", {}))
    own = os.path.join(base, "short", f"checkpoint-{short_steps}")
    if work.extended_steps > 0:
        _, out["extended"] = run(work, args, os.path.join(base, "short"), train=train,
                                 max_steps=work.extended_steps, resume=own)
    if work.foreign_checkpoint:
        _, out["foreign"] = run(work, args, os.path.join(base, "foreign"), train=train,
                                max_steps=work.extended_steps, resume=work.foreign_checkpoint)
    if work.uninterrupted:
        _, out["uninterrupted"] = run(work, args, os.path.join(base, "uninterrupted"), train=train,
                                      max_steps=work.extended_steps)
    if work.stream:
        _, out["stream"] = run(work, args, os.path.join(base, "stream"), train=Stream(train), max_steps=2,
                               eval_set=Stream(evaluation), predict_set=Stream(unlabelled))
    out["rank"] = paddle.distributed.get_rank()
    write_json(os.path.join(work.result_dir, f"rank{out['rank']}.json"), out)
    exit_cleanly(trainer.topology)


if __name__ == "__main__":
    main()
