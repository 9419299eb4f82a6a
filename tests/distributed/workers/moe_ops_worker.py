"""MoELayer under expert parallel against one process on the whole batch, forward and backward.

Runs on n processes (2 or 4). Every rank builds the one-process reference (all experts, no groups, the whole
batch) and the distributed layer (its local experts, this rank's slice of the tokens) from the same seed; the
layer's initialisation does not depend on the layout, which the first check confirms. Layouts: ep = n (every
rank its own experts) and, on 4 ranks, ep2 × 2 expert replicas (expert-data-parallel groups [0, 2], [1, 3]).
Cases: ``skewed`` (rank 0's tokens never pick expert 3: a zero split in the exchange) and ``starved`` (no token
picks expert 3: its owner receives no row for it at all).

The contract's gradient rule is applied by hand: each rank's loss is the mean over its own tokens (plus its
auxiliary term); dense gradients (router, shared expert) are summed over the data ranks and divided by their
number D; an expert gradient is summed over the ranks holding the same expert and divided by D; the input
gradient of a rank is divided by D (what averaging the dense gradients upstream of it does).
Writes ``<out>/rank<r>.json`` = {"<layout>_<case>_<dtype>_<check>": max abs error, ... flags}.
"""
from __future__ import annotations

import faulthandler
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..")))

import numpy as np  # noqa: E402
import paddle  # noqa: E402
import paddle.distributed as dist  # noqa: E402

from common import exit_cleanly, leaf, write_json  # noqa: E402
from common import max_abs_error as err  # noqa: E402

H, INTER, SHARED, E, TOP_K = 8, 12, 6, 4, 2
TOKENS_PER_RANK = 6


def batch(n, case, dtype):
    """The global batch [n ranks · tokens, H], the router weight, the upstream weights of the loss."""
    rng = np.random.RandomState(21)
    x = rng.randn(n * TOKENS_PER_RANK, H)
    direction = np.zeros(H)
    direction[0] = 1.0
    gate = rng.randn(H, E) * 0.5
    gate[:, 3] = -4.0 * direction  # tokens with a large first feature never pick expert 3
    avoid = slice(0, TOKENS_PER_RANK) if case == "skewed" else slice(None)
    x[avoid, 0] = np.abs(x[avoid, 0]) + 3.0
    upstream = rng.randn(n * TOKENS_PER_RANK, H)
    return x.astype(dtype), gate.astype(dtype), upstream.astype(dtype)


def build(seed, gate, **groups):
    from paddletrainer.moe import MoELayer

    paddle.seed(seed)
    layer = MoELayer(H, INTER, E, TOP_K, aux_loss_coef=0.1, z_loss_coef=0.01, shared_expert_intermediate_size=SHARED,
                     init_std=0.3, **groups)
    layer.gate.weight.set_value(paddle.to_tensor(gate))
    return layer


def run(layer, x, upstream):
    """Forward, loss = mean over these tokens of (out · upstream) summed over hidden + aux; backward."""
    xt = leaf(x)
    out, aux = layer(xt)
    loss = (out * paddle.to_tensor(upstream)).sum(axis=-1).mean() + aux
    loss.backward()
    return xt, out, aux


def check(layout, case, dtype, groups, n, rank):
    tag = f"{layout}_{case}_{dtype}"
    x, gate, upstream = batch(n, case, dtype)
    paddle.set_default_dtype(dtype)
    ref = build(5, gate)
    ref_x, ref_out, ref_aux = run(ref, x, upstream)
    mine = slice(rank * TOKENS_PER_RANK, (rank + 1) * TOKENS_PER_RANK)
    layer = build(5, gate, expert_group=groups["expert"], token_group=groups["token"])
    reference = dict(ref.named_parameters())
    res = {f"{tag}_init": max(err(p.numpy(), reference[name].numpy()) for name, p in layer.named_parameters())}
    layer_x, out, aux = run(layer, x[mine], upstream[mine])
    res[f"{tag}_out"] = err(out, ref_out.numpy()[mine])
    mean_aux = paddle.to_tensor(float(aux), dtype="float64")
    dist.all_reduce(mean_aux)
    res[f"{tag}_aux_mean_over_ranks"] = abs(float(mean_aux) / n - float(ref_aux))
    res[f"{tag}_stats_aux"] = abs(layer.last_stats.aux_loss - ref.last_stats.aux_loss)
    res[f"{tag}_stats_counts_equal"] = float(layer.last_stats.tokens_per_expert == ref.last_stats.tokens_per_expert)
    local_counts = np.bincount(paddle.topk(paddle.nn.functional.softmax(paddle.to_tensor(x[mine]) @ paddle.to_tensor(gate)),
                                           TOP_K)[1].numpy().ravel(), minlength=E)
    res[f"{tag}_sends_zero_rows_to_an_expert"] = float(local_counts.min() == 0)
    res[f"{tag}_expert3_tokens"] = float(layer.last_stats.tokens_per_expert[3])
    res[f"{tag}_grad_input"] = err(layer_x.grad.numpy() / n, ref_x.grad.numpy()[mine])
    worst_dense, worst_expert = 0.0, 0.0
    for name, param in layer.named_parameters():
        grad = param.grad.clone()
        expert = getattr(param, "is_expert", False)
        group = groups["expert_data"] if expert else None
        if not expert or group is not None:
            dist.all_reduce(grad, group=group)  # SUM: over every data rank (dense), over the replicas (expert)
        e = err(grad.numpy() / n, reference[name].grad.numpy())
        if expert:
            worst_expert = max(worst_expert, e)
        else:
            worst_dense = max(worst_dense, e)
    res[f"{tag}_grad_dense"], res[f"{tag}_grad_expert"] = worst_dense, worst_expert
    res[f"{tag}_local_experts"] = float(len(layer.local_experts))
    paddle.set_default_dtype("float32")
    return res


def layouts(n, rank):
    """(name, {"expert", "expert_data", "token"}) for this rank; every rank creates every group in one order."""
    world = dist.collective._get_global_group()
    found = [(f"ep{n}", {"expert": world, "expert_data": None, "token": world})]
    if n == 4:
        ep = [dist.new_group([0, 1]), dist.new_group([2, 3])]
        edp = [dist.new_group([0, 2]), dist.new_group([1, 3])]
        found.append(("ep2x2", {"expert": ep[rank // 2], "expert_data": edp[rank % 2], "token": world}))
    return found


def main(out):
    faulthandler.enable()
    faulthandler.dump_traceback_later(float(os.environ.get("PT_WORKER_TIMEOUT", "120")), exit=True)
    from paddletrainer.parallel import init_topology
    from paddletrainer.parallel.config import ParallelConfig
    from paddletrainer.parallel.cpu.all_to_all import install_all_to_all
    from paddletrainer.parallel.layout import Layout

    n = int(os.environ["PADDLE_TRAINERS_NUM"])
    topo = init_topology(ParallelConfig(layout=Layout(world_size=n, dp=n)))
    install_all_to_all()
    res = {}
    for layout, groups in layouts(n, topo.rank):
        for case in ("skewed", "starved"):
            for dtype in ("float64", "float32"):
                res.update(check(layout, case, dtype, groups, n, topo.rank))
    write_json(os.path.join(out, f"rank{topo.rank}.json"), res)
    exit_cleanly(topo)


if __name__ == "__main__":
    main(sys.argv[1])
