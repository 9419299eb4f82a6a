"""Check the CPU reduce-scatter fill and every sequence-parallel op, forward and backward, against one-process math.

Runs on 2 processes (tp2). Every rank builds the full tensors from a fixed seed, runs the op through Paddle's
own entry points (``paddle.distributed.stream.reduce_scatter``, ``paddle.distributed.reduce_scatter``,
``sequence_parallel_utils.ScatterOp`` ... as on a GPU, with the CPU backend installed by ``init_topology``)
and compares outputs and gradients with the plain computation on the full tensors. Writes
``<out>/rank<r>.json`` = {check name: max abs error}.
"""
from __future__ import annotations

import faulthandler
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..")))

import numpy as np  # noqa: E402
import paddle  # noqa: E402

from common import exit_cleanly, leaf, write_json  # noqa: E402
from common import max_abs_error as err  # noqa: E402

S, B, H, F = 6, 2, 4, 8  # sequence, batch, hidden, ffn (S, F divisible by tp=2)


def reduce_scatter_checks(group, r, n, rng):
    import paddle.distributed as dist

    res = {}
    xs = rng.randn(n, 2 * n, 3).astype("float32")  # rank k's input is xs[k]
    rows = slice(r * 2, (r + 1) * 2)
    total = xs.sum(0)
    out = paddle.empty([2, 3], dtype="float32")
    dist.stream.reduce_scatter(out, paddle.to_tensor(xs[r]), op=dist.ReduceOp.SUM, group=group, sync_op=True)
    res["rs_stream_sum"] = err(out, total[rows])
    out = paddle.empty([2, 3], dtype="float32")
    task = dist.reduce_scatter(out, [paddle.to_tensor(c) for c in np.split(xs[r], n)], group=group, sync_op=False)
    task.wait()
    res["rs_list_sum"] = err(out, total[rows])
    out = paddle.empty([2, 3], dtype="float32")
    dist.reduce_scatter(out, paddle.to_tensor(xs[r]), op=dist.ReduceOp.AVG, group=group)
    res["rs_avg"] = err(out, total[rows] / n)
    out = paddle.empty([2, 3], dtype="float32")
    dist.reduce_scatter(out, paddle.to_tensor(xs[r]), op=dist.ReduceOp.MAX, group=group)
    res["rs_max"] = err(out, xs.max(0)[rows])
    # sharding V2 reduces a flat gradient buffer into its own slice: only this rank's slice changes
    flat = paddle.to_tensor(xs[r].reshape(-1))
    size = flat.shape[0] // n
    view = flat._slice(r * size, (r + 1) * size)
    dist.reduce_scatter(view, flat, group=group, sync_op=False).wait()
    expected = xs[r].reshape(-1).copy()
    expected[r * size:(r + 1) * size] = total.reshape(-1)[r * size:(r + 1) * size]
    res["rs_into_own_slice"] = err(flat, expected)
    return res


def op_checks(r, n, rng):
    from paddle.distributed.fleet.utils.sequence_parallel_utils import AllGatherOp, GatherOp, ReduceScatterOp, ScatterOp

    res = {}
    x = rng.randn(S, B, H).astype("float32")
    w = rng.randn(n, S, B, H).astype("float32")  # rank k weighs the full-length output by w[k]
    part = S // n
    rows = slice(r * part, (r + 1) * part)

    # ScatterOp: forward keeps this rank's rows; backward gathers every rank's row gradient
    t = leaf(x)
    y = ScatterOp.apply(t)
    (y * paddle.to_tensor(w[r][rows])).sum().backward()
    res["scatter_fwd"] = err(y, x[rows])
    res["scatter_bwd"] = err(t.grad, np.concatenate([w[k][k * part:(k + 1) * part] for k in range(n)]))

    # GatherOp: forward gathers the rows; backward keeps this rank's rows (the loss is replicated)
    t = leaf(x[rows])
    y = GatherOp.apply(t)
    (y * paddle.to_tensor(w[0])).sum().backward()
    res["gather_fwd"], res["gather_bwd"] = err(y, x), err(t.grad, w[0][rows])

    # AllGatherOp: forward gathers the rows; backward reduce-scatters (each rank's loss uses the full tensor)
    t = leaf(x[rows])
    y = AllGatherOp.apply(t)
    (y * paddle.to_tensor(w[r])).sum().backward()
    res["allgather_fwd"], res["allgather_bwd"] = err(y, x), err(t.grad, w.sum(0)[rows])

    # ReduceScatterOp: forward sums the ranks' inputs and keeps this rank's rows; backward gathers the grads
    t = leaf(x + r)
    y = ReduceScatterOp.apply(t)
    (y * paddle.to_tensor(w[r][rows])).sum().backward()
    res["reducescatter_fwd"] = err(y, sum(x + k for k in range(n))[rows])
    res["reducescatter_bwd"] = err(t.grad, np.concatenate([w[k][k * part:(k + 1) * part] for k in range(n)]))
    return res


