"""A tiny PaddleNLP Llama under one parallel layout: train, save, or load a checkpoint saved in another.

    llama_layouts.py save --tp 2 --pp 2 --weights W --out OUT
        train 2 steps, save OUT/checkpoint-2, train step 3, write OUT/save.rank<r>.json (loss of step 3)
    llama_layouts.py load --dp 2 --from OUT/checkpoint-2 --weights W --out OUT2
        build the model in this layout (fresh AdamW), load the checkpoint, re-save it in this layout as
        OUT2/checkpoint-resaved, train step 3, write OUT2/load.rank<r>.json

Run plainly (no launcher) for one process. The model, topology, wrapping and pipeline step all come from
paddletrainer.parallel, the same functions the Trainer uses.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import faulthandler
import json
import os
import sys

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..")))
import numpy as np  # noqa: E402
import paddle  # noqa: E402

from paddletrainer.checkpoint import Checkpointer, load_checkpoint, save_checkpoint  # noqa: E402

GLOBAL_BATCH, GA, SEQ, VOCAB = 8, 2, 16, 96


def config():
    from paddlenlp.transformers import LlamaConfig

    return LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                       num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=SEQ, seq_length=SEQ,
                       rms_norm_eps=1e-6, use_flash_attention=False, use_fused_rms_norm=False,
                       fuse_attention_qkv=False, fuse_attention_ffn=False, tie_word_embeddings=False, dtype="float32")


def write_weights(path):
    """The starting weights every layout loads with from_pretrained (one process)."""
    from paddlenlp.transformers import LlamaForCausalLM

    paddle.seed(7)
    LlamaForCausalLM(config()).save_pretrained(path)


def layout_args(dp, sharding, tp, pp, stage):
    from paddletrainer.parallel.config import ParallelConfig
    from paddletrainer.parallel.layout import Layout

    layout = Layout(world_size=dp * sharding * tp * pp, dp=dp, sharding=sharding, tp=tp, pp=pp)
    return ParallelConfig(layout=layout, sharding_stage=stage if sharding > 1 else 0, accumulate_steps=GA,
                          micro_batch_size=GLOBAL_BATCH // GA // (dp * sharding), seed=42)


def build(weights, topo):
    from paddlenlp.transformers import LlamaConfig, LlamaForCausalLM, LlamaForCausalLMPipe

    cfg = LlamaConfig.from_pretrained(weights)
    cfg.tensor_parallel_degree, cfg.tensor_parallel_rank, cfg.tensor_parallel_output = topo.tp_degree, topo.tp_rank, True
    cls = LlamaForCausalLMPipe if topo.pp_degree > 1 else LlamaForCausalLM
    return cls.from_pretrained(weights, config=cfg, dtype="float32")


def micro_batches(step, data_rank, data_world):
    """Layout-free order: micro-step m covers samples [m·B·W, (m+1)·B·W) of the step; rank r takes its B."""
    rng = np.random.RandomState(step)
    tokens = rng.randint(0, VOCAB, size=(GLOBAL_BATCH, SEQ + 1)).astype("int64")
    per_micro = GLOBAL_BATCH // GA
    b = per_micro // data_world
    out = []
    for m in range(GA):
        rows = tokens[m * per_micro + data_rank * b: m * per_micro + (data_rank + 1) * b]
        out.append((paddle.to_tensor(rows[:, :-1]), paddle.to_tensor(rows[:, 1:])))
    return out


def train_step(model, optimizer, topo, step, before_optimizer_step=lambda: None):
    from paddletrainer.parallel import mean_over_data_group, no_sync, pipeline

    micro = micro_batches(step, topo.data_rank, topo.data_world_size)
    if topo.pp_degree > 1:
        loss = pipeline.train_batch(model, micro)
    else:
        loss = paddle.zeros([], dtype="float32")
        for i, (x, y) in enumerate(micro):
            with no_sync(model) if i < len(micro) - 1 else contextlib.nullcontext():
                part = model(input_ids=x, labels=y, return_dict=False)[0] / GA
                part.backward()
            loss = loss + part.detach()
    before_optimizer_step()
    optimizer.step()
    optimizer.clear_grad()
    return float(mean_over_data_group(loss, topo))


def main():
    # A hang dumps every thread's stack into the worker log (and exits) shortly before the launch's timeout.
    faulthandler.enable()  # a native crash (segfault/abort) prints the Python stacks too
    faulthandler.dump_traceback_later(float(os.environ.get("PT_WORKER_TIMEOUT", "280")), exit=True)
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["weights", "save", "load"])
    for axis in ("dp", "sharding", "tp", "pp", "stage"):
        p.add_argument(f"--{axis}", type=int, default=1 if axis != "stage" else 0)
    p.add_argument("--weights", required=True)
    p.add_argument("--out")
    p.add_argument("--from", dest="src")
    p.add_argument("--segment-size", type=int, default=None, help="stage 3: slice params bigger than this")
    a = p.parse_args()
    if a.mode == "weights":
        return write_weights(a.weights)

    from paddletrainer.parallel import init_topology, parallelize

    args = layout_args(a.dp, a.sharding, a.tp, a.pp, a.stage)
    if a.segment_size is not None:  # stage 3's slicing threshold is a config field like any other
        args = dataclasses.replace(args, stage3_segment_size=a.segment_size)
    topo = init_topology(args)
    model = build(a.weights, topo)
    sched = paddle.optimizer.lr.LinearWarmup(1e-2, warmup_steps=4, start_lr=1e-3, end_lr=1e-2)
    optimizer = paddle.optimizer.AdamW(learning_rate=sched, parameters=model.parameters(), weight_decay=0.01)
    model, optimizer = parallelize(model, optimizer, topo, args)

    result = {"rank": topo.rank}
    if a.mode == "save":
        for step in range(2):
            train_step(model, optimizer, topo, step)
            sched.step()
        saver = Checkpointer(model=model, optimizer=optimizer, lr_scheduler=sched, topology=topo,
                             trainer_state={"global_step": 2}, data_state={"consumed_samples": 16})
        saver.save(os.path.join(a.out, "checkpoint-2"), async_save=True)
        # the next forward/backward overlaps the background copy (stage 3 gathers and frees its slices in
        # it), the optimizer step waits for the copy, and the write overlaps the step
        result["loss3"] = train_step(model, optimizer, topo, 2, before_optimizer_step=saver.wait_for_snapshot)
        saver.finish()
    else:
        res = load_checkpoint(a.src, model=model, optimizer=optimizer, lr_scheduler=sched, topology=topo)
        assert res.trainer_state == {"global_step": 2} and res.data_state == {"consumed_samples": 16}
        result["rng_restored"] = res.rng_restored
        save_checkpoint(os.path.join(a.out, "checkpoint-resaved"), model=model, optimizer=optimizer,
                        lr_scheduler=sched, topology=topo)
        result["loss3"] = train_step(model, optimizer, topo, 2)
    with open(os.path.join(a.out, f"{a.mode}.rank{topo.rank}.json"), "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
