"""Run ``paddletrainer.Trainer`` end to end on one layout; write what the tests compare.

Arguments are the user's: ``common.TrainerWorkerArguments`` plus every ``TrainingArguments`` option, parsed by
``PdArgumentParser`` exactly as a training script would. Run under ``paddle.distributed.launch`` for a
parallel layout, or plainly for the single-process reference.

Output ``<result_dir>/rank<r>.json``: per-step ``losses`` and ``grad_norms`` from the log history, the
final ``eval_loss``, the trainer's ``training_loss``, ``global_step`` and where checkpoints went.
"""
from __future__ import annotations

import copy
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
sys.path.insert(0, REPO)
sys.path.append(os.path.join(REPO, "tests", "unit"))  # finetune_data

import numpy as np  # noqa: E402
import paddle  # noqa: E402

from common import (GLOBAL_BATCH, SEQ, VOCAB, TrainerWorkerArguments, exit_cleanly, parse_worker_arguments,  # noqa: E402
                    write_json)
from finetune_data import direct_token_mean, finetune_samples  # noqa: E402
from paddletrainer import Trainer, TrainingArguments  # noqa: E402
from paddletrainer.trainer_utils import SchedulerType  # noqa: E402
from paddletrainer.parallel.pipeline import check_virtual_pipeline_split  # noqa: E402


class MLP(paddle.nn.Layer):
    """8 → 32 → 1 regression net returning (loss, prediction)."""

    def __init__(self):
        super().__init__()
        self.net = paddle.nn.Sequential(paddle.nn.Linear(8, 32), paddle.nn.ReLU(), paddle.nn.Linear(32, 1))

    def forward(self, x, labels=None):
        pred = self.net(x).squeeze(-1)
        if labels is None:
            return (pred,)
        return paddle.nn.functional.mse_loss(pred, labels), pred


def mlp_data(n, seed):
    rng = np.random.RandomState(seed)
    x = rng.randn(n, 8).astype("float32")
    y = (x[:, :1] * 0.5 - x[:, 1:2]).squeeze(-1).astype("float32")
    return [{"x": x[i], "labels": y[i]} for i in range(n)]


def token_data(n, seed):
    tokens = np.random.RandomState(seed).randint(0, VOCAB, size=(n, SEQ + 1)).astype("int64")
    return [{"input_ids": t[:-1], "labels": t[1:]} for t in tokens]


def build_model(work: TrainerWorkerArguments, args: TrainingArguments):
    if work.model == "mlp":
        paddle.seed(1234)  # identical initial weights in every process and layout
        return MLP()
    if work.model in ("moe", "moe2"):  # moe2: two MoE blocks (one per stage under pipeline parallel)
        from moe_model import build_moe_model
        return build_moe_model(args, moe_layers=2 if work.model == "moe2" else 1)
    from paddlenlp.transformers import LlamaConfig, LlamaForCausalLM, LlamaForCausalLMPipe

    # The PaddleNLP way: degrees and ranks from the training arguments, read before any Trainer exists.
    config = LlamaConfig.from_pretrained(work.weights)
    vpp = args.parallel_config.virtual_pp_degree  # virtual_pipeline_model_parallel_size, 1 when unset
    check_virtual_pipeline_split(config.num_hidden_layers, args.pipeline_parallel_degree, vpp)
    config.tensor_parallel_degree = max(args.tensor_parallel_degree, 1)
    config.tensor_parallel_rank = args.tensor_parallel_rank
    config.tensor_parallel_output = False
    config.virtual_pp_degree = vpp  # as PaddleNLP's llm scripts copy it to the config
    config.sequence_parallel = args.sequence_parallel  # likewise: the model builds the SP layers and ops
    config.sep_parallel_degree = max(args.sep_parallel_degree, 1)  # likewise: the sep attention (ReshardLayer)
    config.context_parallel_degree = max(args.context_parallel_degree, 1)  # likewise: the ring attention path,
    if config.context_parallel_degree > 1:  # which Llama runs only on its flash-attention path
        config.use_flash_attention = True
    # the fused layout loads the saved (unfused) weights through PaddleNLP's fuse conversion in from_pretrained
    config.fuse_attention_qkv, config.fuse_attention_ffn = work.fuse_attention_qkv, work.fuse_attention_ffn
    cls = LlamaForCausalLMPipe if args.pipeline_parallel_degree > 1 else LlamaForCausalLM
    return cls.from_pretrained(work.weights, config=config, dtype="float32")


