"""Train the tiny Llama on packed rows (PaddleNLP's zero-padding formats) through the public Trainer, once per
mask format; write what ``test_packed_layouts.py`` compares with one process.

Rows of 16 tokens, each several fine-tuning documents (2-token prompts labelled -100) with positions restarting per
document, packed by ``paddletrainer.data.pack_dataset``: FlashMask's ``attn_mask_startend_row_indices`` or the
block-diagonal ``attention_mask``. Each format trains 3 steps from the same saved weights and evaluates on 6 packed
rows. Output ``<result_dir>/rank<r>.json``: per format, the logged losses and grad norms and the eval loss.
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..")))

import numpy as np  # noqa: E402
import paddle  # noqa: E402

from common import SEQ, VOCAB, TrainerWorkerArguments, exit_cleanly, parse_worker_arguments, write_json  # noqa: E402
from paddletrainer import Trainer  # noqa: E402
from paddletrainer.data import pack_dataset  # noqa: E402
from trainer_worker import build_model  # noqa: E402

FORMATS = ("startend", "attention_mask")


def documents(rows, seed):
    """Documents that fill ``rows`` rows of SEQ tokens exactly (2 to 8 tokens each, the first two labelled -100)."""
    rng = np.random.RandomState(seed)
    docs = []
    for _ in range(rows):
        left = SEQ
        while left:
            n = left if left <= 8 else int(rng.randint(2, min(8, left - 2) + 1))
            ids = rng.randint(1, VOCAB, size=n)
            docs.append({"input_ids": ids.tolist(), "labels": [-100, -100][:n] + ids[2:].tolist()})
            left -= n
    return docs


def main():
    work, args = parse_worker_arguments(TrainerWorkerArguments)
    train_docs, eval_docs = documents(work.num_samples, 0), documents(6, 1)
    results = {}
    root = args.output_dir
    for mask_format in FORMATS:
        train = pack_dataset(train_docs, SEQ, mask_format=mask_format, greedy=False)
        evaluation = pack_dataset(eval_docs, SEQ, mask_format=mask_format, greedy=False)
        assert len(train) == work.num_samples and all(len(row["input_ids"]) == SEQ for row in train)
        args.output_dir = os.path.join(root, mask_format)
        trainer = Trainer(model=build_model(work, args), args=args, train_dataset=train, eval_dataset=evaluation)
        trainer.train()
        history = trainer.state.log_history
        results[mask_format] = {"losses": [h["loss"] for h in history if "loss" in h],
                                "grad_norms": [h["grad_norm"] for h in history if "grad_norm" in h],
                                "trained_tokens_per_second": [h["trained_tokens_per_second"] for h in history
                                                              if "trained_tokens_per_second" in h],
                                "eval_loss": trainer.evaluate()["eval_loss"]}
    write_json(os.path.join(work.result_dir, f"rank{paddle.distributed.get_rank()}.json"), results)
    exit_cleanly(trainer.topology)


if __name__ == "__main__":
    main()
