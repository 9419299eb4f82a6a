"""Check every tensor-parallel op the CPU backend fills, forward and backward, against one-process math.

Runs on 2 processes (tp2). Each check builds the full tensors from a fixed seed on every rank, runs the
op through Paddle's own entry points (``mp_ops._c_identity`` ... as patched by the CPU backend), and
compares outputs and input gradients with the plain single-process computation. Writes
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

from common import exit_cleanly, layout_args, leaf, write_json  # noqa: E402
from common import max_abs_error as err  # noqa: E402


def main(out):
    faulthandler.enable()  # a native crash (segfault/abort) prints the Python stacks too
    faulthandler.dump_traceback_later(float(os.environ.get("PT_WORKER_TIMEOUT", "120")), exit=True)
    from paddle.distributed import collective
    from paddle.distributed.fleet.layers.mpu import mp_ops

    from paddletrainer.parallel import init_topology
    from paddletrainer.parallel.cpu import tp_ops

    topo = init_topology(layout_args(tp=2, ga=1))
    group, r, n = topo.tp_group, topo.tp_rank, topo.tp_degree
    rng = np.random.RandomState(7)
    x = rng.randn(3, 8).astype("float32")
    w = rng.randn(n, 3, 8).astype("float32")  # one weight per rank
    half = 8 // n
    chunk = slice(r * half, (r + 1) * half)
    res = {"patched": float(mp_ops._c_identity is tp_ops._c_identity
                            and collective._c_identity is tp_ops._c_identity
                            and mp_ops._c_softmax_with_cross_entropy is tp_ops.parallel_softmax_cross_entropy)}

    # identity: forward copies, backward sums the gradients of every rank: dL/dx = Σ_r w_r
    t = leaf(x)
    y = mp_ops._c_identity(t, group=group)
    (y * paddle.to_tensor(w[r])).sum().backward()
    res["identity_fwd"], res["identity_bwd"] = err(y, x), err(t.grad, w.sum(0))

    # allreduce: forward sums x_r over ranks (x_r = x + r), backward passes the gradient through
    t = leaf(x + r)
    y = mp_ops._mp_allreduce(t, group=group)
    (y * paddle.to_tensor(w[0])).sum().backward()
    res["allreduce_fwd"] = err(y, sum(x + k for k in range(n)))
    res["allreduce_bwd"] = err(t.grad, w[0])

    # split: forward keeps this rank's columns, backward gathers every rank's column gradient
    t = leaf(x)
    y = mp_ops._c_split(t, group=group)
    (y * paddle.to_tensor(w[r][:, chunk])).sum().backward()
    expected = np.concatenate([w[k][:, k * half:(k + 1) * half] for k in range(n)], axis=-1)
    res["split_fwd"], res["split_bwd"] = err(y, x[:, chunk]), err(t.grad, expected)

    # concat: forward gathers the column blocks, backward keeps this rank's columns of the gradient
    t = leaf(x[:, chunk])
    y = mp_ops._c_concat(t, group=group)
    (y * paddle.to_tensor(w[0])).sum().backward()
    res["concat_fwd"], res["concat_bwd"] = err(y, x), err(t.grad, w[0][:, chunk])

    # vocab-parallel softmax cross entropy, with one ignored position
    logits = rng.randn(2, 5, 8).astype("float32") * 3
    labels = rng.randint(0, 8, size=(2, 5)).astype("int64")
    labels[1, 2] = -100
    upstream = rng.rand(2, 5, 1).astype("float32")
    full = leaf(logits)
    ref = paddle.nn.functional.cross_entropy(full, paddle.to_tensor(labels).unsqueeze(-1), reduction="none",
                                             ignore_index=-100)
    (ref * paddle.to_tensor(upstream)).sum().backward()
    local = leaf(logits[..., chunk])
    loss, softmax = mp_ops._c_softmax_with_cross_entropy(local, paddle.to_tensor(labels), group=group,
                                                          return_softmax=True)
    (loss * paddle.to_tensor(upstream)).sum().backward()
    full_softmax = paddle.nn.functional.softmax(paddle.to_tensor(logits), axis=-1).numpy()
    res["softmax_ce_fwd"] = err(loss, ref)
    res["softmax_ce_softmax"] = err(softmax, full_softmax[..., chunk])
    res["softmax_ce_bwd"] = err(local.grad, full.grad.numpy()[..., chunk])
    res["softmax_ce_shape"] = float(list(loss.shape) == [2, 5, 1])
    write_json(os.path.join(out, f"rank{topo.rank}.json"), res)
    return topo


if __name__ == "__main__":
    exit_cleanly(main(sys.argv[1]))
