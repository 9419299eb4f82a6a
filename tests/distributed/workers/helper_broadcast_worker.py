"""``paddletrainer.utils.helper``'s broadcasts beside PaddleNLP's, on 2 CPU processes.

``argv``: the result directory and the layout, ``dp`` (plain data parallel: no fleet hybrid group, the data group
is the job) or ``sharding`` (fleet's hybrid group, sharding 2). Each rank pretends to be the first process of a
node of its own (``PADDLE_RANK_IN_NODE=0``, its own working directory ``node<r>``), so the file helpers see two
nodes. Every case runs our function and PaddleNLP's on equal inputs; ``rank<r>.json`` holds both results.
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..")))

import numpy as np  # noqa: E402
import paddle  # noqa: E402

from common import exit_cleanly, write_json  # noqa: E402


def describe(value):
    """A JSON-able picture of a nested state: each tensor as its name, dtype and values."""
    if isinstance(value, paddle.Tensor):
        return {"name": value.name, "dtype": str(value.dtype), "values": value.numpy().tolist()}
    if isinstance(value, dict):
        return {k: describe(v) for k, v in sorted(value.items())}
    return value


def tensor(name, values, dtype="float32"):
    t = paddle.to_tensor(np.asarray(values, dtype=dtype))
    t.name = name
    return t


def file_cases(ours, theirs, rank):
    res = {}
    if rank == 1:  # node 0 has not even the directory: distributed_file creates it
        os.makedirs("ckpt", exist_ok=True)
        for name in ("ours.bin", "theirs.bin"):
            with open(os.path.join("ckpt", name), "wb") as f:
                f.write(b"weights of node 1")
    res["isfile"] = [bool(ours.distributed_isfile("ckpt/ours.bin")), bool(theirs.distributed_isfile("ckpt/theirs.bin"))]
    res["isfile_missing"] = [bool(ours.distributed_isfile("ckpt/none.bin")),
                             bool(theirs.distributed_isfile("ckpt/none.bin"))]
    ours.distributed_file("ckpt/ours.bin")
    theirs.distributed_file("ckpt/theirs.bin")
    res["file"] = [open(os.path.join("ckpt", n), "rb").read().decode() for n in ("ours.bin", "theirs.bin")]
    try:
        ours.distributed_file("ckpt/none.bin")
        res["missing_file"] = "no error"
    except FileNotFoundError as e:
        res["missing_file"] = str(e)
    return res


def optimizer_state(rank):
    """Rank 0 loaded the whole state; rank 1 only its expert's (``expert.w``, marked no_sync)."""
    full = {"shared.w_moment1_0": tensor("shared.w_moment1_0", [[1.0, 2.0]]),
            "expert.w_moment1_0": tensor("expert.w_moment1_0", [[5.0 + rank]]),
            "master_weights": {"shared.w": tensor("shared.w", [[0.5, 0.25]]),
                               "expert.w": tensor("expert.w", [[7.0 + rank]])},
            "LR_Scheduler": {"last_epoch": 3}}
    if rank == 0:
        return full
    return {"expert.w_moment1_0": full["expert.w_moment1_0"],
            "master_weights": {"expert.w": full["master_weights"]["expert.w"]}}


def model_state():
    shared, expert = tensor("shared.w", [[0.5, 0.25]]), tensor("expert.w", [[7.0]])
    expert.no_sync = True
    return {"shared.weight": shared, "expert.weight": expert}


def optimizer_cases(ours, theirs, rank):
    res = {}
    for tag, fn in (("ours", ours), ("theirs", theirs)):
        state = optimizer_state(0) if rank == 0 else None
        res[f"dp_{tag}"] = describe(fn.broadcast_dp_optimizer(state))
        res[f"moe_{tag}"] = describe(fn.broadcast_moe_optimizer(optimizer_state(rank), model_state()))
    res["moe_all_keys_ours"] = describe(ours.broadcast_moe_optimizer(optimizer_state(rank), broadcast_dp=False))
    return res


def model_cases(ours, theirs, rank, layout):
    res = {}
    for tag, fn in (("ours", ours), ("theirs", theirs)):
        if tag == "theirs" and layout == "dp":
            continue  # PaddleNLP's needs fleet's hybrid group
        paddle.seed(100 + rank)  # a different initialisation on each rank
        model = paddle.nn.Linear(3, 2)
        fn.broadcast_dataset_rank0_model(model)
        res[f"model_{tag}"] = [p.numpy().tolist() for p in model.parameters()]
    paddle.seed(100)
    res["rank0_init"] = [p.numpy().tolist() for p in paddle.nn.Linear(3, 2).parameters()]
    return res


def main(out, layout):
    from paddlenlp.trainer.utils import helper as theirs

    from paddletrainer.parallel import init_topology
    from paddletrainer.parallel.config import ParallelConfig
    from paddletrainer.parallel.layout import Layout
    from paddletrainer.utils import helper as ours

    if layout == "dp":
        config = ParallelConfig(layout=Layout(world_size=2, dp=2))
    else:
        config = ParallelConfig(layout=Layout(world_size=2, sharding=2), sharding_stage=1)
    topo = init_topology(config)
    rank = topo.rank
    os.environ["PADDLE_RANK_IN_NODE"] = "0"  # two "nodes" of one process each
    node = os.path.join(out, f"node{rank}")
    os.makedirs(node, exist_ok=True)
    os.chdir(node)
    res = {"layout": layout}
    res.update(file_cases(ours, theirs, rank))
    res.update(optimizer_cases(ours, theirs, rank))
    res.update(model_cases(ours, theirs, rank, layout))
    write_json(os.path.join(out, f"rank{rank}.json"), res)
    exit_cleanly(topo)


if __name__ == "__main__":
    main(os.path.abspath(sys.argv[1]), sys.argv[2])
