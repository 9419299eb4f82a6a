"""``--packed``: the tiny Llama trained on packed rows (PaddleNLP's zero-padding formats) through the public Trainer,
once per mask format, in the layout launches of ``trainer_phases_worker.py``.

Rows of 16 tokens, each several fine-tuning documents (2-token prompts labelled -100) with positions restarting per
document, packed by ``paddletrainer.data.pack_dataset``: FlashMask's ``attn_mask_startend_row_indices``
(``packed_startend``) or the block-diagonal ``attention_mask`` (``packed_attention_mask``). Each trains 3 steps of 8
rows from the launch's arguments and evaluates on 6 packed rows: ``{phase: {losses, grad_norms, eval_loss,
trained_tokens_per_second}}``.
"""
from __future__ import annotations

import copy
import os

import numpy as np

from common import GLOBAL_BATCH, SEQ, VOCAB
from paddletrainer import Trainer
from paddletrainer.data import pack_dataset
from paddletrainer.trainer_utils import SchedulerType
from trainer_worker import build_model

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


def packed_phases(work, args, output_dir):
    """Both formats' phases (see module) and the last Trainer."""
    out, trainer = {}, None
    train_docs, eval_docs = documents(3 * GLOBAL_BATCH, 0), documents(6, 1)
    for mask_format in FORMATS:
        train = pack_dataset(train_docs, SEQ, mask_format=mask_format, greedy=False)
        evaluation = pack_dataset(eval_docs, SEQ, mask_format=mask_format, greedy=False)
        assert len(train) == 3 * GLOBAL_BATCH and all(len(row["input_ids"]) == SEQ for row in train)
        run_args = copy.copy(args)
        run_args.output_dir, run_args.max_steps, run_args.resume_from_checkpoint = (
            os.path.join(output_dir, mask_format), 3, None)
        run_args.save_strategy, run_args.logging_steps = "no", 1
        run_args.lr_scheduler_type, run_args.learning_rate, run_args.max_grad_norm = SchedulerType.CONSTANT, 0.01, 0.8
        trainer = Trainer(model=build_model(work, run_args), args=run_args, train_dataset=train)
        trainer.train()
        history = trainer.state.log_history
        out[f"packed_{mask_format}"] = {
            "losses": [h["loss"] for h in history if "loss" in h],
            "grad_norms": [h["grad_norm"] for h in history if "grad_norm" in h],
            "trained_tokens_per_second": [h["trained_tokens_per_second"] for h in history
                                          if "trained_tokens_per_second" in h],
            "eval_loss": trainer.evaluate(evaluation)["eval_loss"]}
    return out, trainer
