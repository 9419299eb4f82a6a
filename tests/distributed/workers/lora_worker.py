"""A LoRA run of the tiny Llama (``paddlenlp.peft.LoRAModel`` on q/v projections) through ``paddletrainer.Trainer``.

``--phase train`` (any layout): train, evaluate, ``save_model(<save_dir>)``, then reload the saved adapters with
``LoRAModel.from_pretrained`` onto a fresh base of the same layout and evaluate it again.
``--phase reload`` (one process): only the reload and its evaluation (the one-process reader of a tp2 save).

Output ``<result_dir>/rank<r>.json``: ``base_eval_loss`` (before training) and ``eval_loss`` (trained) of the
train phase, ``reloaded_eval_loss``, per-step ``losses``.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..")))

import paddle  # noqa: E402

from common import exit_cleanly, parse_worker_arguments, write_json  # noqa: E402
from paddletrainer import Trainer  # noqa: E402
from trainer_worker import token_data  # noqa: E402


@dataclass
class LoraWorkerArguments:
    weights: str = field(default=None, metadata={"help": "tiny Llama directory (from_pretrained)"})
    result_dir: str = field(default=None, metadata={"help": "where rank<r>.json goes"})
    save_dir: str = field(default=None, metadata={"help": "save_model's directory (train) / the one read (reload)"})
    phase: str = field(default="train", metadata={"help": "train | reload"})


def base_model(work, args):
    from paddlenlp.transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig.from_pretrained(work.weights)
    config.tensor_parallel_degree = max(args.tensor_parallel_degree, 1)
    config.tensor_parallel_rank = args.tensor_parallel_rank
    config.tensor_parallel_output = False
    return LlamaForCausalLM.from_pretrained(work.weights, config=config, dtype="float32")


def main():
    from paddlenlp.peft import LoRAConfig, LoRAModel

    work, args = parse_worker_arguments(LoraWorkerArguments)
    eval_set = token_data(16, 1)
    result = {}
    if work.phase == "train":
        paddle.seed(7)  # the adapters' init: the same on every tp rank (lora_A of a column layer is replicated)
        model = LoRAModel(base_model(work, args), LoRAConfig(target_modules=[".*q_proj.*", ".*v_proj.*"], r=4,
                                                             lora_alpha=8))
        trainer = Trainer(model=model, args=args, train_dataset=token_data(64, 0), eval_dataset=eval_set)
        result["base_eval_loss"] = trainer.evaluate()["eval_loss"]  # lora_B starts at zero: the base's loss
        trainer.train()
        result["eval_loss"] = trainer.evaluate()["eval_loss"]
        result["losses"] = [h["loss"] for h in trainer.state.log_history if "loss" in h]
        trainer.save_model(work.save_dir)
    reloaded = LoRAModel.from_pretrained(base_model(work, args), work.save_dir)
    evaluator = Trainer(model=reloaded, args=args, eval_dataset=eval_set)
    result["reloaded_eval_loss"] = evaluator.evaluate()["eval_loss"]
    write_json(os.path.join(work.result_dir, f"rank{paddle.distributed.get_rank()}.json"), result)
    exit_cleanly(evaluator.topology)


if __name__ == "__main__":
    main()
