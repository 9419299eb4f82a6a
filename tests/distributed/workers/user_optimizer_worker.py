"""Train the tiny Llama with an optimizer the user built: parameter groups, frozen layers and ``grad_clip``.

A PaddleNLP script passes its own optimizer as ``Trainer(optimizers=(optimizer, scheduler))``. This worker does
exactly that, once per clip variant, in one launch:

* ``none``: no ``grad_clip`` (PaddleNLP then clips nothing: ``max_grad_norm`` only shapes the optimizer its
  Trainer builds itself);
* ``optimizer``: ``grad_clip=ClipGradByGlobalNorm`` on the optimizer, which Paddle applies to each parameter
  group separately (each group's own norm);
* ``per_group``: a different ``ClipGradByGlobalNorm`` in each group's dict.

The groups: attention weights at half the learning rate with weight decay 0.1, everything else trainable at the
full rate with no decay; the embedding and every input norm are frozen. ``--implementation paddlenlp`` runs PaddleNLP's own
Trainer (one process: the reference), ``--implementation paddletrainer`` ours (any layout).

Output ``<result_dir>/rank<r>.json``: ``{variant: {"losses": [...], "eval_loss": x}}``.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..")))

import paddle  # noqa: E402

from common import exit_cleanly, write_json  # noqa: E402
from trainer_worker import token_data  # noqa: E402

VARIANTS = ("none", "optimizer", "per_group")
FROZEN = ("embed_tokens", "input_layernorm")  # the same structured-name parts in LlamaForCausalLM and its Pipe


@dataclass
class UserOptimizerArguments:
    implementation: str = field(default="paddletrainer", metadata={"help": "whose Trainer: paddletrainer | paddlenlp"})
    weights: str = field(default=None, metadata={"help": "tiny Llama directory (from_pretrained)"})
    result_dir: str = field(default=None, metadata={"help": "where rank<r>.json goes"})
    variants: str = field(default=",".join(VARIANTS), metadata={"help": "comma-separated clip variants"})


def build_llama(work, args):
    from paddlenlp.transformers import LlamaConfig, LlamaForCausalLM, LlamaForCausalLMPipe

    config = LlamaConfig.from_pretrained(work.weights)
    config.tensor_parallel_degree = max(args.tensor_parallel_degree, 1)
    config.tensor_parallel_rank = args.tensor_parallel_rank
    config.tensor_parallel_output = False
    cls = LlamaForCausalLMPipe if args.pipeline_parallel_degree > 1 else LlamaForCausalLM
    return cls.from_pretrained(work.weights, config=config, dtype="float32")


def _role(structured_name: str) -> str:
    """Which group a parameter belongs to, from its structured name (the same in LlamaForCausalLM and its Pipe
    variant, whose names carry the layer index differently but keep these parts)."""
    if any(part in structured_name for part in FROZEN):
        return "frozen"
    return "attention" if "self_attn" in structured_name else "rest"


def user_optimizer(model, variant: str):
    """The optimizer a PaddleNLP user writes: AdamW over two groups, frozen layers left out."""
    groups = {"attention": [], "rest": []}
    for name, param in model.named_parameters():
        role = _role(name)
        if role == "frozen":
            param.stop_gradient = True
        else:
            groups[role].append(param)
    schedule = paddle.optimizer.lr.LinearWarmup(learning_rate=3e-3, warmup_steps=2, start_lr=0.0, end_lr=3e-3)
    attention = {"params": groups["attention"], "learning_rate": 0.5, "weight_decay": 0.1}
    rest = {"params": groups["rest"], "weight_decay": 0.0}
    clip = None
    if variant == "optimizer":
        clip = paddle.nn.ClipGradByGlobalNorm(0.05)
    elif variant == "per_group":
        attention["grad_clip"] = paddle.nn.ClipGradByGlobalNorm(0.02)
        rest["grad_clip"] = paddle.nn.ClipGradByGlobalNorm(0.3)
    optimizer = paddle.optimizer.AdamW(learning_rate=schedule, parameters=[attention, rest], grad_clip=clip)
    return optimizer, schedule


def run(work, args, variant: str):
    if work.implementation == "paddlenlp":
        from paddlenlp.trainer import Trainer, TrainerCallback
    else:
        from paddletrainer import Trainer, TrainerCallback
    losses = []

    class RecordLoss(TrainerCallback):  # both trainers hand every logged dict to on_log
        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "loss" in logs:
                losses.append(float(logs["loss"]))

    model = build_llama(work, args)
    optimizer, schedule = user_optimizer(model, variant)
    trainer = Trainer(model=model, args=args, train_dataset=token_data(48, 0), eval_dataset=token_data(16, 1),
                      optimizers=(optimizer, schedule), callbacks=[RecordLoss()])
    trainer.train()
    return trainer, {"losses": losses, "eval_loss": trainer.evaluate()["eval_loss"]}


def main():
    from paddletrainer import PdArgumentParser, TrainingArguments

    if sys.argv[sys.argv.index("--implementation") + 1] == "paddlenlp":
        from paddlenlp.trainer import PdArgumentParser, TrainingArguments  # noqa: F811 (the reference's own)
    work, args = PdArgumentParser((UserOptimizerArguments, TrainingArguments)).parse_args_into_dataclasses()
    results, trainer = {}, None
    for variant in work.variants.split(","):
        trainer, results[variant] = run(work, args, variant)
    write_json(os.path.join(work.result_dir, f"rank{paddle.distributed.get_rank()}.json"), results)
    if work.implementation == "paddletrainer":
        exit_cleanly(trainer.topology)


if __name__ == "__main__":
    main()
