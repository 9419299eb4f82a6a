"""Train the tiny Llama with PaddleNLP's Trainer (``theirs``, ``--unified_checkpoint true`` unless given) or ours
(``ours``), both on the same sequential data order, maybe resuming a checkpoint; write the per-step losses.

``python paddlenlp_unified_worker.py <theirs|ours> <output_dir> <result_dir> <resume or -> [--option value ...]``:
the options are TrainingArguments options of the chosen Trainer (degrees, batch size), and the worker's own:

* ``--lora_base DIR``: the model is a ``paddlenlp.peft.LoRAModel`` (q/v, r 4) over the tiny Llama read from DIR
  (the same frozen base in every run; the adapters' init from the run's seed);
* ``--then_resume true`` (theirs): then resume the run's ``checkpoint-3`` in the same processes (PaddleNLP's own
  resumed losses, ``resumed_losses``);
* ``--then_lora NAME=CKPT,...`` and ``--then_lora_base DIR`` (ours): after the run, resume each LoRA checkpoint
  CKPT in the same processes, the LoRAModel over DIR; its ``{"losses", "global_step"}`` under ``lora[NAME]``.

Output ``<result_dir>/rank<r>.json``: ``{"losses": {step: loss}, "global_step": N, ...}``.
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..")))

import numpy as np  # noqa: E402
import paddle  # noqa: E402

from common import SEQ, VOCAB, exit_cleanly, tiny_llama_config, write_json  # noqa: E402

COMMON = dict(max_steps=6, save_steps=3, logging_steps=1, learning_rate=1e-2, seed=3, lr_scheduler_type="linear",
              warmup_steps=0, report_to="none", disable_tqdm=True)


def token_data(n=64):
    tokens = np.random.RandomState(0).randint(0, VOCAB, size=(n, SEQ + 1)).astype("int64")
    return [{"input_ids": t[:-1], "labels": t[1:]} for t in tokens]


def build_model(tp_degree: int, tp_rank: int, seed: int, lora_base=None):
    from paddlenlp.transformers import LlamaConfig, LlamaForCausalLM

    config = tiny_llama_config() if lora_base is None else LlamaConfig.from_pretrained(lora_base)
    config.tensor_parallel_degree, config.tensor_parallel_rank = max(tp_degree, 1), tp_rank
    config.tensor_parallel_output = False
    if lora_base is None:
        paddle.seed(seed)
        return LlamaForCausalLM(config)
    from paddlenlp.peft import LoRAConfig, LoRAModel

    base = LlamaForCausalLM.from_pretrained(lora_base, config=config, dtype="float32")
    paddle.seed(seed)  # the adapters' init (lora_B starts at zero)
    return LoRAModel(base, LoRAConfig(target_modules=[".*q_proj.*", ".*v_proj.*"], r=4, lora_alpha=8))


def loss_logger(base, losses):
    """A callback class (of ``base``, either Trainer's) keeping ``{step: loss}``."""
    def on_log(self, args, state, control, logs=None, **kw):
        if logs and "loss" in logs:
            losses[state.global_step] = logs["loss"]
    return type("LossLog", (base,), {"on_log": on_log})


def theirs(options, losses, lora_base=None):
    """PaddleNLP's Trainer, sequential batches (its own sampler shuffles)."""
    from paddle.io import DistributedBatchSampler
    from paddlenlp.trainer import Trainer as NLPTrainer
    from paddlenlp.trainer import TrainerCallback as NLPCallback
    from paddlenlp.trainer import TrainingArguments as NLPArguments

    def sampler(self):
        return DistributedBatchSampler(self.train_dataset, batch_size=self.args.per_device_train_batch_size,
                                       shuffle=False, num_replicas=self.args.dataset_world_size,
                                       rank=self.args.dataset_rank)

    if paddle.distributed.get_world_size() > 1 and not paddle.is_compiled_with_cuda():
        # Paddle's CPU build lacks the tensor-parallel ops PaddleNLP's layers call: our gloo fills supply them
        # (Paddle-level collectives only; PaddleNLP's Trainer and layers run unchanged)
        from paddletrainer.parallel.cpu import install

        install()
    args = NLPArguments(**{"unified_checkpoint": True, **options})
    model = build_model(args.tensor_parallel_degree, args.tensor_parallel_rank, seed=2024, lora_base=lora_base)
    trainer = type("Theirs", (NLPTrainer,), {"_get_train_sampler": sampler})(
        model=model, args=args, train_dataset=token_data(), callbacks=[loss_logger(NLPCallback, losses)()])
    return trainer


def ours(options, losses, lora_base=None):
    """Our Trainer: the layout-free global order, not shuffled (the same batches as ``theirs``)."""
    from paddletrainer import Trainer, TrainerCallback, TrainingArguments
    from paddletrainer.data import GlobalBatchSampler

    def sampler(self):
        a, t = self.args, self.topology
        return GlobalBatchSampler(len(self.train_dataset), a.per_device_train_batch_size, t.data_rank,
                                  t.data_world_size, seed=a.seed, shuffle=False, step_span=a.global_batch_size)

    args = TrainingArguments(**options)
    # other initial weights than PaddleNLP's run: every weight must come from the resumed checkpoint
    model = build_model(args.tensor_parallel_degree, args.tensor_parallel_rank, seed=7, lora_base=lora_base)
    return type("Ours", (Trainer,), {"_get_train_sampler": sampler})(
        model=model, args=args, train_dataset=token_data(), callbacks=[loss_logger(TrainerCallback, losses)()])


def _value(text):
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    return int(text) if text.lstrip("-").isdigit() else text


def main(which, output_dir, result_dir, resume, *rest):
    options = dict(COMMON, output_dir=output_dir)
    for name, value in zip(rest[::2], rest[1::2]):
        options[name.lstrip("-")] = _value(value)
    lora_base, then_resume = options.pop("lora_base", None), options.pop("then_resume", False)
    then_lora = [item.split("=", 1) for item in options.pop("then_lora", "").split(",") if item]
    then_lora_base = options.pop("then_lora_base", None)
    build = theirs if which == "theirs" else ours
    losses = {}
    trainer = build(dict(options), losses, lora_base)
    trainer.train(resume_from_checkpoint=None if resume == "-" else resume)
    result = {"losses": losses, "global_step": trainer.state.global_step}
    if then_resume:  # PaddleNLP resuming its own checkpoint-3, in the processes (and layout) that wrote it
        result["resumed_losses"] = {}
        with paddle.utils.unique_name.guard():  # parameter names as in a process of its own: the .pdopt keys
            again = build(dict(options, output_dir=output_dir + "_resumed"), result["resumed_losses"], lora_base)
            again.train(resume_from_checkpoint=os.path.join(output_dir, "checkpoint-3"))
    result["lora"] = {}
    for name, checkpoint in then_lora:
        lora_losses = {}
        with paddle.utils.unique_name.guard():
            lora = build(dict(options, output_dir=f"{output_dir}_{name}"), lora_losses, then_lora_base)
            lora.train(resume_from_checkpoint=checkpoint)
        result["lora"][name] = {"losses": lora_losses, "global_step": lora.state.global_step}
    rank = paddle.distributed.get_rank()
    write_json(os.path.join(result_dir, f"rank{rank}.json"), result)
    if which == "ours":
        exit_cleanly(trainer.topology)


if __name__ == "__main__":
    main(*sys.argv[1:])
