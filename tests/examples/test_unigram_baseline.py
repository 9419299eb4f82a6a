"""run_pretrain.unigram_perplexity: the reference the Llama example's held-out perplexity is compared with."""

import numpy as np
import pytest

from .helpers import LLAMA, load_module
from paddletrainer.data.pretrain import PretrainTokenDataset

run_pretrain = load_module(LLAMA / "run_pretrain.py", "run_pretrain")


def test_unigram_perplexity_counts_train_targets_and_scores_the_held_out_targets(tmp_path):
    # Windows of 4 over 13 tokens: 3 windows; the last one is held out.
    ids = np.array([1, 0, 0, 0, 1, 0, 0, 0, 1, 2, 2, 2, 2], dtype=np.uint16)
    np.save(tmp_path / "c.ids.npy", ids)
    np.save(tmp_path / "c.idx.npy", np.array([0, 13], dtype=np.int64))
    train, held_out = PretrainTokenDataset(str(tmp_path / "c"), 4).split(1 / 3)
    assert run_pretrain.target_tokens(train).tolist() == [0, 0, 0, 1, 0, 0, 0, 1]
    assert run_pretrain.target_tokens(held_out).tolist() == [2, 2, 2, 2]
    # Counts 6/2/0 of ids 0/1/2, plus one each over a vocab of 3: p(2) = 1/11.
    assert run_pretrain.unigram_perplexity(train, held_out, vocab_size=3) == pytest.approx(11.0)
