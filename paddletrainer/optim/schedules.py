"""Learning-rate schedules: pure factor functions and ``get_scheduler``.

Every schedule is a pure *factor* function ``step -> multiplier of the peak learning rate``, wrapped in
``paddle.optimizer.lr.LambdaDecay``. Keeping the math in plain functions makes it testable without Paddle
and lets checkpoints restore a scheduler by its step alone.

Schedules (names as in PaddleNLP's ``lr_scheduler_type``), with ``w`` warmup steps and ``T`` total steps:

    warmup (all but "constant"):  factor = step / w                          for step < w
    linear:       factor = (T - step) / (T - w)                                   -> 0 at T
    cosine:       factor = 0.5 * (1 + cos(pi * 2 * num_cycles * progress))        progress = (step - w) / (T - w)
    polynomial:   lr = (lr0 - lr_end) * (1 - progress) ** power + lr_end        -> lr_end at T
    constant / constant_with_warmup: factor = 1 after warmup

``min_learning_rate`` (0 by default, so PaddleNLP's curves are unchanged) is a floor for linear and cosine:
``lr = min_lr + (lr0 - min_lr) * factor``, the convention of PaddleNLP's LLM pretraining scripts.
"""
from __future__ import annotations

import math
from functools import partial
from typing import Callable, Optional

import paddle

from ..trainer_utils import SchedulerType

__all__ = ["constant_factor", "constant_with_warmup_factor", "linear_factor", "cosine_factor", "polynomial_factor",
           "schedule_factor_fn", "get_scheduler", "get_constant_schedule", "get_constant_schedule_with_warmup",
           "get_linear_schedule_with_warmup", "get_cosine_schedule_with_warmup",
           "get_polynomial_decay_schedule_with_warmup"]


def _warmup(step: int, warmup_steps: int) -> Optional[float]:
    """The linear warmup factor, or None once warmup is over."""
    if step < warmup_steps:
        return float(step) / float(max(1, warmup_steps))
    return None


def _progress(step: int, warmup_steps: int, total_steps: int) -> float:
    """Fraction of the decay phase done, clamped to [0, 1]."""
    return min(1.0, float(step - warmup_steps) / float(max(1, total_steps - warmup_steps)))


def constant_factor(step: int) -> float:
    return 1.0


def constant_with_warmup_factor(step: int, warmup_steps: int) -> float:
    w = _warmup(step, warmup_steps)
    return 1.0 if w is None else w


def linear_factor(step: int, warmup_steps: int, total_steps: int, floor: float = 0.0) -> float:
    w = _warmup(step, warmup_steps)
    if w is not None:
        return w
    decay = max(0.0, 1.0 - _progress(step, warmup_steps, total_steps))
    return floor + (1.0 - floor) * decay


def cosine_factor(step: int, warmup_steps: int, total_steps: int, num_cycles: float = 0.5, floor: float = 0.0) -> float:
    w = _warmup(step, warmup_steps)
    if w is not None:
        return w
    progress = _progress(step, warmup_steps, total_steps)
    decay = max(0.0, 0.5 * (1.0 + math.cos(math.pi * float(num_cycles) * 2.0 * progress)))
    return floor + (1.0 - floor) * decay


def polynomial_factor(step: int, warmup_steps: int, total_steps: int, lr_init: float, lr_end: float, power: float) -> float:
    w = _warmup(step, warmup_steps)
    if w is not None:
        return w
    if step > total_steps:
        return lr_end / lr_init
    remaining = 1.0 - _progress(step, warmup_steps, total_steps)
    return ((lr_init - lr_end) * remaining**power + lr_end) / lr_init


def schedule_factor_fn(
    name: str,
    *,
    learning_rate: float,
    num_warmup_steps: int,
    num_training_steps: int,
    num_cycles: float = 0.5,
    lr_end: float = 1e-7,
    power: float = 1.0,
    min_learning_rate: float = 0.0,
) -> Callable[[int], float]:
    """The factor function of schedule ``name`` (a ``SchedulerType`` value)."""
    name = SchedulerType(name).value
    floor = min_learning_rate / learning_rate if learning_rate > 0 else 0.0
    if name == "constant":
        return constant_factor
    if name == "constant_with_warmup":
        return partial(constant_with_warmup_factor, warmup_steps=num_warmup_steps)
    if name == "linear":
        return partial(linear_factor, warmup_steps=num_warmup_steps, total_steps=num_training_steps, floor=floor)
    if name == "cosine":
        return partial(
            cosine_factor, warmup_steps=num_warmup_steps, total_steps=num_training_steps, num_cycles=num_cycles, floor=floor
        )
    if name == "polynomial":
        if not learning_rate > lr_end:
            raise ValueError(f"lr_end={lr_end} must be smaller than learning_rate={learning_rate} for 'polynomial'")
        return partial(
            polynomial_factor,
            warmup_steps=num_warmup_steps,
            total_steps=num_training_steps,
            lr_init=learning_rate,
            lr_end=lr_end,
            power=power,
        )
    raise ValueError(f"lr_scheduler_type={name!r} has no schedule here")  # unreachable: SchedulerType validated it


