"""Bytes of the training state one rank holds under a layout: parameters, gradients, optimizer state, master
weights and the data-parallel communication buffers.

The input is the parameter count a rank holds after tensor and pipeline parallelism (what it would hold
without sharding: tp splits the matmul weights, pp keeps one stage's layers); the sharding stage then divides
(ZeRO): stage ≥ 1 the optimizer state and master weights, ≥ 2 the gradients, 3 the parameters, each over the
sharding degree. The division is even here; Paddle's stage 1/2 (V1) assigns *whole* parameters to ranks, so a
real partition is uneven by up to one parameter (``scripts/bench_memory.py`` measures how much).

Not modelled here: activations (they depend on the model and batch: ``cost_model.memory``), per-tensor
scalars (AdamW's beta powers, 8 bytes per parameter tensor), allocator overheads and the fixed process
baseline (libraries, communication contexts): ``planner.predict_memory`` adds those.

Pure arithmetic (no paddle), importable anywhere.
"""
from __future__ import annotations

import dataclasses

__all__ = ["DTYPE_BYTES", "OPTIMIZER_STATES", "StateBytes", "state_bytes_per_rank"]

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
# Per-element state tensors of each optimizer (Paddle's accumulators, leaving out the scalar beta powers).
OPTIMIZER_STATES = {"adamw": 2, "adam": 2, "lamb": 2, "momentum": 1, "adagrad": 1, "sgd": 0}


@dataclasses.dataclass(frozen=True)
class StateBytes:
    """Bytes per rank by kind; ``total`` is their sum."""

    params: float
    grads: float
    optimizer: float
    master: float
    comm_buffers: float

    @property
    def total(self) -> float:
        return self.params + self.grads + self.optimizer + self.master + self.comm_buffers

    def as_dict(self) -> dict:
        return {**dataclasses.asdict(self), "total": self.total}


def _positive(name: str, value: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return value


def state_bytes_per_rank(params_per_rank: int, *, dtype: str = "float32", optimizer: str = "adamw", dp: int = 1,
                         sharding: int = 1, stage: int = 0, master_weights: bool | None = None,
                         grads_in_comm_buffers: bool = False) -> StateBytes:
    """Predicted bytes of one rank's training state.

    ``params_per_rank``: parameters of this rank after tp/pp, before sharding. ``dtype``: the parameters' and
    gradients' dtype (one of ``DTYPE_BYTES``). ``master_weights``: keep fp32 masters of 16-bit parameters
    (Paddle's ``multi_precision``; default: yes for 16-bit dtypes); the optimizer moments are fp32 then, else
    in the parameters' dtype. ``dp > 1`` adds Paddle ``DataParallel``'s fused all-reduce buffers, one more copy
    of the gradients, unless ``grads_in_comm_buffers`` (the gradients are views of those buffers).
    """
    if not isinstance(params_per_rank, int) or isinstance(params_per_rank, bool) or params_per_rank < 0:
        raise ValueError(f"params_per_rank must be a non-negative integer, got {params_per_rank!r}")
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"dtype must be one of {sorted(DTYPE_BYTES)}, got {dtype!r}")
    if optimizer not in OPTIMIZER_STATES:
        raise ValueError(f"optimizer must be one of {sorted(OPTIMIZER_STATES)}, got {optimizer!r}")
    _positive("dp", dp)
    _positive("sharding", sharding)
    if stage not in (0, 1, 2, 3) or (sharding > 1) != (stage > 0):
        raise ValueError(f"stage must be 1, 2 or 3 with sharding > 1 and 0 without, got stage {stage!r} "
                         f"with sharding {sharding}")
    width = DTYPE_BYTES[dtype]
    masters = width < 4 if master_weights is None else bool(master_weights)
    state_width = 4 if masters else width
    n = params_per_rank
    params = n * width / (sharding if stage >= 3 else 1)
    grads = n * width / (sharding if stage >= 2 else 1)
    optim = n * OPTIMIZER_STATES[optimizer] * state_width / (sharding if stage >= 1 else 1)
    master = n * 4 / (sharding if stage >= 1 else 1) if masters else 0.0
    comm = grads if dp > 1 and not grads_in_comm_buffers else 0.0
    return StateBytes(params=params, grads=grads, optimizer=optim, master=master, comm_buffers=comm)
