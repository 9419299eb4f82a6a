"""Train PaddleNLP 3.0.0b4's Qwen2-MoE with paddletrainer's Trainer under Paddle 3.3.1.

PaddleNLP's MoE gate needs two fixes under Paddle 3.3.1 (an int64/int32 type error, and a dispatch mask that
passes a spurious gradient to the router): ``paddlenlp_qwen2_moe_fix.install()`` applies them in memory before
the model is built; docs/paddlenlp_compat.md explains both.

CPU quick run, one process (a 2-layer, 4-expert model on the Llama example's token files, ~1 minute):
    python llm_examples/moe/train_qwen2_moe.py llm_examples/moe/qwen2_moe_quickstart.json

CPU, 2 processes, data parallel (PaddleNLP's MoELayer keeps every expert on every rank here: paddletrainer's
plain dp does not initialise fleet, which that layer needs to split experts; for expert parallel use
paddletrainer.moe.MoELayer, run_pretrain.py in this folder):
    python -m paddle.distributed.launch --nproc_per_node 2 \
        llm_examples/moe/train_qwen2_moe.py llm_examples/moe/qwen2_moe_quickstart.json \
        --output_dir output/qwen2_moe_dp2
"""
import math
import os
import sys
from dataclasses import dataclass, field

from paddlenlp.transformers import Qwen2MoeConfig, Qwen2MoeForCausalLM

import paddlenlp_qwen2_moe_fix
from paddletrainer import PdArgumentParser, Trainer, TrainingArguments, default_data_collator, set_seed
from paddletrainer.data.pretrain import PretrainTokenDataset
from paddletrainer.errors import main_guard

HERE = os.path.dirname(os.path.abspath(__file__))


@dataclass
class ModelArguments:
    model_name_or_path: str = field(
        default=os.path.join(HERE, "tiny_qwen2_moe"),
        metadata={"help": "Local directory with a Qwen2-MoE config.json; weights are loaded when present, else "
                          "random init."})


@dataclass
class DataArguments:
    input_dir: str = field(
        default=os.path.join(HERE, "..", "llama", "data", "tokens"),
        metadata={"help": "Token files of scripts/build_pretrain_data.py: a prefix or a directory with one *.ids.npy."})
    max_seq_length: int = field(default=64, metadata={"help": "Tokens per training sample."})
    eval_fraction: float = field(default=0.05, metadata={"help": "Tail of the packed samples held out for eval."})


def build_model(model_args, data_args):
    """PaddleNLP's Qwen2-MoE (random init unless the directory holds weights), after the gate fixes."""
    paddlenlp_qwen2_moe_fix.install()  # before the first forward; refuses a PaddleNLP it was not written for
    config = Qwen2MoeConfig.from_pretrained(model_args.model_name_or_path)
    if data_args.max_seq_length > config.max_position_embeddings:
        raise ValueError(f"max_seq_length {data_args.max_seq_length} > max_position_embeddings "
                         f"{config.max_position_embeddings} of {model_args.model_name_or_path}")
    path = model_args.model_name_or_path
    if any(name.endswith((".pdparams", ".safetensors")) for name in os.listdir(path)):
        return Qwen2MoeForCausalLM.from_pretrained(path, config=config), config
    return Qwen2MoeForCausalLM.from_config(config), config


def main():
    parser = PdArgumentParser((ModelArguments, DataArguments, TrainingArguments))
    if len(sys.argv) >= 2 and sys.argv[1].endswith(".json"):
        model_args, data_args, training_args = parser.parse_json_file_and_cmd_lines()
    else:
        model_args, data_args, training_args = parser.parse_args_into_dataclasses()
    set_seed(training_args.seed)
    dataset = PretrainTokenDataset(data_args.input_dir, data_args.max_seq_length)
    train_dataset, eval_dataset = dataset.split(data_args.eval_fraction if training_args.do_eval else 0.0)
    model, config = build_model(model_args, data_args)
    if dataset.meta.get("vocab_size", 0) > config.vocab_size:
        raise ValueError(f"token files use a vocab of {dataset.meta['vocab_size']} but the model has "
                         f"{config.vocab_size}: set vocab_size in {model_args.model_name_or_path}/config.json")
    trainer = Trainer(model=model, args=training_args, data_collator=default_data_collator,
                      train_dataset=train_dataset if training_args.do_train else None,
                      eval_dataset=eval_dataset if training_args.do_eval else None)
    if training_args.do_train:
        result = trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
        trainer.save_model()
        trainer.log_metrics("train", result.metrics)
        trainer.save_metrics("train", result.metrics)
    if training_args.do_eval:
        metrics = trainer.evaluate()
        metrics["eval_perplexity"] = math.exp(metrics["eval_loss"])
        trainer.log_metrics("eval", metrics)
        trainer.save_metrics("eval", metrics)


if __name__ == "__main__":
    main_guard(main)  # bad input → "error: <one line>", exit 2; SIGTERM → checkpoint, exit 143
