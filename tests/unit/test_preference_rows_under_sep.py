"""Preference rows (PaddleNLP's DPO packing: ``prompt · chosen · rejected``, the rejected response seeing the prompt
but not the chosen one, its positions restarting after the prompt) under sep, on one process: the mask travels as
key ends and gives dense masked attention's result, positions that rope at the sequence index would get wrong are
detected and kept whole by the cut, and the rope turn of ``packed_attention`` gives rope at the true positions.
The sep2 DPO launch against one process is in tests/distributed/test_dpo_layouts.py."""
import math

import numpy as np
import paddle
import pytest

from paddletrainer.parallel import packed_attention
from paddletrainer.parallel.flashmask import flashmask_attention
from paddletrainer.parallel.segment import shard_sequence
from paddletrainer.parallel.sequence_cut import _block_mask_ends, _positions_shift_scores
from paddletrainer.trl import preference_collate_fn, preprocess_preference_data

LENGTH = 24


class _Tokenizer:
    chat_template, eos_token_id, pad_token_id = None, 1, 0

    def encode(self, text, add_special_tokens=True):
        return {"input_ids": [3 + ord(c) % 90 for c in text]}


class _Lengths:
    max_seq_len, max_prompt_len, flash_mask = LENGTH, 12, False


def _preference_batch():
    """Two collated rows: a pair padded to the length, and two pairs packed into one row (block-diagonal)."""
    pairs = [preprocess_preference_data({"src": src, "tgt": [], "response": [a, b], "sort": [1, 0]},
                                        _Tokenizer(), _Lengths(), _Lengths())
             for src, a, b in (("hello", "yes", "no way"), ("ab", "cde", "f"), ("ghij", "kl", "mnop"))]
    second = {key: pairs[1][key] + pairs[2][key] for key in ("input_ids", "response_0_labels", "response_1_labels")}
    second["position_ids"] = pairs[1]["position_ids"] + pairs[2]["position_ids"]
    n1, n2 = len(pairs[1]["input_ids"]), len(pairs[2]["input_ids"])
    mask = np.zeros((n1 + n2, n1 + n2), bool)
    mask[:n1, :n1], mask[n1:, n1:] = pairs[1]["attention_mask"], pairs[2]["attention_mask"]
    second["attention_mask"] = mask[None]
    pairs[0]["attention_mask"] = pairs[0]["attention_mask"][None]
    second["response_indexs"] = [pairs[1]["response_indexs"], [i + n1 for i in pairs[2]["response_indexs"][:3]] + [1]]
    pairs[0]["response_indexs"] = [pairs[0]["response_indexs"]]
    return preference_collate_fn([pairs[0], second], LENGTH)


def _visible_brute_force(ends):
    rows, cols = np.arange(ends.shape[1])[:, None], np.arange(ends.shape[1])[None, :]
    return (cols <= rows)[None] & (rows[None] < ends[:, None, :])


def test_the_preference_mask_travels_as_key_ends_and_attends_as_the_dense_mask():
    batch = _preference_batch()
    ends = _block_mask_ends(batch["attention_mask"], "sep_parallel_degree")
    np.testing.assert_array_equal(_visible_brute_force(ends), batch["attention_mask"][:, 0])
    rng = np.random.RandomState(0)
    q, k, v = (paddle.to_tensor(rng.randn(2, LENGTH, 2, 8).astype("float32")) for _ in range(3))
    out = flashmask_attention(q, k, v, paddle.to_tensor(ends), key_block=8).numpy()
    scores = np.einsum("bshd,bthd->bhst", q.numpy(), k.numpy()) / math.sqrt(8)
    keep = batch["attention_mask"]  # [b, 1, s, s]
    scores = np.where(keep, scores, -np.inf)
    seen = keep.any(-1)[..., None]  # padding rows see no key: not part of any loss
    probs = np.where(seen, np.exp(scores - np.where(seen, scores, 0).max(-1, keepdims=True)), 0)
    dense = np.einsum("bhst,bthd->bshd", probs / np.where(seen, probs.sum(-1, keepdims=True), 1), v.numpy())
    rows = keep[:, 0].any(-1)  # [b, s]
    np.testing.assert_allclose(out[rows], dense[rows], rtol=1e-5, atol=1e-6)


