"""CPU ring attention (paddletrainer/parallel/ring_attention.py) against plain attention in one process.

A one-rank ring runs the PyLayer end to end (two chunks: diagonal, skipped and full pairs); virtual rings of 2-4
ranks run every rank's forward and backward in turn over the other ranks' K/V blocks (no processes; the real
multi-process runs are tests/distributed/test_long_context_ops.py). The load-balanced layout is checked against
PaddleNLP's own split (the spec)."""
import math

import numpy as np
import paddle
import pytest

from paddletrainer.parallel import ring_attention as ra
from toy_models import reference_attention
from virtual_ring import VirtualRing

B, S, H, D = 2, 16, 4, 8
TOLERANCE = {"float32": 1e-6, "float64": 1e-12}


class _OneRank:
    nranks, rank = 1, 0


def _inputs(dtype, kv_heads, seed=0):
    rng = np.random.RandomState(seed)
    return [rng.randn(B, S, h, D).astype(dtype) for h in (H, kv_heads, kv_heads)], rng.randn(B, S, H, D).astype(dtype)


def _leaves(arrays):
    tensors = [paddle.to_tensor(a) for a in arrays]
    for t in tensors:
        t.stop_gradient = False
    return tensors


def _reference_with_grads(arrays, out_grad, causal):
    q, k, v = _leaves(arrays)
    out = reference_attention(q, k, v, causal)
    (out * paddle.to_tensor(out_grad)).sum().backward()
    return out.numpy(), [t.grad.numpy() for t in (q, k, v)]


