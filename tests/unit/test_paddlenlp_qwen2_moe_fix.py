"""llm_examples/moe/paddlenlp_qwen2_moe_fix.py: PaddleNLP 3.0.0b4's Qwen2-MoE under Paddle 3.3.1 — it fails
without the fix, routes by the rule with it, its router gets its true gradient (no spurious term through the
bool dispatch mask: issue #29's "0.5x"), the fix refuses a PaddleNLP it was not written for, and the model
trains through our Trainer exactly as through PaddleNLP's."""
import os
import sys

import numpy as np
import paddle
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "llm_examples", "moe"))

import paddlenlp_qwen2_moe_fix as fix  # noqa: E402
from paddlenlp.transformers import Qwen2MoeConfig, Qwen2MoeForCausalLM  # noqa: E402
from paddlenlp.transformers.moe_gate import PretrainedMoEGate  # noqa: E402
from paddlenlp.transformers.qwen2_moe.modeling import Qwen2MoeSparseMoEBlock  # noqa: E402

VOCAB, SEQ = 64, 16


def tiny_config():
    return Qwen2MoeConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, moe_intermediate_size=16,
                          shared_expert_intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
                          num_key_value_heads=2, num_experts=4, num_experts_per_tok=2, max_position_embeddings=64)


@pytest.fixture
def paddlenlp_gate(monkeypatch):
    """PaddleNLP's own gate methods at the start, whatever an earlier test installed, and again afterwards."""
    for name in ("_priority", "topkgating"):
        original = fix._ORIGINALS.get(name, getattr(PretrainedMoEGate, name))
        monkeypatch.setattr(PretrainedMoEGate, name, original)
    yield PretrainedMoEGate


def test_qwen2_moe_fails_under_this_paddle_without_the_fix_and_runs_with_it(paddlenlp_gate):
    paddle.seed(0)
    model = Qwen2MoeForCausalLM(tiny_config())
    ids = paddle.to_tensor(np.random.RandomState(0).randint(0, VOCAB, (2, SEQ)))
    with pytest.raises(TypeError, match="int64, y: int32"):  # moe_gate.py:239, cumsum(int32) is int64
        model(input_ids=ids, labels=ids)
    fix.install()
    fix.install()  # idempotent
    assert fix.is_installed()
    loss = model(input_ids=ids, labels=ids)[0]
    loss.backward()
    assert np.isfinite(float(loss)) and all(p.grad is not None for p in model.parameters())


def slots_by_the_rule(topk_idx, num_experts, capacity):
    """[tokens, experts, capacity] 0/1: first choices of all tokens, then second choices, each expert counting."""
    tokens, top_k = topk_idx.shape
    out, count = np.zeros((tokens, num_experts, capacity), "int32"), [0] * num_experts
    for choice in range(top_k):
        for token in range(tokens):
            expert = topk_idx[token, choice]
            if count[expert] < capacity:
                out[token, expert, count[expert]] = 1
            count[expert] += 1
    return out


@pytest.mark.parametrize("capacity", [1, 3, 8])
def test_priority_gives_each_token_its_slot_in_each_of_its_experts(capacity):
    gate = type("Gate", (), {"num_experts": 5})()
    rng = np.random.RandomState(capacity)
    topk_idx = np.stack([rng.permutation(5)[:3] for _ in range(9)])
    got = fix.priority(gate, paddle.to_tensor(topk_idx), capacity)
    assert got.dtype == paddle.int32
    np.testing.assert_array_equal(got.numpy(), slots_by_the_rule(topk_idx, 5, capacity))


def test_paddle_differentiates_a_cast_through_bool_as_ones():
    """The Paddle behaviour behind the spurious router gradient: float -> bool -> float passes 1.0 back wherever
    the incoming gradient is nonzero (not zero, not the gradient)."""
    w = paddle.to_tensor([0.3, 0.0, -2.0, 5.0], stop_gradient=False)
    (w.cast("bool").cast("float32") * paddle.to_tensor([0.25, 3.0, -7.0, 0.0])).sum().backward()
    np.testing.assert_array_equal(w.grad.numpy(), [1.0, 1.0, 1.0, 0.0])


