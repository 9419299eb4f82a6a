"""Train PaddleNLP's tiny GPT and Qwen2 with tied input and output embeddings through ``paddletrainer.Trainer``.

Under pipeline parallel each is its ``...ForCausalLMPipe`` class, which shares the embedding between the first
and the last stage (``SharedLayerDesc``); in one process the plain ``...ForCausalLM``. GPT's Pipe class has no
``_prepare_pipeline_inputs_func``: the Trainer must split the dict batches itself. With ``--save_weights`` (one
process) the models are first built with a fixed seed and saved under ``--weights``; every run loads them.

Output ``<result_dir>/rank<r>.json``: per model the logged losses and grad norms and the eval loss.
"""
from __future__ import annotations

import copy
import os
import sys
from dataclasses import dataclass, field

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..")))

import paddle  # noqa: E402

from common import SEQ, VOCAB, exit_cleanly, parse_worker_arguments, write_json  # noqa: E402
from paddletrainer import Trainer  # noqa: E402
from trainer_worker import token_data  # noqa: E402

MODELS = ("gpt", "qwen2")


@dataclass
class TiedWorkerArguments:
    weights: str = field(default=None, metadata={"help": "directory holding gpt/ and qwen2/ (from_pretrained)"})
    result_dir: str = field(default=None, metadata={"help": "where rank<r>.json goes"})
    save_weights: bool = field(default=False, metadata={"help": "first build and save both models (one process)"})


def tiny_config(name: str):
    from paddlenlp.transformers import GPTConfig, Qwen2Config

    common = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
                  max_position_embeddings=SEQ, tie_word_embeddings=True, initializer_range=0.1, dtype="float32")
    if name == "gpt":
        return GPTConfig(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, **common)
    return Qwen2Config(num_key_value_heads=2, rms_norm_eps=1e-6, use_flash_attention=False, **common)


def model_class(name: str, pipeline: bool):
    from paddlenlp.transformers import GPTForCausalLM, GPTForCausalLMPipe, Qwen2ForCausalLM, Qwen2ForCausalLMPipe

    classes = {"gpt": (GPTForCausalLM, GPTForCausalLMPipe), "qwen2": (Qwen2ForCausalLM, Qwen2ForCausalLMPipe)}
    return classes[name][int(pipeline)]


def save_weights(directory: str) -> None:
    for name in MODELS:
        paddle.seed(2024)
        model_class(name, pipeline=False)(tiny_config(name)).save_pretrained(os.path.join(directory, name))


def build_model(name: str, weights: str, args):
    path = os.path.join(weights, name)
    config = type(tiny_config(name)).from_pretrained(path)
    # as PaddleNLP's llm scripts do (reading a rank sets up the process groups the Pipe classes build on)
    config.tensor_parallel_degree = max(args.tensor_parallel_degree, 1)
    config.tensor_parallel_rank = args.tensor_parallel_rank
    config.virtual_pp_degree = args.parallel_config.virtual_pp_degree
    return model_class(name, args.pipeline_parallel_degree > 1).from_pretrained(path, config=config, dtype="float32")


def train(name: str, work: TiedWorkerArguments, args) -> dict:
    args = copy.copy(args)
    args.output_dir = os.path.join(args.output_dir, name)
    trainer = Trainer(model=build_model(name, work.weights, args), args=args, train_dataset=token_data(48, 0),
                      eval_dataset=token_data(16, 1))
    trainer.train()
    history = trainer.state.log_history
    return {"losses": [h["loss"] for h in history if "loss" in h],
            "grad_norms": [h["grad_norm"] for h in history if "grad_norm" in h],
            "eval_loss": trainer.evaluate()["eval_loss"], "topology": trainer.topology}


def main():
    work, args = parse_worker_arguments(TiedWorkerArguments)
    if work.save_weights:
        save_weights(work.weights)
    results = {name: train(name, work, args) for name in MODELS}
    topology = results["gpt"].pop("topology")
    results["qwen2"].pop("topology")
    rank = paddle.distributed.get_rank()
    write_json(os.path.join(work.result_dir, f"rank{rank}.json"), {"rank": rank, **results})
    exit_cleanly(topology)


if __name__ == "__main__":
    main()
