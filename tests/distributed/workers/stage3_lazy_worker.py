"""Start a model built under ``paddle.LazyGuard`` (or eagerly, the reference) with the Trainer, optionally under
a per-process memory limit, and write the per-step losses.

Options: ``--width``/``--depth`` (a ``depth``-layer ``width×width`` MLP), ``--lazy`` (build it under
``paddle.LazyGuard`` after ``paddle.seed(seed)``, as PaddleNLP's ``llm/run_pretrain.py`` does with
``from_config``), ``--limit_mib`` (``RLIMIT_DATA`` of this process, set after the imports and before the model
is built: the data segment, anonymous mappings included, which Paddle's CPU allocator draws from) plus every
``TrainingArguments`` option. Output ``<result_dir>/rank<r>.json``: ``losses``, ``grad_norms``, ``peak_rss_mib``,
``limit_mib``; a process that runs out of memory under the limit writes ``{"out_of_memory": "<error>"}``.
"""
from __future__ import annotations

import os
import resource
import sys
from dataclasses import dataclass, field

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..")))

import numpy as np  # noqa: E402
import paddle  # noqa: E402

from common import exit_cleanly, parse_worker_arguments, write_json  # noqa: E402
from paddletrainer import Trainer  # noqa: E402


@dataclass
class LazyWorkerArguments:
    result_dir: str = field(default=None, metadata={"help": "where rank<r>.json goes"})
    width: int = field(default=64, metadata={"help": "MLP width"})
    depth: int = field(default=2, metadata={"help": "MLP hidden layers"})
    lazy: bool = field(default=False, metadata={"help": "build the model under paddle.LazyGuard"})
    limit_mib: int = field(default=0, metadata={"help": "RLIMIT_DATA in MiB (0: none)"})


class DeepMLP(paddle.nn.Layer):
    """``depth`` Linear(width, width)+tanh layers (Xavier-uniform weights, zero biases) and a Normal-initialised
    head to 1: the regression loss and the prediction."""

    def __init__(self, width, depth):
        super().__init__()
        self.body = paddle.nn.LayerList([paddle.nn.Linear(width, width) for _ in range(depth)])
        head = paddle.ParamAttr(initializer=paddle.nn.initializer.Normal(0.0, 0.02))
        self.head = paddle.nn.Linear(width, 1, weight_attr=head)

    def forward(self, x, labels=None):
        for layer in self.body:
            x = paddle.tanh(layer(x))
        pred = self.head(x).squeeze(-1)
        return (pred,) if labels is None else (paddle.nn.functional.mse_loss(pred, labels), pred)


def data(n, width):
    rng = np.random.RandomState(0)
    x = rng.randn(n, width).astype("float32")
    y = np.tanh(x[:, 0] - 0.5 * x[:, 1]).astype("float32")
    return [{"x": x[i], "labels": y[i]} for i in range(n)]


def vm_data_mib():
    """This process's data segment now (``VmData``: what ``RLIMIT_DATA`` bounds), in MiB."""
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmData:")) / 1024


def main():
    work, args = parse_worker_arguments(LazyWorkerArguments)
    rank = paddle.distributed.get_rank()
    path = os.path.join(work.result_dir, f"rank{rank}.json")
    if work.limit_mib:
        limit = work.limit_mib << 20
        resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))
    try:
        paddle.seed(args.seed)  # the script's set_seed before the model, as PaddleNLP's scripts do
        if work.lazy:
            with paddle.LazyGuard():
                model = DeepMLP(work.width, work.depth)
        else:
            model = DeepMLP(work.width, work.depth)
        trainer = Trainer(model=model, args=args, train_dataset=data(64, work.width))
        trainer.train(resume_from_checkpoint=args.resume_from_checkpoint)
    except MemoryError as exc:  # Paddle's CPU allocator's ResourceExhausted, NumPy's failed allocations
        if not work.limit_mib:
            raise
        write_json(path, {"out_of_memory": f"{type(exc).__name__}: {str(exc)[:300]}"})
        os._exit(0)
    history = trainer.state.log_history
    write_json(path, {"losses": [h["loss"] for h in history if "loss" in h],
                      "grad_norms": [h["grad_norm"] for h in history if "grad_norm" in h],
                      "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                      "vm_data_mib": vm_data_mib(), "limit_mib": work.limit_mib})
    exit_cleanly(trainer.topology)


if __name__ == "__main__":
    main()