def test_positions_that_shift_scores_are_found_exactly_as_the_pairs_a_query_sees():
    rng = np.random.RandomState(1)
    batch = _preference_batch()
    ends = _block_mask_ends(batch["attention_mask"], "sep")
    assert _positions_shift_scores(batch["position_ids"], ends)  # the rejected response restarts after the prompt
    documents = np.array([[5, 5, 5, 5, 5, 9, 9, 9, 9]])
    assert not _positions_shift_scores(np.array([[0, 1, 2, 3, 4, 0, 1, 2, 3]]), documents)
    for _ in range(200):
        length = rng.randint(2, 9)
        ends = np.array([[rng.randint(j, length + 1) for j in range(length)]])
        positions = rng.randint(0, 3, size=(1, length)).cumsum(1)
        offsets = positions - np.arange(length)
        visible = _visible_brute_force(ends)[0]
        expected = bool(np.any(visible & (offsets[0][:, None] != offsets[0][None, :])))
        assert _positions_shift_scores(positions, ends) == expected, (positions, ends)


def test_the_sep_cut_keeps_the_preference_rows_positions_and_ends_whole_and_cuts_the_rest():
    batch = {k: paddle.to_tensor(v) for k, v in _preference_batch().items() if k != "response_indexs"}
    piece = shard_sequence(batch, 2, 1)
    np.testing.assert_array_equal(piece["position_ids"].numpy(), batch["position_ids"].numpy())
    assert piece["attn_mask_startend_row_indices"].shape == [2, LENGTH] and "attention_mask" not in piece
    np.testing.assert_array_equal(piece["input_ids"].numpy(), batch["input_ids"].numpy()[:, LENGTH // 2:])
    np.testing.assert_array_equal(piece["chosen_labels"].numpy(), batch["chosen_labels"].numpy()[:, LENGTH // 2:])


def test_the_rope_turn_gives_rope_at_the_true_positions():
    from paddlenlp.transformers.llama import modeling

    rotary = modeling.LlamaRotaryEmbedding(8, max_position_embeddings=LENGTH)
    positions = paddle.to_tensor(_preference_batch()["position_ids"])
    rng = np.random.RandomState(2)
    q, k = (paddle.to_tensor(rng.randn(2, LENGTH, 2, 8).astype("float32")) for _ in range(2))
    cos, sin = rotary(q, seq_len=LENGTH)
    index = paddle.arange(LENGTH, dtype="int64").expand([2, LENGTH])
    at_index = modeling.apply_rotary_pos_emb(q, k, cos, sin, index)
    turned = packed_attention._turned_to_positions(*at_index, q, (positions, rotary, modeling.rotate_half))
    expected = modeling.apply_rotary_pos_emb(q, k, cos, sin, positions)
    for mine, theirs in zip(turned, expected):
        np.testing.assert_allclose(mine.numpy(), theirs.numpy(), rtol=1e-5, atol=1e-6)
    with pytest.raises(AssertionError):  # the index alone is not the true positions' rope
        np.testing.assert_allclose(at_index[0].numpy(), expected[0].numpy(), rtol=1e-5, atol=1e-6)


def test_the_flashmask_form_of_a_preference_row_is_the_dense_masks_key_ends():
    raw = {"src": "hello", "tgt": [], "response": ["yes", "no way"], "sort": [1, 0]}
    dense = preprocess_preference_data(dict(raw), _Tokenizer(), _Lengths(), _Lengths())

    class _Flash(_Lengths):
        flash_mask = True

    flash = preprocess_preference_data(dict(raw), _Tokenizer(), _Flash(), _Flash())
    flash["response_indexs"] = [flash["response_indexs"]]
    ends = preference_collate_fn([flash], LENGTH)["attn_mask_startend_row_indices"].reshape([1, LENGTH])
    real = len(dense["input_ids"])
    np.testing.assert_array_equal(_visible_brute_force(ends)[0, :real, :real], dense["attention_mask"])
    batch = {"input_ids": paddle.zeros([1, LENGTH], "int64"), "attn_mask_startend_row_indices": paddle.to_tensor(ends),
             "position_ids": paddle.to_tensor(np.array([flash["position_ids"] + [0] * (LENGTH - real)]))}
    np.testing.assert_array_equal(shard_sequence(batch, 2, 0)["position_ids"].numpy(), batch["position_ids"].numpy())
