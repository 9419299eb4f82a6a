"""MoELayer on one process against a naive dense reference that runs every expert on every token and masks."""
from types import SimpleNamespace

import numpy as np
import paddle
import paddle.nn.functional as F
import pytest

from paddletrainer.moe import MoELayer, summary_metrics

H, I, E = 8, 12, 4


@pytest.fixture(autouse=True)
def float64():
    """float64 so that 1e-6 measures the algorithm, not float32's summation order."""
    paddle.set_default_dtype("float64")
    yield
    paddle.set_default_dtype("float32")


def dense_reference(layer, x):
    """Every expert on every token, combined with a dense [tokens, experts] weight matrix that is zero outside
    the top-k; the aux and z losses from their textbook formulas."""
    flat = x.reshape([-1, H])
    logits = F.linear(flat, layer.gate.weight)
    probs = F.softmax(logits, axis=-1)
    top = paddle.topk(probs, layer.top_k, axis=-1)[1]
    mask = F.one_hot(top, E).sum(axis=1)  # [N, E] 0/1
    weights = probs * mask
    if layer.norm_topk_prob:
        weights = weights / weights.sum(axis=-1, keepdim=True)
    out = sum(weights[:, e:e + 1] * layer.experts[str(e)](flat) for e in range(E))
    if layer.shared_expert is not None:
        out = out + layer.shared_expert(flat)
    n = flat.shape[0]
    f = mask.sum(axis=0) / (n * layer.top_k)
    aux = layer.aux_loss_coef * E * (f * probs.mean(axis=0)).sum()
    z = layer.z_loss_coef * (paddle.logsumexp(logits, axis=-1) ** 2).mean()
    return out.reshape(x.shape), aux + z


def grads(layer, x, outputs, upstream):
    out, aux = outputs
    layer.clear_gradients()
    x.clear_gradient()
    ((out * upstream).sum() + aux).backward()
    found = {name: (p.grad.numpy().copy() if p.grad is not None else None) for name, p in layer.named_parameters()}
    found["input"] = x.grad.numpy().copy()
    return found


@pytest.mark.parametrize("top_k,norm,shared", [(2, True, True), (1, False, False), (3, True, False)])
def test_forward_and_every_gradient_equal_the_dense_reference(top_k, norm, shared):
    paddle.seed(7)
    layer = MoELayer(H, I, E, top_k, norm_topk_prob=norm, aux_loss_coef=0.1, z_loss_coef=0.01,
                     shared_expert_intermediate_size=6 if shared else 0, init_std=0.3)
    x = paddle.randn([3, 5, H])
    x.stop_gradient = False
    upstream = paddle.randn([3, 5, H])
    out, aux = layer(x)
    ref_out, ref_aux = dense_reference(layer, x)
    np.testing.assert_allclose(out.numpy(), ref_out.numpy(), rtol=0, atol=1e-6)
    np.testing.assert_allclose(float(aux), float(ref_aux), rtol=0, atol=1e-7)
    got, want = grads(layer, x, (out, aux), upstream), grads(layer, x, (ref_out, ref_aux), upstream)
    assert set(got) == set(want)
    for name in want:
        assert got[name] is not None, name
        np.testing.assert_allclose(got[name], want[name], rtol=0, atol=1e-6, err_msg=name)


def test_an_expert_that_gets_no_token_has_a_zero_gradient_not_none():
    paddle.seed(3)
    layer = MoELayer(H, I, E, 1, aux_loss_coef=0.0, init_std=0.3)
    gate = np.zeros([H, E])
    gate[:, 3] = -50.0  # expert 3's logit is very negative for positive inputs
    layer.gate.weight.set_value(gate)
    x = paddle.abs(paddle.randn([6, H])) + 0.1
    out, aux = layer(x)
    assert layer.last_stats.tokens_per_expert[3] == 0
    (out.sum() + aux).backward()
    grad = layer.experts["3"].down_proj.weight.grad
    assert grad is not None and float(paddle.abs(grad).sum()) == 0.0


def test_statistics_count_every_routed_slot_and_report_the_imbalance():
    paddle.seed(5)
    layer = MoELayer(H, I, E, 2, init_std=0.3)
    x = paddle.randn([10, H])
    layer(x)
    stats = layer.last_stats
    counts = stats.tokens_per_expert
    assert sum(counts) == 20
    assert stats.imbalance == pytest.approx(max(counts) / (20 / E))
    metrics = summary_metrics({"layers.0.mlp": stats})
    assert metrics["moe/layers.0.mlp/imbalance"] == pytest.approx(stats.imbalance, abs=1e-4)
    assert metrics["moe/max_imbalance"] == pytest.approx(stats.imbalance, abs=1e-4)
    # the aux loss is E·Σ f·P: 1 when the router is uniform
    layer.gate.weight.set_value(np.zeros([H, E]))
    layer(x)
    assert layer.last_stats.aux_loss == pytest.approx(1.0)


def test_experts_are_named_by_global_index_flagged_and_built_the_same_in_every_layout():
    paddle.seed(11)
    whole = MoELayer(H, I, E, 2, shared_expert_intermediate_size=4)
    paddle.seed(11)
    half = MoELayer(H, I, E, 2, shared_expert_intermediate_size=4, expert_group=SimpleNamespace(nranks=2, rank=1),
                    token_group=SimpleNamespace(nranks=4))
    names = [n for n, _ in half.named_parameters()]
    assert [n for n in names if n.startswith("experts.")] == [
        f"experts.{g}.{p}_proj.weight" for g in (2, 3) for p in ("gate", "up", "down")]
    mine = dict(half.named_parameters())
    for name, param in whole.named_parameters():
        expert = name.startswith("experts.")
        assert getattr(param, "is_expert", False) is expert and getattr(param, "no_sync", False) is expert, name
        if name in mine:  # same values whatever the layout: experts and the dense parameters after them
            np.testing.assert_array_equal(param.numpy(), mine[name].numpy(), err_msg=name)
    assert len(mine) == len(dict(whole.named_parameters())) - 6


@pytest.mark.parametrize("kwargs,message", [
    (dict(num_experts=0), "num_experts must be >= 1"),
    (dict(top_k=5), r"top_k must be in \[1, num_experts=4\]"),
    (dict(expert_group=SimpleNamespace(nranks=3, rank=0)), r"num_experts \(4\) must be divisible"),
    (dict(expert_group=SimpleNamespace(nranks=2, rank=0)), "expert_group spans several ranks but token_group is None"),
])
def test_bad_sizes_are_refused_with_the_argument_named(kwargs, message):
    args = dict(hidden_size=H, moe_intermediate_size=I, num_experts=E, top_k=2)
    args.update(kwargs)
    with pytest.raises(ValueError, match=message):
        MoELayer(**args)


def test_rows_that_arrive_by_source_rank_are_regrouped_by_local_expert_and_back():
    from paddletrainer.moe.dispatch import local_expert_order

    received = np.array([[2, 0, 1], [0, 0, 3], [1, 2, 0]])  # [source rank, local expert]; zeros included
    rows = np.array([f"r{s}e{e}" for s in range(3) for e in range(3) for _ in range(received[s, e])])
    perm, inverse, per_expert = local_expert_order(received)
    assert per_expert == [3, 2, 4]
    assert rows[perm].tolist() == ["r0e0", "r0e0", "r2e0", "r2e1", "r2e1", "r0e2", "r1e2", "r1e2", "r1e2"]
    assert rows[perm][inverse].tolist() == rows.tolist()
    empty = local_expert_order(np.zeros([2, 2], dtype="int64"))
    assert empty[0].shape == (0,) and empty[2] == [0, 0]