def dense_moe(block, x):
    """The block's output written without dispatch buffers or masks carrying gradients: every expert on every
    token, weighted by softmax(router) on the token's top-k experts and 0 elsewhere, plus the gated shared
    expert (Qwen2-MoE, norm_topk_prob off)."""
    tokens = x.reshape([-1, x.shape[-1]])
    probs = paddle.nn.functional.softmax(paddle.matmul(tokens, block.gate.weight), axis=-1)
    chosen = paddle.topk(probs, k=block.top_k, axis=-1)[1]
    weights = probs * paddle.nn.functional.one_hot(chosen, len(block.experts)).sum(axis=1)  # 0 off the top-k
    routed = sum(weights[:, e:e + 1] * expert(tokens) for e, expert in enumerate(block.experts))
    shared = paddle.nn.functional.sigmoid(block.shared_expert_gate(tokens)) * block.shared_expert(tokens)
    return (routed + shared).reshape(x.shape)


def block_gradients(block, x, forward):
    block.clear_gradients()
    x = x.detach()
    x.stop_gradient = False
    out = forward(x)
    (out * paddle.linspace(-1.0, 1.0, int(out.numel())).reshape(out.shape)).sum().backward()
    return out.numpy(), x.grad.numpy(), block.gate.weight.grad.numpy()


def test_the_router_gets_its_true_gradient_only_with_the_fix(paddlenlp_gate):
    fix.install()  # _priority is needed to run at all
    paddle.seed(3)
    block = Qwen2MoeSparseMoEBlock(tiny_config())
    block.gate.weight.set_value(paddle.randn(block.gate.weight.shape))  # PaddleNLP's init (all 1.0) ties
    x = paddle.randn([2, SEQ, 32])
    want = block_gradients(block, x, lambda t: dense_moe(block, t))
    got = block_gradients(block, x, lambda t: block(t)[0])
    for name, a, b in zip(("output", "input grad", "router grad"), got, want):
        np.testing.assert_allclose(a, b, atol=1e-6, rtol=1e-5, err_msg=name)
    paddlenlp_gate.topkgating = fix._ORIGINALS["topkgating"]  # PaddleNLP's: the dispatch mask leaks
    leaky = block_gradients(block, x, lambda t: block(t)[0])
    np.testing.assert_allclose(leaky[0], want[0], atol=1e-6)
    assert np.abs(leaky[2] - want[2]).max() > 1e-2  # 0.54 measured: far beyond rounding


def test_the_fix_refuses_a_paddlenlp_method_it_was_not_written_for(paddlenlp_gate, monkeypatch):
    def _priority(self, topk_idx, capacity):  # a changed PaddleNLP
        return topk_idx

    monkeypatch.setattr(PretrainedMoEGate, "_priority", _priority)
    with pytest.raises(RuntimeError, match=r"paddlenlp_qwen2_moe_fix.py: .*PretrainedMoEGate._priority is not"):
        fix.install()
    assert PretrainedMoEGate._priority is _priority and not fix.is_installed()


def train_losses(trainer_module, tmp_path):
    """Four steps (global batch 4 as 2 x 2 accumulation, clipping on) of a tiny Qwen2-MoE; the logged losses."""
    Trainer, TrainingArguments, TrainerCallback = (trainer_module.Trainer, trainer_module.TrainingArguments,
                                                    trainer_module.TrainerCallback)
    losses = []

    class Record(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "loss" in logs:
                losses.append(float(logs["loss"]))

    rows = np.random.RandomState(0).randint(0, VOCAB, (16, SEQ)).astype("int64")
    paddle.seed(0)
    model = Qwen2MoeForCausalLM(tiny_config())
    args = TrainingArguments(output_dir=str(tmp_path / trainer_module.__name__), max_steps=4,
                             per_device_train_batch_size=2, gradient_accumulation_steps=2, learning_rate=1e-2,
                             logging_steps=1, seed=7, max_grad_norm=1.0, report_to="none", disable_tqdm=True,
                             save_strategy="no")
    Trainer(model=model, args=args, train_dataset=[{"input_ids": r, "labels": r} for r in rows],
            callbacks=[Record()]).train()
    return losses


def test_qwen2_moe_trains_through_our_trainer_as_through_paddlenlps(paddlenlp_gate, tmp_path):
    import paddlenlp.trainer

    import paddletrainer

    fix.install()
    reference = train_losses(paddlenlp.trainer, tmp_path)
    ours = train_losses(paddletrainer, tmp_path)
    assert len(reference) == 4 and reference[-1] < reference[0]
    np.testing.assert_allclose(ours, reference, atol=1e-5, rtol=0)
