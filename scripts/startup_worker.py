"""One start of training, timed phase by phase: ``paddletrainer.Trainer`` or a bare Paddle script doing the same set-up.

Both build the same PaddleNLP Llama from a config (random weights), AdamW with a linear schedule and a global-norm
clip at 1.0, a random-token data set, and run one optimizer step; run alone or under ``paddle.distributed.launch``
with ``--tp``/``--pp`` (dp = world / (tp·pp)). Both import paddlenlp's Llama first, at the top, so the
``import`` phase holds the same modules in both.

* ``trainer``: PaddleNLP's script shape: ``TrainingArguments``, the model's tp degree and rank read from them
  (which builds the process groups), the model, ``Trainer(...).train()`` for one step. The phases are the Trainer's
  own startup report (``startup/*`` in the ``metrics_output_path`` JSON lines).
* ``bare``: the fewest calls Paddle needs: on the CPU build the same gloo fills (``paddletrainer.parallel.cpu``:
  Paddle's CPU build cannot run tp/pp without them), ``fleet.init`` with the degrees, the model, AdamW +
  ``fleet.distributed_optimizer``, ``fleet.distributed_model``, a ``DataLoader`` with a
  ``DistributedBatchSampler``, one step (``train_batch`` under pp). Each phase timed with ``time.time()``
  between the same boundaries, from the process's start (``/proc``).

Writes ``<result_dir>/rank<r>.json``: ``{"runner": ..., "phases": {phase: seconds, ..., "total": seconds}}``.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

from paddlenlp.transformers import LlamaConfig, LlamaForCausalLM, LlamaForCausalLMPipe  # noqa: E402 (both runners)

import paddle  # noqa: E402

SIZE = dict(hidden_size=512, num_hidden_layers=4, num_attention_heads=8, intermediate_size=1408, vocab_size=32000)
SEQ = 64


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runner", choices=("trainer", "bare"), required=True)
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--pp", type=int, default=1)
    p.add_argument("--result-dir", required=True)
    return p.parse_args(argv)


def llama_config(tp_degree: int, tp_rank: int) -> LlamaConfig:
    config = LlamaConfig(**SIZE, max_position_embeddings=SEQ, seq_length=SEQ, use_flash_attention=False)
    config.tensor_parallel_degree, config.tensor_parallel_rank = tp_degree, tp_rank
    config.tensor_parallel_output = False
    return config


def token_samples(n: int = 64):
    tokens = paddle.randint(0, SIZE["vocab_size"], [n, SEQ + 1], dtype="int64").numpy()
    return [{"input_ids": t[:-1], "labels": t[1:]} for t in tokens]


def world_size() -> int:
    return int(os.environ.get("PADDLE_TRAINERS_NUM", "1"))


def run_trainer(a) -> dict:
    sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..")))
    from paddletrainer import Trainer, TrainingArguments  # noqa: E402 (timed: its import phase ends here)

    metrics_dir = os.path.join(a.result_dir, "metrics")
    args = TrainingArguments(output_dir=os.path.join(a.result_dir, "out"), per_device_train_batch_size=1,
                             gradient_accumulation_steps=max(a.pp, 1), max_steps=1, logging_steps=1,
                             learning_rate=1e-4, lr_scheduler_type="linear", max_grad_norm=1.0, weight_decay=0.0,
                             tensor_parallel_degree=a.tp, pipeline_parallel_degree=a.pp, save_strategy="no",
                             report_to="none", disable_tqdm=True, metrics_output_path=metrics_dir, seed=1)
    config = llama_config(max(args.tensor_parallel_degree, 1), args.tensor_parallel_rank)  # groups built here
    model = (LlamaForCausalLMPipe if a.pp > 1 else LlamaForCausalLM)(config)
    Trainer(model=model, args=args, train_dataset=token_samples()).train()
    rank = paddle.distributed.get_rank()
    with open(os.path.join(metrics_dir, f"metrics_rank{rank}.json")) as f:
        row = next(r for r in map(json.loads, f) if "startup/total" in r)
    return {k[len("startup/"):]: v for k, v in row.items() if k.startswith("startup/")}


def bare_topology(a):
    """The CPU fills and ``fleet.init`` with the degrees; returns (hcg or None, dp degree)."""
    if world_size() == 1:
        return None
    from paddle.distributed import fleet

    if not paddle.is_compiled_with_cuda():
        from paddletrainer.parallel import cpu
        cpu.install()
    dp = world_size() // (a.tp * a.pp)
    strategy = fleet.DistributedStrategy()
    strategy.hybrid_configs = {"dp_degree": dp, "mp_degree": a.tp, "pp_degree": a.pp}
    if a.pp > 1:
        strategy.pipeline_configs = {"accumulate_steps": a.pp, "micro_batch_size": 1,
                                     "enable_partial_send_recv": paddle.is_compiled_with_cuda()}
    if a.tp > 1:
        strategy.tensor_parallel_configs = {"tensor_init_seed": 1}
    fleet.init(is_collective=True, strategy=strategy)
    return fleet.get_hybrid_communicate_group()


def bare_step(model, optimizer, schedule, batch, pp: int) -> None:
    if pp > 1:
        model.train_batch([batch["input_ids"], batch["labels"]], optimizer, schedule)
        return
    out = model(input_ids=batch["input_ids"], labels=batch["labels"])
    (out[0] if isinstance(out, tuple) else out.loss).backward()
    optimizer.step()
    optimizer.clear_grad()
    schedule.step()


def run_bare(a, imports_done: float) -> dict:
    from paddle.distributed import fleet

    marks = {"import": imports_done}
    hcg = bare_topology(a)
    marks["topology"] = time.time()
    tp_rank = hcg.get_model_parallel_rank() if hcg is not None else 0
    model = (LlamaForCausalLMPipe if a.pp > 1 else LlamaForCausalLM)(llama_config(a.tp, tp_rank))
    marks["model"] = time.time()
    schedule = paddle.optimizer.lr.PolynomialDecay(1e-4, decay_steps=1, end_lr=0.0)  # linear, no warmup
    optimizer = paddle.optimizer.AdamW(schedule, parameters=model.parameters(), weight_decay=0.0,
                                       grad_clip=paddle.nn.ClipGradByGlobalNorm(1.0))
    if hcg is not None:
        optimizer = fleet.distributed_optimizer(optimizer)
    marks["optimizer"] = time.time()
    if hcg is not None:
        model = fleet.distributed_model(model)
    marks["wrap"] = time.time()
    dataset = token_samples()
    dp, dp_rank = (hcg.get_data_parallel_world_size(), hcg.get_data_parallel_rank()) if hcg else (1, 0)
    sampler = paddle.io.DistributedBatchSampler(dataset, batch_size=max(a.pp, 1), num_replicas=dp, rank=dp_rank,
                                                shuffle=True, drop_last=True)
    batch = next(iter(paddle.io.DataLoader(dataset, batch_sampler=sampler)))
    marks["first_batch"] = time.time()
    bare_step(model, optimizer, schedule, batch, a.pp)
    marks["first_step"] = time.time()
    from paddletrainer.metrics.startup import process_start_time  # after the timed part

    previous, phases = process_start_time(), {}
    for phase, at in marks.items():
        phases[phase], previous = at - previous, at
    phases["total"] = marks["first_step"] - process_start_time()
    return phases


def main(argv=None):
    imports_done = time.time()
    a = parse(argv)
    sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..")))
    phases = run_trainer(a) if a.runner == "trainer" else run_bare(a, imports_done)
    rank = int(os.environ.get("PADDLE_TRAINER_ID", "0"))
    os.makedirs(a.result_dir, exist_ok=True)
    with open(os.path.join(a.result_dir, f"rank{rank}.json"), "w") as f:
        json.dump({"runner": a.runner, "phases": phases}, f)


if __name__ == "__main__":
    main()