def _err(a, b):
    return float(np.max(np.abs(np.asarray(a, "float64") - np.asarray(b, "float64"))))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("kv_heads,causal", [(H, True), (H // 2, True), (1, True), (H, False)])
def test_one_rank_ring_attention_equals_plain_attention_forward_and_backward(dtype, kv_heads, causal):
    arrays, out_grad = _inputs(dtype, kv_heads)
    ref_out, ref_grads = _reference_with_grads(arrays, out_grad, causal)
    q, k, v = _leaves(arrays)
    out = ra.RingAttention.apply(q, k, v, group=_OneRank(), is_causal=causal)
    (out * paddle.to_tensor(out_grad)).sum().backward()
    assert out.dtype == q.dtype and list(out.shape) == [B, S, H, D]
    errors = [_err(out, ref_out)] + [_err(t.grad, g) for t, g in zip((q, k, v), ref_grads)]
    assert max(errors) <= TOLERANCE[dtype], errors


@pytest.mark.parametrize("n", [2, 3, 4])
@pytest.mark.parametrize("kv_heads,causal", [(H, True), (H // 2, True), (H, False)])
def test_virtual_ring_of_n_ranks_equals_plain_attention_forward_and_backward(monkeypatch, n, kv_heads, causal):
    seq = 2 * n * 3
    rng = np.random.RandomState(n)
    arrays = [rng.randn(B, seq, h, D) for h in (H, kv_heads, kv_heads)]
    out_grad = rng.randn(B, seq, H, D)
    q, k, v = _leaves(arrays)
    ref = reference_attention(q, k, v, causal)
    (ref * paddle.to_tensor(out_grad)).sum().backward()

    part = lambda a, r: ra.split_load_balanced(paddle.to_tensor(a), r, n, axis=1)  # noqa: E731
    heads = lambda a, r: ra._heads_major(part(a, r), paddle.float64)  # noqa: E731
    blocks = [(heads(arrays[1], r), heads(arrays[2], r)) for r in range(n)]
    # every rank's contributions to every K/V block, summed here instead of by the all-reduce
    monkeypatch.setattr(ra, "_home_grads", lambda ring, travelling, held: (held,))
    outs, dqs, dk, dv = [], [], [0.0] * n, [0.0] * n
    scale = 1 / math.sqrt(D)
    for r in range(n):
        ring = VirtualRing(n, r, blocks)
        acc = ra.ring_forward(heads(arrays[0], r), *blocks[r], ring, scale, causal)
        o, lse = [a[0] for a in acc], [a[1] for a in acc]
        grads = ra._local_chunks(heads(out_grad, r), 2)
        dq, held = ra.ring_backward(heads(arrays[0], r), *blocks[r], o, lse, grads, ring, scale, causal)
        outs.append(ra._seq_major(paddle.concat(o, axis=2), paddle.float64))
        dqs.append(ra._seq_major(dq, paddle.float64))
        for owner in range(n):
            dk[owner] = dk[owner] + held[owner][0]
            dv[owner] = dv[owner] + held[owner][1]
    assert _err(ra.undo_load_balanced(outs, axis=1), ref) <= 1e-12
    assert _err(ra.undo_load_balanced(dqs, axis=1), q.grad) <= 1e-12
    for full_grad, per_rank in ((k.grad, dk), (v.grad, dv)):
        got = ra.undo_load_balanced([ra._seq_major(g, paddle.float64) for g in per_rank], axis=1)
        assert _err(got, full_grad) <= 1e-12


def test_causal_pairs_skip_the_future_and_mask_only_the_diagonal():
    assert ra._pair_kind(3, 1, True) == "full"
    assert ra._pair_kind(1, 1, True) == "causal"
    assert ra._pair_kind(1, 3, True) is None
    assert ra._pair_kind(1, 3, False) == "full"


@pytest.mark.parametrize("degree", [1, 2, 3, 4])
def test_load_balanced_split_is_paddlenlps_and_undoes(degree):
    from paddlenlp.transformers.context_parallel_utils import split_inputs_sequence_dim_load_balance

    tokens = paddle.arange(2 * 4 * degree * 2, dtype="int64").reshape([2, -1])
    parts = [ra.split_load_balanced(tokens, r, degree) for r in range(degree)]
    for r, part in enumerate(parts):
        spec = split_inputs_sequence_dim_load_balance(tokens, rank=r, degree=degree)
        np.testing.assert_array_equal(part.numpy(), spec.numpy())
    np.testing.assert_array_equal(ra.undo_load_balanced(parts).numpy(), tokens.numpy())


def test_position_ids_are_those_of_the_two_chunks_a_rank_holds():
    # 16 positions, cp 2: chunks of 4; rank 0 holds chunks 0 and 3, rank 1 chunks 1 and 2 (Llama's rope ids)
    np.testing.assert_array_equal(ra.load_balanced_position_ids(16, 0, 2, batch_size=2).numpy(),
                                  [[0, 1, 2, 3, 12, 13, 14, 15]] * 2)
    np.testing.assert_array_equal(ra.load_balanced_position_ids(16, 1, 2).numpy(), [[4, 5, 6, 7, 8, 9, 10, 11]])


def test_split_batch_cuts_every_sequence_field_and_refuses_one_without_a_sequence_axis():
    batch = {"input_ids": paddle.arange(16).reshape([2, 8]), "labels": paddle.arange(16).reshape([2, 8]) + 1,
             "attention_mask": None}
    out = ra.split_batch_load_balanced(batch, 1, 2)
    np.testing.assert_array_equal(out["input_ids"].numpy(), [[2, 3, 4, 5], [10, 11, 12, 13]])
    np.testing.assert_array_equal(out["labels"].numpy(), [[3, 4, 5, 6], [11, 12, 13, 14]])
    assert out["attention_mask"] is None
    with pytest.raises(ValueError, match="batch field 'pixel' is Tensor with shape"):
        ra.split_batch_load_balanced({"pixel": paddle.ones([2, 8, 3])}, 0, 2)
    with pytest.raises(ValueError, match="sequence length 6 must divide by 2 x context parallel degree = 4"):
        ra.split_load_balanced(paddle.ones([1, 6]), 0, 2)


def test_ring_attention_refuses_what_it_cannot_compute():
    arrays, _ = _inputs("float32", H)
    q, k, v = (paddle.to_tensor(a) for a in arrays)
    with pytest.raises(NotImplementedError, match="dropout"):
        ra.RingAttention.apply(q, k, v, group=_OneRank(), dropout=0.1)
    with pytest.raises(ValueError, match="no attn_mask"):
        ra.RingAttention.apply(q, k, v, group=_OneRank(), attn_mask=paddle.zeros([B, 1, S, S]))
    with pytest.raises(ValueError, match="rotation='p2p' needs an even ring size on gloo, got 3"):
        ra._Ring(type("ThreeRanks", (), {"nranks": 3, "rank": 0})(), "p2p")
    with pytest.raises(ValueError, match="rotation must be one of"):
        ra.RingAttention.apply(q, k, v, group=_OneRank(), rotation="ring")
    with pytest.raises(ValueError, match="not a multiple of 3 key/value heads"):
        ra.RingAttention.apply(q, paddle.ones([B, S, 3, D]), paddle.ones([B, S, 3, D]), group=_OneRank())


def test_ring_attention_takes_paddlenlps_ring_flash_attention_arguments_in_order():
    import inspect

    from paddlenlp.transformers.ring_flash_attention import RingFlashAttention

    theirs = list(inspect.signature(RingFlashAttention.forward).parameters)
    ours = list(inspect.signature(ra.RingAttention.forward).parameters)
    assert ours[:len(theirs)] == theirs  # Llama's call: apply(q, k, v, attn_mask=None, is_causal=True)
    assert ours[len(theirs):] == ["rotation", "startend_row_indices"]