def get_scheduler(
    name: str,
    learning_rate: float,
    num_warmup_steps: Optional[int] = None,
    num_training_steps: Optional[int] = None,
    num_cycles: float = 0.5,
    lr_end: float = 1e-7,
    power: float = 1.0,
    min_learning_rate: float = 0.0,
) -> paddle.optimizer.lr.LRScheduler:
    """Build a Paddle LR scheduler by name (PaddleNLP's ``get_scheduler`` signature, plus ``min_learning_rate``).

    As in PaddleNLP, every schedule but ``constant`` needs ``num_warmup_steps``, and all but the two constant
    ones ``num_training_steps``: leaving one out is a ``ValueError`` naming it.
    """
    kind = SchedulerType(name).value
    if kind != "constant" and num_warmup_steps is None:
        raise ValueError(f"get_scheduler: lr_scheduler_type {kind!r} requires num_warmup_steps")
    if kind not in ("constant", "constant_with_warmup") and num_training_steps is None:
        raise ValueError(f"get_scheduler: lr_scheduler_type {kind!r} requires num_training_steps")
    factor = schedule_factor_fn(
        kind,
        learning_rate=learning_rate,
        num_warmup_steps=num_warmup_steps or 0,
        num_training_steps=num_training_steps or 0,
        num_cycles=num_cycles,
        lr_end=lr_end,
        power=power,
        min_learning_rate=min_learning_rate,
    )
    return paddle.optimizer.lr.LambdaDecay(learning_rate, factor)


# PaddleNLP's one-schedule constructors (``trainer_utils.get_*_schedule*``), with its signatures: the same factor
# functions as get_scheduler, and ``last_epoch`` to rebuild a schedule at a step when resuming.
def get_constant_schedule(learning_rate: float, last_epoch: int = -1) -> paddle.optimizer.lr.LambdaDecay:
    """A constant learning rate."""
    return paddle.optimizer.lr.LambdaDecay(learning_rate, constant_factor, last_epoch=last_epoch)


def get_constant_schedule_with_warmup(learning_rate: float, num_warmup_steps: int,
                                      last_epoch: int = -1) -> paddle.optimizer.lr.LambdaDecay:
    """A linear warmup from 0 over ``num_warmup_steps``, then constant."""
    factor = partial(constant_with_warmup_factor, warmup_steps=num_warmup_steps)
    return paddle.optimizer.lr.LambdaDecay(learning_rate, factor, last_epoch=last_epoch)


def get_linear_schedule_with_warmup(learning_rate: float, num_warmup_steps: int, num_training_steps: int,
                                    last_epoch: int = -1) -> paddle.optimizer.lr.LambdaDecay:
    """A linear warmup, then a linear decay to 0 at ``num_training_steps``."""
    factor = partial(linear_factor, warmup_steps=num_warmup_steps, total_steps=num_training_steps)
    return paddle.optimizer.lr.LambdaDecay(learning_rate, factor, last_epoch=last_epoch)


def get_cosine_schedule_with_warmup(learning_rate: float, num_warmup_steps: int, num_training_steps: int,
                                    num_cycles: float = 0.5, last_epoch: int = -1) -> paddle.optimizer.lr.LambdaDecay:
    """A linear warmup, then ``num_cycles`` cosine waves (0.5: a half wave down to 0 at ``num_training_steps``)."""
    factor = partial(cosine_factor, warmup_steps=num_warmup_steps, total_steps=num_training_steps,
                     num_cycles=num_cycles)
    return paddle.optimizer.lr.LambdaDecay(learning_rate, factor, last_epoch=last_epoch)


def get_polynomial_decay_schedule_with_warmup(learning_rate: float, num_warmup_steps: int, num_training_steps: int,
                                              lr_end: float = 1e-7, power: float = 1.0,
                                              last_epoch: int = -1) -> paddle.optimizer.lr.LambdaDecay:
    """A linear warmup, then a polynomial decay of ``power`` to ``lr_end`` at ``num_training_steps``."""
    factor = schedule_factor_fn("polynomial", learning_rate=learning_rate, num_warmup_steps=num_warmup_steps,
                                num_training_steps=num_training_steps, lr_end=lr_end, power=power)
    return paddle.optimizer.lr.LambdaDecay(learning_rate, factor, last_epoch=last_epoch)
