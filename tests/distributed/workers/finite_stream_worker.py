"""A finite stream shorter than max_steps on every data rank: each rank reads the same one-pass stream
(``IterableDatasetShard`` splits it), so every rank's epoch ends at the same step and the next, empty, epoch stops
training everywhere with a warning. Writes rank<r>.json: the final step, the forward calls and the warnings."""
import json
import logging
import os
import sys
from dataclasses import dataclass, field

import numpy as np
import paddle

from common import parse_worker_arguments
from paddletrainer import Trainer


@dataclass
class StreamArguments:
    result_dir: str = field(default=None, metadata={"help": "where rank<r>.json goes"})
    num_samples: int = field(default=10, metadata={"help": "items in the stream (one pass)"})


class FiniteStream(paddle.io.IterableDataset):
    """Hugging Face's FiniteIterableDataset: one pass, then every later pass is empty."""

    def __init__(self, n):
        rng = np.random.RandomState(0)
        self.x = rng.uniform(-1, 1, size=(n, 1)).astype("float32")
        self.current = 0

    def __iter__(self):
        while self.current < len(self.x):
            yield {"x": self.x[self.current], "labels": np.float32(2 * self.x[self.current, 0] - 1)}
            self.current += 1


class Regression(paddle.nn.Layer):
    calls = 0

    def __init__(self):
        super().__init__()
        self.linear = paddle.nn.Linear(1, 1)

    def forward(self, x, labels=None):
        Regression.calls += 1
        pred = self.linear(x).squeeze(-1)
        return paddle.nn.functional.mse_loss(pred, labels), pred


def main():
    stream_args, args = parse_worker_arguments(StreamArguments)
    warnings = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: warnings.append(record.getMessage())
    logging.getLogger("paddletrainer").addHandler(handler)
    out = Trainer(Regression(), args=args, train_dataset=FiniteStream(stream_args.num_samples)).train()
    rank = args.process_index
    with open(os.path.join(stream_args.result_dir, f"rank{rank}.json"), "w") as f:
        json.dump({"global_step": out.global_step, "forward_calls": Regression.calls, "warnings": warnings}, f)


if __name__ == "__main__":
    sys.exit(main())
