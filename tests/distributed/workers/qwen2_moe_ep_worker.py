"""PaddleNLP 3.0.0b4's Qwen2-MoE with its experts split over the data-parallel group (its ``MoELayer``'s
expert parallel, dispatched with our gloo all-to-all fill) against one process, forward and backward.

Every rank first builds the one-process model (before the topology exists, so its ``MoELayer`` keeps all
experts), runs it on the whole batch and keeps its gradients; then builds the EP model (experts ``[r·E/n,
(r+1)·E/n)`` here), loads the same weights, runs its own share of the batch and reports, for each variant of
the gate (``fixed``: llm_examples/moe/paddlenlp_qwen2_moe_fix.py installed; ``leaky``: PaddleNLP's own
``topkgating``, whose dispatch mask passes a gradient), the max abs error of the mean loss, of every dense
gradient averaged over ranks, and of every local expert's gradient divided by the EP degree (each rank's loss
is a mean over its own tokens and the owner receives every rank's tokens, so its gradient is the sum of the
ranks' contributions), plus the ratio <ep, ref>/<ref, ref> of the embedding and router gradients (issue #29's
"0.5x" shows there). Writes ``<out>/rank<r>.json``.
"""
from __future__ import annotations

import faulthandler
import os
import sys
from types import SimpleNamespace

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "llm_examples", "moe"))

import numpy as np  # noqa: E402
import paddle  # noqa: E402
import paddle.distributed as dist  # noqa: E402

from common import exit_cleanly, write_json  # noqa: E402

GLOBAL_BATCH, SEQ, VOCAB = 4, 16, 64
RATIO_PARAMS = ("qwen2_moe.embed_tokens.weight", "qwen2_moe.layers.1.mlp.gate.weight")


def tiny_config():
    from paddlenlp.transformers import Qwen2MoeConfig

    return Qwen2MoeConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, moe_intermediate_size=16,
                          shared_expert_intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
                          num_key_value_heads=2, num_experts=4, num_experts_per_tok=2, max_position_embeddings=64)


def weights():
    """The one-process model's weights, with random routers (PaddleNLP initialises them to 1.0: all ties)."""
    from paddlenlp.transformers import Qwen2MoeForCausalLM

    paddle.seed(0)
    state = {k: v.numpy() for k, v in Qwen2MoeForCausalLM(tiny_config()).state_dict().items()}
    rng = np.random.RandomState(1)
    for name in state:
        if name.endswith("mlp.gate.weight"):
            state[name] = rng.randn(*state[name].shape).astype("float32")
    return state


def loss_and_grads(model, state, ids):
    model.set_state_dict({k: paddle.to_tensor(state[k]) for k in model.state_dict()})
    tokens = paddle.to_tensor(ids)
    loss = model(input_ids=tokens, labels=tokens)[0]
    loss.backward()
    return float(loss), {name: p for name, p in model.named_parameters()}


def use_gate(variant):
    import paddlenlp_qwen2_moe_fix as fix
    from paddlenlp.transformers.moe_gate import PretrainedMoEGate

    fix.install()
    if variant == "leaky":
        PretrainedMoEGate.topkgating = fix._ORIGINALS["topkgating"]


def compare(variant, ep_loss, params, ref_loss, ref_grads, n):
    res = {f"{variant}_loss": abs(ep_loss - ref_loss)}
    dense, expert = 0.0, 0.0
    for name, p in params.items():
        grad = p.grad.clone()
        if getattr(p, "expert", False):  # local expert: its owner's gradient sums every rank's tokens
            expert = max(expert, float(np.abs(grad.numpy() / n - ref_grads[name]).max()))
            continue
        dist.all_reduce(grad)
        mean = grad.numpy() / n
        dense = max(dense, float(np.abs(mean - ref_grads[name]).max()))
        if name in RATIO_PARAMS:
            ref = ref_grads[name]
            res[f"{variant}_ratio_{name}"] = float((mean * ref).sum() / (ref * ref).sum())
    res[f"{variant}_dense_grads"], res[f"{variant}_expert_grads"] = dense, expert
    return res


def main(out):
    faulthandler.enable()
    faulthandler.dump_traceback_later(float(os.environ.get("PT_WORKER_TIMEOUT", "200")), exit=True)
    from paddlenlp.transformers import Qwen2MoeForCausalLM

    from paddle.distributed import fleet

    from paddletrainer.parallel import cpu

    state = weights()
    ids = np.random.RandomState(0).randint(0, VOCAB, (GLOBAL_BATCH, SEQ)).astype("int64")
    refs = {}
    for variant in ("fixed", "leaky"):  # before the topology: a MoELayer without fleet keeps every expert
        use_gate(variant)
        loss, params = loss_and_grads(Qwen2MoeForCausalLM(tiny_config()), state, ids)
        refs[variant] = (loss, {name: p.grad.numpy() for name, p in params.items()})
    n = int(os.environ["PADDLE_TRAINERS_NUM"])
    # MoELayer splits its experts only under fleet's hybrid group (our plain-dp topology has none): fleet dp=n
    cpu.install()  # the gloo fills, the all-to-all among them
    strategy = fleet.DistributedStrategy()
    strategy.hybrid_configs = {"dp_degree": n, "mp_degree": 1, "pp_degree": 1, "sharding_degree": 1}
    fleet.init(is_collective=True, strategy=strategy)
    rank = dist.get_rank()
    share = GLOBAL_BATCH // n
    res = {}
    for variant in ("fixed", "leaky"):
        use_gate(variant)
        model = Qwen2MoeForCausalLM(tiny_config())
        experts = sorted({int(name.split("experts.")[1].split(".")[0]) for name in model.state_dict()
                          if "experts." in name})
        res[f"{variant}_local_experts"] = experts
        loss, params = loss_and_grads(model, state, ids[rank * share:(rank + 1) * share])
        mean_loss = paddle.to_tensor(loss)
        dist.all_reduce(mean_loss)
        res.update(compare(variant, float(mean_loss) / n, params, *refs[variant], n))
    write_json(os.path.join(out, f"rank{rank}.json"), res)
    exit_cleanly(SimpleNamespace(world_size=n))


if __name__ == "__main__":
    main(sys.argv[1])
