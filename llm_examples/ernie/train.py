"""Fine-tune ERNIE for sentence sentiment classification (ChnSentiCorp format) with paddletrainer.

CPU quick run on the bundled sample (tiny random-init model, about a minute; dev accuracy ~0.99):
    python llm_examples/ernie/train.py llm_examples/ernie/quickstart.json

Roughly the same run, all on the command line:
    python llm_examples/ernie/train.py --output_dir output/ernie --do_train --do_eval --do_predict \
        --num_train_epochs 6 --per_device_train_batch_size 32 --learning_rate 1e-3 --max_seq_length 64 --device cpu

Real data / real model (a local ernie-3.0-medium-zh directory and the ChnSentiCorp .tsv files), 4 GPUs:
    python -m paddle.distributed.launch --devices 0,1,2,3 llm_examples/ernie/train.py \
        --model_name_or_path /path/to/ernie-3.0-medium-zh --data_dir /path/to/chnsenticorp \
        --output_dir output/ernie-chnsenticorp --do_train --do_eval --do_predict --max_seq_length 128 \
        --per_device_train_batch_size 32 --learning_rate 5e-5 --num_train_epochs 3 --fp16
"""
import json
import os
import sys
from dataclasses import dataclass, field

import numpy as np
from paddlenlp.transformers import AutoTokenizer, ErnieConfig, ErnieForSequenceClassification

from chnsenticorp import load_split
from paddletrainer import (
    DataCollatorWithPadding,
    EvalPrediction,
    PdArgumentParser,
    Trainer,
    TrainingArguments,
    get_last_checkpoint,
    set_seed,
)
from paddletrainer.robustness import main_guard

HERE = os.path.dirname(os.path.abspath(__file__))


@dataclass
class ModelArguments:
    model_name_or_path: str = field(
        default=os.path.join(HERE, "tiny_ernie"),
        metadata={"help": "Local model directory (config.json [+ weights] + vocab). Without weights the "
                          "model is randomly initialised from config.json."},
    )
    num_labels: int = field(default=2, metadata={"help": "Number of sentiment classes."})


@dataclass
class DataArguments:
    data_dir: str = field(
        default=os.path.join(HERE, "data"),
        metadata={"help": "Directory with train/dev/test as .tsv (ChnSentiCorp header format) or .json lines."},
    )
    max_seq_length: int = field(default=128, metadata={"help": "Longer texts are truncated."})


def load_model(path, num_labels):
    """``from_pretrained`` when ``path`` holds weights; random init from its config.json otherwise.

    paddlenlp's ``from_pretrained`` raises on a directory without a weights file, and the bundled
    tiny model deliberately ships none (it is trained from scratch in the quick run).
    """
    has_weights = os.path.isdir(path) and any(
        name.endswith((".pdparams", ".safetensors")) for name in os.listdir(path))
    if os.path.isdir(path) and not has_weights:
        return ErnieForSequenceClassification(ErnieConfig.from_pretrained(path, num_labels=num_labels))
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
    parser = PdArgumentParser((ModelArguments, DataArguments, TrainingArguments))
    if len(sys.argv) >= 2 and sys.argv[1].endswith(".json"):
        model_args, data_args, training_args = parser.parse_json_file_and_cmd_lines()
    else:
        model_args, data_args, training_args = parser.parse_args_into_dataclasses()
    set_seed(training_args.seed)

    tokenizer = AutoTokenizer.from_pretrained(model_args.model_name_or_path)
    model = load_model(model_args.model_name_or_path, model_args.num_labels)
    splits = {s: tokenize(load_split(data_args.data_dir, s), tokenizer, data_args.max_seq_length)
              for s, wanted in (("train", training_args.do_train), ("dev", training_args.do_eval),
                                ("test", training_args.do_predict)) if wanted}

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
        test_examples = load_split(data_args.data_dir, "test")
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


if __name__ == "__main__":
    main_guard(main)  # bad input → "error: <one line>", exit 2; SIGTERM → checkpoint, exit 143
