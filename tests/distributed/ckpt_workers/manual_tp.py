"""Two ranks holding hand-made tensor-parallel slices (no fleet), for checkpoint resharding tests.

    manual_tp.py save OUT       # column split of w [8, 6] (split_axis 1), bias split, norm replicated
    manual_tp.py load_rows OUT  # the same tensors as a row split (split_axis 0): reshard on load
    manual_tp.py save_flat OUT  # w as stage-3 style flat slices (a ckpt_placement with a flat range)

Gradients are fixed functions of the *global* tensor, and AdamW is elementwise, so every rank's params
and moments equal the matching slice of a one-process run; rank 0 writes that run's arrays to
OUT/expected.npz. Each rank writes OUT/<mode>.rank<r>.ok when all of its checks pass.
"""
import os
import sys
import types

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", ".."))
import numpy as np  # noqa: E402
import paddle  # noqa: E402
import paddle.distributed as dist  # noqa: E402

from paddletrainer.checkpoint import Checkpointer, load_checkpoint, read_index, save_checkpoint  # noqa: E402
from paddletrainer.checkpoint.placement import flat_placement, replicated  # noqa: E402

GLOBAL = {"w": (8, 6), "b": (6,), "norm": (6,)}


def init_value(name):
    n = int(np.prod(GLOBAL[name]))
    return (np.arange(n, dtype=np.float32).reshape(GLOBAL[name]) / n) - 0.3


def grad_value(name, step):
    n = int(np.prod(GLOBAL[name]))
    return np.cos(np.arange(n, dtype=np.float32) * (step + 1)).reshape(GLOBAL[name])


class Net(paddle.nn.Layer):
    """Parameters are slices of GLOBAL: split = {name: axis}, or full when rank is None."""

    def __init__(self, split, rank, degree):
        super().__init__()
        for name, shape in GLOBAL.items():
            axis = split.get(name)
            sl = [slice(None)] * len(shape)
            if axis == "flat" and rank is not None:  # 1-D slice of the flattened tensor, like stage 3
                n = int(np.prod(shape)) // degree
                value = init_value(name).reshape(-1)[rank * n:(rank + 1) * n]
                p = self.create_parameter([n], default_initializer=paddle.nn.initializer.Assign(value))
                p.ckpt_placement = flat_placement(replicated(shape), rank * n, (rank + 1) * n)
                p.global_slice = ("flat", rank * n, (rank + 1) * n)
                setattr(self, name, p)
                continue
            if axis is not None and rank is not None:
                size = shape[axis] // degree
                sl[axis] = slice(rank * size, (rank + 1) * size)
            value = init_value(name)[tuple(sl)]
            p = self.create_parameter(list(value.shape), default_initializer=paddle.nn.initializer.Assign(value))
            if axis is not None and rank is not None:
                p.is_distributed, p.split_axis = True, axis
            p.global_slice = tuple(sl)
            setattr(self, name, p)


def make(split, rank, degree):
    net = Net(split, rank, degree)
    opt = paddle.optimizer.AdamW(learning_rate=0.1, parameters=net.parameters(), weight_decay=0.01)
    return net, opt


def train(net, opt, steps):
    for step in range(steps):
        for name in GLOBAL:
            p = getattr(net, name)
            p.grad = paddle.to_tensor(take(grad_value(name, step), p.global_slice))  # the grad of the slice
        opt.step()
        opt.clear_grad()


def topo(rank, tp):
    return types.SimpleNamespace(world_size=tp, rank=rank, dp_degree=1, dp_rank=0, sharding_degree=1,
                                 sharding_rank=0, tp_degree=tp, tp_rank=rank, pp_degree=1, pp_rank=0)


def expected_arrays():
    net, opt = make({}, None, 1)
    train(net, opt, 3)
    out = {}
    for name in GLOBAL:
        p = getattr(net, name)
        out[f"model/{name}"] = p.numpy()
        for kind in opt._accumulators:
            out[f"optim/{name}/{kind}"] = opt._accumulators[kind][p.name].numpy()
    return out


def take(arr, sl):
    """The part of a global array a parameter holds (box slices, or a flat range)."""
    if sl and sl[0] == "flat":
        return arr.reshape(-1)[sl[1]:sl[2]]
    return arr[sl]


def check(net, opt, expected):
    for name in GLOBAL:
        p = getattr(net, name)
        np.testing.assert_array_equal(p.numpy(), take(expected[f"model/{name}"], p.global_slice))
        for kind in ("moment1", "moment2"):
            np.testing.assert_array_equal(opt._accumulators[kind][p.name].numpy(),
                                          take(expected[f"optim/{name}/{kind}"], p.global_slice))
        for kind in ("beta1_pow_acc", "beta2_pow_acc"):
            np.testing.assert_array_equal(opt._accumulators[kind][p.name].numpy(), expected[f"optim/{name}/{kind}"])


def main():
    mode, out = sys.argv[1], sys.argv[2]
    dist.init_parallel_env()
    rank = dist.get_rank()
    expected = expected_arrays()
    if mode == "save":
        net, opt = make({"w": 1, "b": 0}, rank, 2)
        train(net, opt, 3)
        check(net, opt, expected)  # the slicing argument above holds
        if rank == 0:
            np.savez(os.path.join(out, "expected.npz"), **expected)
        save_checkpoint(os.path.join(out, "checkpoint-3"), model=net, optimizer=opt, topology=topo(rank, 2),
                        trainer_state={"global_step": 3})
        # the same once more, asynchronously: published at the collective finish point
        saver = Checkpointer(model=net, optimizer=opt, topology=topo(rank, 2))
        saver.save(os.path.join(out, "checkpoint-4"), async_save=True)
        saver.finish()
        index = read_index(os.path.join(out, "checkpoint-4"))
        assert [p["file"] for p in index["tensors"]["model/norm"]["pieces"]] == ["model_state.tp00_pp00.safetensors"]
        assert len(index["tensors"]["model/w"]["pieces"]) == 2
        # a repeat save reuses the writer assignment (nothing changed on any rank): the same pieces
        saver.save(os.path.join(out, "checkpoint-5"))
        assert read_index(os.path.join(out, "checkpoint-5"))["tensors"] == index["tensors"]
        # a tensor that only rank 1 gained: both ranks must gather again (rank 0's own list is unchanged)
        if rank == 1:
            net.register_buffer("rank1_only", paddle.full([3], 7.0))
        saver.save(os.path.join(out, "checkpoint-6"))
        pieces = read_index(os.path.join(out, "checkpoint-6"))["tensors"]["model/rank1_only"]["pieces"]
        assert [p["file"] for p in pieces] == ["model_state.tp01_pp00.safetensors"]
    elif mode == "save_flat":
        net, opt = make({"w": "flat", "b": 0}, rank, 2)
        train(net, opt, 3)
        check(net, opt, expected)
        save_checkpoint(os.path.join(out, "checkpoint-flat"), model=net, optimizer=opt, topology=topo(rank, 2))
        index = read_index(os.path.join(out, "checkpoint-flat"))
        assert [p.get("flat") for p in index["tensors"]["optim/w/moment1"]["pieces"]] == [[0, 24], [24, 48]]
    elif mode == "load_rows":
        net, opt = make({"w": 0, "b": 0}, rank, 2)
        res = load_checkpoint(os.path.join(out, "checkpoint-3"), model=net, optimizer=opt, topology=topo(rank, 2))
        assert res.rng_restored  # same degrees (tp2), so the per-rank RNG files apply
        check(net, opt, expected)
    open(os.path.join(out, f"{mode}.rank{rank}.ok"), "w").close()


if __name__ == "__main__":
    main()
