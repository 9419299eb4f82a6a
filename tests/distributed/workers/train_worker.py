"""Train a tiny model a few steps on one layout and write this rank's losses, grad norms and memory.

Run under ``paddle.distributed.launch`` for a parallel layout, or plainly for the single-process
reference. Every number the tests compare is computed by paddletrainer.parallel's functions, the same
ones the Trainer calls: init_topology, parallelize, no_sync, clip_grad_norm, pipeline.train_batch.

Output: ``<out>/rank<r>.json`` with ``losses`` and ``grad_norms`` (one per step, equal on every rank),
``eval_loss`` (forward only, after training), ``opt_state_bytes`` (this rank's optimizer accumulators) and ``param_bytes`` (parameter storage held).
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import faulthandler
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..")))

import numpy as np  # noqa: E402
import paddle  # noqa: E402

from common import (exit_cleanly, layout_args, micro_batches, regression_data, token_data,  # noqa: E402
                    write_json)
from paddletrainer.parallel.wrappers import unwrap_optimizer  # noqa: E402


def parse():
    p = argparse.ArgumentParser()
    p.add_argument("--model", choices=["llama", "mlp"], required=True)
    p.add_argument("--dp", type=int, default=1)
    p.add_argument("--sharding", type=int, default=1)
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--pp", type=int, default=1)
    p.add_argument("--stage", type=int, default=0)
    p.add_argument("--offload", action="store_true")
    p.add_argument("--ga", type=int, default=2)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--max-norm", type=float, default=1.0)
    p.add_argument("--segment-size", type=int, default=None)
    p.add_argument("--weights", default=None)
    p.add_argument("--out", required=True)
    return p.parse_args()


def build_mlp():
    paddle.seed(1234)  # the same initial weights in every process
    return paddle.nn.Sequential(paddle.nn.Linear(8, 64), paddle.nn.ReLU(), paddle.nn.Linear(64, 32),
                                paddle.nn.ReLU(), paddle.nn.Linear(32, 1))


def build_llama(weights, topology):
    from paddlenlp.transformers import LlamaConfig, LlamaForCausalLM, LlamaForCausalLMPipe

    config = LlamaConfig.from_pretrained(weights)
    config.tensor_parallel_degree = topology.tp_degree
    config.tensor_parallel_rank = topology.tp_rank
    config.tensor_parallel_output = True
    cls = LlamaForCausalLMPipe if topology.pp_degree > 1 else LlamaForCausalLM
    return cls.from_pretrained(weights, config=config, dtype="float32")


def opt_state_bytes(optimizer):
    total = 0
    for per_param in unwrap_optimizer(optimizer)._accumulators.values():
        for t in per_param.values():
            if t._is_initialized():
                total += t._numel() * t.element_size()
    return int(total)


def param_bytes(model):
    total = 0
    for p in model.parameters():
        if p._is_initialized():
            total += p._numel() * p.element_size()
        slice_ = getattr(p, "fw_storage", None)  # sharding stage 3 keeps only this rank's slice
        if slice_ is not None and not p._is_initialized():
            total += slice_._numel() * slice_.element_size()
    return int(total)


def offload_master_bytes(model):
    """Bytes of the fp32 master weights sharding offload keeps in host memory (0 without offload)."""
    masters = [getattr(p, "master_weight", None) for p in model.parameters()]
    return int(sum(m._numel() * m.element_size() for m in masters if m is not None and m._is_initialized()))


def forward_loss(model, kind, batch):
    x, y = (paddle.to_tensor(a) for a in batch)
    if kind == "mlp":
        return paddle.nn.functional.mse_loss(model(x), y)
    out = model(input_ids=x, labels=y, return_dict=False)
    return out[0] if isinstance(out, (tuple, list)) else out


def pipeline_inputs(micro):
    """Dict micro-batches, as the Trainer passes them (the model's _prepare_pipeline_inputs_func splits them)."""
    return [{"input_ids": paddle.to_tensor(x), "labels": paddle.to_tensor(y)} for x, y in micro]


class ReduceCounter:
    """Counts ``paddle.distributed.reduce`` calls (sharding stage 1/2 reduce gradients to their owners with it;
    Paddle's modules look it up on ``paddle.distributed`` at call time)."""

    def __init__(self):
        self.calls = 0
        self._reduce = paddle.distributed.reduce
        paddle.distributed.reduce = self

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return self._reduce(*args, **kwargs)


def main():
    a = parse()
    reduces = ReduceCounter()
    # A hung collective would otherwise be a silent timeout: dump every thread's stack and exit instead.
    faulthandler.enable()  # a native crash (segfault/abort) prints the Python stacks too
    faulthandler.dump_traceback_later(float(os.environ.get("PT_WORKER_TIMEOUT", "240")), exit=True)
    from paddletrainer.parallel import (clip_grad_norm, init_topology, mean_over_data_group, no_sync,
                                        parallelize, pipeline)

    started = time.time()
    args = layout_args(dp=a.dp, sharding=a.sharding, tp=a.tp, pp=a.pp, stage=a.stage, offload=a.offload, ga=a.ga)
    if a.segment_size is not None:  # stage 3's slicing threshold is a config field like any other
        args = dataclasses.replace(args, stage3_segment_size=a.segment_size)
    topo = init_topology(args)
    model = build_mlp() if a.model == "mlp" else build_llama(a.weights, topo)
    optimizer = paddle.optimizer.AdamW(learning_rate=1e-2, parameters=model.parameters(), weight_decay=0.01)
    model, optimizer = parallelize(model, optimizer, topo, args)
    data = regression_data(a.steps) if a.model == "mlp" else token_data(a.steps)

    losses, norms = [], []
    reduces.calls = 0
    for step in range(a.steps):
        micro = micro_batches(data, step, a.ga, topo.data_rank, topo.data_world_size)
        if topo.pp_degree > 1:
            loss = pipeline.train_batch(model, pipeline_inputs(micro))
        else:
            loss = paddle.zeros([], dtype="float32")
            for i, mb in enumerate(micro):
                ctx = no_sync(model) if i < len(micro) - 1 else contextlib.nullcontext()
                with ctx:
                    part = forward_loss(model, a.model, mb) / a.ga
                    part.backward()
                loss = loss + part.detach()
        optimizer.sync_gradients()
        norm = clip_grad_norm(model, optimizer, topo, a.max_norm)
        optimizer.step()
        optimizer.clear_grad()
        losses.append(float(mean_over_data_group(loss, topo)))
        norms.append(float(norm))
    reduce_calls_per_step = reduces.calls / a.steps

    # evaluation on the first global batch, after training: forward only
    micro = micro_batches(data, 0, a.ga, topo.data_rank, topo.data_world_size)
    if topo.pp_degree > 1:
        eval_loss, _ = pipeline.eval_batch(model, pipeline_inputs(micro))
    else:
        model.eval()
        with paddle.no_grad():
            eval_loss = sum(forward_loss(model, a.model, mb) for mb in micro) / a.ga
        model.train()
    eval_loss = float(mean_over_data_group(eval_loss, topo))

    write_json(os.path.join(a.out, f"rank{topo.rank}.json"), {
        "eval_loss": eval_loss,
        "rank": topo.rank, "data_rank": topo.data_rank, "tp_rank": topo.tp_rank, "pp_rank": topo.pp_rank,
        "sharding_rank": topo.sharding_rank, "dp_rank": topo.dp_rank,
        "losses": losses, "grad_norms": norms, "reduce_calls_per_step": reduce_calls_per_step,
        "opt_state_bytes": opt_state_bytes(optimizer), "param_bytes": param_bytes(model),
        "offload_master_bytes": offload_master_bytes(model),
        "seconds": time.time() - started,
    })
    return topo


if __name__ == "__main__":
    np.set_printoptions(precision=6)
    exit_cleanly(main())
