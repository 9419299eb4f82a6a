"""``trainer_worker.py`` under sharding stage 3, with the collectives that reduce its gradients counted.

The Trainer runs exactly as in ``trainer_worker.py`` (same arguments, same result file). Once the stage-3
model is built, every full-size gradient buffer stage 3 creates for a sliced parameter in backward
(``group_sharded_stage3._create_params_grad``) is tagged, and the public collectives Paddle's and
paddletrainer's stage-3 code call (``dist.all_reduce``, ``dist.reduce_scatter``, ``dist.stream.reduce_scatter``, the
CPU fill's ``reduce_scatter_into``)
count the calls that are handed such a buffer. The rank's result file gets ``stage3_gradient_collectives``:
``{"all_reduce": calls, "reduce_scatter": calls, "reduce_scatter_output_is_one_slice": bool,
"sliced_params": n}``.
"""
from __future__ import annotations

import functools
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import paddle.distributed as dist  # noqa: E402
from paddle.distributed.fleet.meta_parallel.sharding import group_sharded_stage3 as gs3  # noqa: E402

import trainer_worker  # noqa: E402
from paddletrainer.parallel.cpu import reduce_scatter as cpu_reduce_scatter  # noqa: E402

TAG = "_stage3_full_gradient"
COUNTS = {"all_reduce": 0, "reduce_scatter": 0, "reduce_scatter_output_is_one_slice": True, "sliced_params": 0}


def _tag_full_gradients(create):
    def tagged(trainable_params, param2buffer_size, task_flow):
        out = create(trainable_params, param2buffer_size, task_flow)
        for full_grad in task_flow.full_grad.values():
            setattr(full_grad, TAG, True)
        return out

    return tagged


def _tagged(tensor):
    setattr(tensor, TAG, True)
    return tensor


def _is_full_gradient(tensor) -> bool:
    return getattr(tensor, TAG, False)


def _count_all_reduce(all_reduce):
    def counted(*args, **kwargs):
        if _is_full_gradient(kwargs.get("tensor", args[0] if args else None)):
            COUNTS["all_reduce"] += 1
        return all_reduce(*args, **kwargs)

    return counted


def _count_reduce_scatter(reduce_scatter, group_size):
    def counted(*args, **kwargs):
        out = kwargs.get("tensor", args[0] if args else None)
        source = args[1] if len(args) > 1 else kwargs.get("tensor_list", kwargs.get("tensor_or_tensor_list"))
        if _is_full_gradient(source):
            COUNTS["reduce_scatter"] += 1
            if int(out.numel()) * group_size != int(source.numel()):
                COUNTS["reduce_scatter_output_is_one_slice"] = False
        return reduce_scatter(*args, **kwargs)

    return counted


def _count_after_construction(init):
    @functools.wraps(init)  # the CPU backend reads __init__'s source (inspect follows __wrapped__)
    def constructed(self, *args, **kwargs):
        init(self, *args, **kwargs)
        # Installed now, after the CPU backend put its reduce-scatter fill in place (at init_topology).
        COUNTS["sliced_params"] = len(self._param2buffer)
        gs3._create_params_grad = _tag_full_gradients(gs3._create_params_grad)
        dist.all_reduce = _count_all_reduce(dist.all_reduce)
        dist.reduce_scatter = _count_reduce_scatter(dist.reduce_scatter, self._group.nranks)
        dist.stream.reduce_scatter = _count_reduce_scatter(dist.stream.reduce_scatter, self._group.nranks)
        # a gradient backward wrote as it is (no padded buffer) is tagged where stage 3 reduces it
        reduce_into_slice = self._reduce_scatter_into_slice
        self._reduce_scatter_into_slice = lambda param, grad: reduce_into_slice(param, _tagged(grad))
        # on the CPU build stage 3 calls the fill's function itself (reducing its scratch gradient in place)
        cpu_reduce_scatter.reduce_scatter_into = _count_reduce_scatter(cpu_reduce_scatter.reduce_scatter_into,
                                                                      self._group.nranks)

    return constructed


def _write_with_counts(write_json):
    def write(path, payload):
        write_json(path, {**payload, "stage3_gradient_collectives": COUNTS})

    return write


if __name__ == "__main__":
    gs3.GroupShardedStage3.__init__ = _count_after_construction(gs3.GroupShardedStage3.__init__)
    trainer_worker.write_json = _write_with_counts(trainer_worker.write_json)
    trainer_worker.main()