def token_metrics(prediction):
    """Next-token accuracy and mean |logit|: a check that evaluation hands compute_metrics the real logits."""
    logits, labels = prediction.predictions, prediction.label_ids
    return {"accuracy": float((logits.argmax(-1) == labels).mean()), "mean_abs_logit": float(np.abs(logits).mean())}


def finetune_phases(work: TrainerWorkerArguments, args: TrainingArguments, output_dir: str, direct_eval=False):
    """``--finetune``: 3 steps of 8 fine-tuning documents (prompts labelled -100, right-padded) and ``evaluate()``
    on 13 more, once per listed accumulation ('own': the launch's arguments; a number n: per-device batch
    8 / (n × data ranks), layouts without pipeline only). ``{phase: {losses, grad_norms, eval_loss}}``, phases
    ``finetune`` (own) and ``finetune_ga<n>``; with ``direct_eval`` the own phase also has the trained model's
    token mean over the eval documents computed without the Trainer (``direct_eval_loss``)."""
    out, trainer = {}, None
    for which in filter(None, work.finetune.split(",")):
        run_args = copy.copy(args)
        name = "finetune"
        if which != "own":
            name = f"finetune_ga{which}"
            run_args.gradient_accumulation_steps = int(which)
            run_args.per_device_train_batch_size = GLOBAL_BATCH // (int(which) * args.dataset_world_size)
        run_args.output_dir, run_args.max_steps, run_args.resume_from_checkpoint = os.path.join(output_dir, name), 3, None
        run_args.save_strategy, run_args.logging_steps = "no", 1
        run_args.lr_scheduler_type, run_args.learning_rate, run_args.max_grad_norm = SchedulerType.CONSTANT, 0.01, 0.8
        trainer = Trainer(model=build_model(work, run_args), args=run_args,
                          train_dataset=finetune_samples(3 * GLOBAL_BATCH, 0))
        trainer.train()
        history = trainer.state.log_history
        evaluation = finetune_samples(13, 1)
        out[name] = {"losses": [h["loss"] for h in history if "loss" in h],
                     "grad_norms": [h["grad_norm"] for h in history if "grad_norm" in h],
                     "eval_loss": trainer.evaluate(evaluation)["eval_loss"]}
        if direct_eval and which == "own":
            out[name]["direct_eval_loss"] = direct_token_mean(trainer.model, evaluation)
    return out, trainer


def main():
    work, args = parse_worker_arguments(TrainerWorkerArguments)
    model = build_model(work, args)
    make = mlp_data if work.model == "mlp" else token_data
    trainer = Trainer(model=model, args=args, train_dataset=make(work.num_samples, 0), eval_dataset=make(16, 1),
                      compute_metrics=token_metrics if work.model == "llama" else None)
    out = trainer.train()
    eval_metrics = trainer.evaluate()
    history = trainer.state.log_history
    predicted = None
    if work.model == "llama":  # predict() on inputs without labels: logits only, in dataset order
        unlabeled = [{"input_ids": sample["input_ids"]} for sample in token_data(6, 2)]
        logits = trainer.predict(unlabeled).predictions
        predicted = {"shape": list(logits.shape), "row_mean_abs": np.abs(logits).mean(axis=(1, 2)).tolist()}
    write_json(
        os.path.join(work.result_dir, f"rank{paddle.distributed.get_rank()}.json"),
        {
            "losses": [h["loss"] for h in history if "loss" in h],
            "grad_norms": [h["grad_norm"] for h in history if "grad_norm" in h],
            "eval_loss": eval_metrics["eval_loss"],
            "eval_metrics": {k: v for k, v in eval_metrics.items() if k in ("eval_accuracy", "eval_mean_abs_logit")},
            "training_loss": out.training_loss,
            "predicted": predicted,
            "global_step": trainer.state.global_step,
            "consumed_samples": trainer.state.consumed_samples,
            **finetune_phases(work, args, os.path.join(args.output_dir, "finetune"))[0],
        },
    )
    exit_cleanly(trainer.topology)  # see common.exit_cleanly: gloo teardown at exit is not ordered


if __name__ == "__main__":
    main()