def linear_checks(r, n, rng, fused):
    """Column(SP) → Row(SP) with biases, as Llama's MLP; the row bias is a sequence-parallel parameter whose
    gradient the allreduce hook completes (``fused``: ``fuse_sequence_parallel_allreduce``, whose Paddle hook
    needs paddletrainer's zero-argument adapter)."""
    from paddle.distributed.fleet.utils.sequence_parallel_utils import (
        ColumnSequenceParallelLinear,
        RowSequenceParallelLinear,
    )

    from paddletrainer.parallel.sequence import register_sequence_parallel_hooks

    x = rng.randn(S, B, H).astype("float32")
    w1, b1 = rng.randn(H, F).astype("float32"), rng.randn(F).astype("float32")
    w2, b2 = rng.randn(F, H).astype("float32"), rng.randn(H).astype("float32")
    g = rng.randn(S, B, H).astype("float32")  # the upstream gradient of the full output
    cols, rows = slice(r * F // n, (r + 1) * F // n), slice(r * S // n, (r + 1) * S // n)

    class Block(paddle.nn.Layer):
        def __init__(self):
            super().__init__()
            self.up = ColumnSequenceParallelLinear(H, F, has_bias=True, gather_output=False)
            self.down = RowSequenceParallelLinear(F, H, has_bias=True, input_is_parallel=True)

        def forward(self, t):
            return self.down(self.up(t))

    block = Block()
    block.up.weight.set_value(w1[:, cols])
    block.up.bias.set_value(b1[cols])
    block.down.weight.set_value(w2[cols])
    block.down.bias.set_value(b2)
    register_sequence_parallel_hooks(block, accumulation_steps=1, fused=fused)
    t = leaf(x[rows])
    y = block(t)
    (y * paddle.to_tensor(g[rows])).sum().backward()

    hid = x.reshape(-1, H) @ w1 + b1
    out = (hid @ w2 + b2).reshape(S, B, H)
    gflat = g.reshape(-1, H)
    d_hid = gflat @ w2.T
    tag = "fused" if fused else "unfused"
    return {
        f"sp_linear_{tag}_fwd": err(y, out[rows]),
        f"sp_linear_{tag}_dx": err(t.grad, (d_hid @ w1.T).reshape(S, B, H)[rows]),
        f"sp_linear_{tag}_dw_col": err(block.up.weight.grad, (x.reshape(-1, H).T @ d_hid)[:, cols]),
        f"sp_linear_{tag}_db_col": err(block.up.bias.grad, d_hid.sum(0)[cols]),
        f"sp_linear_{tag}_dw_row": err(block.down.weight.grad, (hid.T @ gflat)[cols]),
        f"sp_linear_{tag}_db_row": err(block.down.bias.grad, gflat.sum(0)),  # needs the allreduce hook
    }


def paddles_fused_hook_fails():
    """1.0 if Paddle 3.3.1's own fused hook still breaks backward (why paddletrainer adapts it), else 0.0."""
    from paddle.distributed.fleet.utils import sequence_parallel_utils as spu

    layer = spu.RowSequenceParallelLinear(F, H, has_bias=True, input_is_parallel=True)
    spu.register_sequence_parallel_allreduce_hooks(layer, 1, True)
    try:
        layer(leaf(np.ones((S, B, F // 2), dtype="float32"))).sum().backward()
    except Exception:  # noqa: BLE001 - Paddle wraps the hook's TypeError in a ValueError
        return 1.0
    return 0.0


def main(out):
    faulthandler.enable()
    faulthandler.dump_traceback_later(float(os.environ.get("PT_WORKER_TIMEOUT", "120")), exit=True)
    from paddle.distributed.fleet.meta_parallel import get_rng_state_tracker

    from paddletrainer.parallel import init_topology
    from paddletrainer.parallel.config import ParallelConfig
    from paddletrainer.parallel.layout import Layout

    topo = init_topology(ParallelConfig(layout=Layout(world_size=2, tp=2), sequence_parallel=True))
    if "model_parallel_rng" not in get_rng_state_tracker().get_states_tracker():
        get_rng_state_tracker().add("model_parallel_rng", 100 + topo.tp_rank)
    group, r, n = topo.tp_group, topo.tp_rank, topo.tp_degree
    rng = np.random.RandomState(7)
    res = reduce_scatter_checks(group, r, n, rng)
    res.update(op_checks(r, n, rng))
    for fused in (False, True):
        res.update(linear_checks(r, n, rng, fused))
    res["paddles_fused_hook_fails"] = paddles_fused_hook_fails()
    write_json(os.path.join(out, f"rank{topo.rank}.json"), res)
    exit_cleanly(topo)


if __name__ == "__main__":
    main(sys.argv[1])
