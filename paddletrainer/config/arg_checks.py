"""Checks of ``TrainingArguments`` values that follow from the fields' types and from facts, not from any one option's
meaning: each raises one ``ValueError`` naming the option, the value and the valid range (``PdArgumentParser`` turns
it into a usage error, exit 2). Stdlib only: the arguments import without paddle.

* Every float field (``float``, ``Optional[float]``, lists of them) must be finite: NaN passes every range check
  (``nan < 0`` is False) and an infinite learning rate, epoch count or warmup is no setting at all.
* Every int field must fit a signed 64-bit integer, the integer type Paddle and NumPy take them as.
* A few options whose valid range is a fact of the library that consumes them (:data:`RANGES`: NumPy's seed,
  Paddle's AdamW betas/epsilon, ...), checked at parse time instead of when the Trainer builds that library's object.
* Sizes bounded by what a tensor or the machine can hold, never by free memory (:func:`check_sizes`):
  per-device batch sizes <= 2**31 - 1, samples per optimizer step <= 2**31 - 1, ``dataloader_num_workers`` <=
  :data:`MAX_DATALOADER_WORKERS`. A refusal never depends on a fact of one rank (its CPUs, its node): every rank
  refuses alike, also when the checks run again inside ``train()`` where the other ranks would wait in a collective.
"""
from __future__ import annotations

import dataclasses
import functools
import logging
import math
import os
from typing import Any, Dict, List, NamedTuple, Optional, Tuple, Union, get_args, get_origin, get_type_hints

__all__ = ["INT32_MAX", "INT64_MAX", "MAX_DATALOADER_WORKERS", "RANGES", "check_option_values", "check_samples_per_step",
           "check_scheduler_kwargs", "check_sizes", "usable_cpus", "usable_output_dir"]

INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
INT64_MIN = -(2**63)
# dataloader_num_workers refused beyond this, the same bound on every rank and node (see check_sizes)
MAX_DATALOADER_WORKERS = 1024

logger = logging.getLogger(__name__)


class Range(NamedTuple):
    """Valid values ``low <= v <= high`` (``<`` when the bound is open); None: unbounded on that side."""

    low: Optional[float]
    high: Optional[float]
    why: str
    low_open: bool = False
    high_open: bool = False

    def holds(self, value) -> bool:
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return False
        return self.high is None or (value < self.high if self.high_open else value <= self.high)

    def valid(self) -> str:
        """``must lie in [0, 1)``, ``must be >= 0``, ``must be > 0``."""
        if self.low is not None and self.high is not None:
            return (f"must lie in {'(' if self.low_open else '['}{self.low}, {self.high}"
                    f"{')' if self.high_open else ']'}")
        if self.low is not None:
            return f"must be {'>' if self.low_open else '>='} {self.low}"
        return f"must be {'<' if self.high_open else '<='} {self.high}"


# Options whose range is a fact of what consumes them. A value of None (an unset Optional) is never checked.
RANGES: Dict[str, Range] = {
    "seed": Range(0, 2**32 - 1, "np.random.seed takes an unsigned 32-bit integer"),
    "adam_beta1": Range(0, 1, "Paddle's AdamW takes beta1 in [0, 1)", high_open=True),
    "adam_beta2": Range(0, 1, "Paddle's AdamW takes beta2 in [0, 1)", high_open=True),
    "adam_epsilon": Range(0, None, "Paddle's AdamW takes epsilon >= 0"),
    "weight_decay": Range(0, None, "decay shrinks weights; a negative one would grow them"),
    "num_train_epochs": Range(0, None, "a number of passes over the data"),
    "learning_rate": Range(0, None, "a learning rate"),
    "lr_end": Range(0, None, "a learning rate"),
    "min_learning_rate": Range(0, None, "a learning rate"),
    "scale_loss": Range(0, None, "the initial fp16 loss scale multiplies the loss", low_open=True),
    "eval_steps": Range(0, None, "an interval in steps; 0 or None means logging_steps"),
    "replica_check_steps": Range(0, None, "an interval in steps; 0 turns the replica check off"),
}


@functools.lru_cache(maxsize=None)
def _numeric_fields(cls: type) -> Tuple[Tuple[str, type], ...]:
    """``(name, int|float)`` for every init field of ``cls`` whose type is int or float, bare, Optional or in
    (nested) lists; a subclass's own fields (PaddleNLP scripts extend TrainingArguments) are included."""
    try:
        hints = get_type_hints(cls)
    except (NameError, TypeError):  # a script's subclass with annotations that do not resolve: the plain types
        hints = {f.name: f.type for f in dataclasses.fields(cls) if not isinstance(f.type, str)}
    found = []
    for f in dataclasses.fields(cls):
        hint = hints.get(f.name)
        while True:  # peel Optional[...] and List[...] down to the element type
            args = [a for a in get_args(hint) if a is not type(None)]
            if get_origin(hint) in (Union, list, List) and len(args) == 1:
                hint = args[0]
                continue
            break
        if hint in (int, float):
            found.append((f.name, hint))
    return tuple(found)


def _scalars(value) -> List[Any]:
    if isinstance(value, (list, tuple)):
        return [x for v in value for x in _scalars(v)]
    return [value]


def check_option_values(args) -> None:
    """The generic checks of the module docstring over every numeric field of ``args`` (a dataclass instance),
    then :data:`RANGES`."""
    for name, kind in _numeric_fields(type(args)):
        for value in _scalars(getattr(args, name)):
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                continue  # not a number: the field's own check (or the parser) reports it
            if kind is float and not math.isfinite(value):
                raise ValueError(f"{name}={value!r} is invalid: must be a finite number (not NaN or infinity)")
            if kind is int and not INT64_MIN <= value <= INT64_MAX:
                raise ValueError(f"{name}={value!r} is invalid: must fit a signed 64-bit integer "
                                 "(-2**63 to 2**63 - 1), the integer type Paddle and NumPy take")
    for name, rule in RANGES.items():
        value = getattr(args, name, None)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and not rule.holds(value):
            raise ValueError(f"{name}={value!r} is invalid: {rule.valid()} ({rule.why})")


def check_scheduler_kwargs(kwargs: Dict[str, Any], valid: Tuple[str, ...]) -> None:
    """``lr_scheduler_kwargs`` held to the checks its keys get as options of their own (``--num_cycles`` ...):
    known keys only, each a finite number (not a bool or text), in its :data:`RANGES` range."""
    if not isinstance(kwargs, dict):
        raise ValueError(f"lr_scheduler_kwargs: must be a JSON object of {', '.join(valid)}, got "
                         f"{type(kwargs).__name__}")
    unknown = sorted(str(k)[:40] for k in kwargs if k not in valid)
    if unknown:
        raise ValueError(f"lr_scheduler_kwargs: unknown key(s) {', '.join(unknown)}; valid: {', '.join(valid)}")
    for name, value in kwargs.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"lr_scheduler_kwargs: {name}={str(value)[:40]!r} is invalid: must be a number")
        if not math.isfinite(value):
            raise ValueError(f"lr_scheduler_kwargs: {name}={value!r} is invalid: must be a finite number (not NaN "
                             "or infinity)")
        rule = RANGES.get(name)
        if rule is not None and not rule.holds(value):
            raise ValueError(f"lr_scheduler_kwargs: {name}={value!r} is invalid: {rule.valid()} ({rule.why})")


def usable_output_dir(output_dir: Optional[str]) -> Optional[str]:
    """``output_dir`` with ``~`` expanded, refused when it cannot be a directory: empty, an existing file (or other
    non-directory), or under a path that is a file. Only what ``stat`` tells without creating anything (whether
    it can be created or written is learned when the run takes its lock)."""
    if output_dir is None:
        return None
    if not output_dir:
        raise ValueError("output_dir='' is invalid: must name a directory (where checkpoints and logs are written)")
    path = os.path.expanduser(output_dir)
    ancestor = path
    while not os.path.lexists(ancestor) and os.path.dirname(ancestor) not in ("", ancestor):
        ancestor = os.path.dirname(ancestor)
    if os.path.lexists(ancestor) and not os.path.isdir(ancestor):
        where = "is" if ancestor == path else f"lies under {ancestor!r}, which is"
        raise ValueError(f"output_dir={output_dir!r} is invalid: it {where} a file, not a directory")
    return path


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity mask; ``os.cpu_count()`` where there is none)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def check_sizes(args) -> None:
    """Batch sizes and data-loading workers against what a tensor and a machine can hold (see the module doc).

    * ``per_device_{train,eval}_batch_size <= 2**31 - 1``: a batch is the leading dimension of every input
      tensor, and 2**31 - 1 is the largest dimension the 32-bit indexing of many of Paddle's GPU kernels
      addresses; every batch a device can hold is far below it.
    * ``0 <= dataloader_num_workers <= MAX_DATALOADER_WORKERS`` (1024): each worker is a process holding its own
      copy of the dataset and prefetched batches, and 1024 per training process is far beyond what data loading
      uses. The bound is fixed,
      not this process's CPU count: CPU affinity (NUMA binding) and machines differ between ranks, and an error on
      some ranks only would leave the others waiting. Above the CPUs this process may run on a warning says so
      (PyTorch's DataLoader warns likewise): a config written for a bigger machine still runs.
    """
    for name in ("per_device_train_batch_size", "per_device_eval_batch_size"):
        value = getattr(args, name)
        if isinstance(value, int) and value > INT32_MAX:
            raise ValueError(f"{name}={value} is invalid: must be <= {INT32_MAX} (2**31 - 1), the largest tensor "
                             "dimension 32-bit indexing addresses; a batch is the leading dimension of each input")
    workers, cpus = args.dataloader_num_workers, usable_cpus()
    if workers < 0 or workers > MAX_DATALOADER_WORKERS:
        raise ValueError(
            f"dataloader_num_workers={workers} is invalid: must be >= 0 and <= {MAX_DATALOADER_WORKERS}; each worker "
            f"is a process with its own copy of the dataset and prefetched batches (more than the CPUs a process "
            f"may run on only share them)")
    if workers > cpus:
        logger.warning("dataloader_num_workers=%d is more than the %d CPU(s) this process may run on: the workers "
                       "share them (PyTorch's DataLoader warns likewise)", workers, cpus)


def check_samples_per_step(args, data_world_size: int) -> None:
    """``per_device_train_batch_size x gradient_accumulation_steps x data ranks <= 2**31 - 1``: the global batch
    bounded as the per-device batch is (the sampler lays out one optimizer step's sample indices at once, and a
    step of more samples than a tensor dimension addresses is no setting anyone trains with; beyond it the
    layout alone would exhaust memory). The data ranks are dp x sharding (tensor- and pipeline-parallel ranks
    share their batch), the same number on every rank."""
    step = args.per_device_train_batch_size * args.gradient_accumulation_steps * data_world_size
    if step > INT32_MAX:
        raise ValueError(
            f"per_device_train_batch_size={args.per_device_train_batch_size} x gradient_accumulation_steps="
            f"{args.gradient_accumulation_steps} x {data_world_size} data rank(s) (dp x sharding) = {step} samples "
            f"per optimizer step is invalid: must be <= {INT32_MAX} (2**31 - 1, as a per-device batch; the sampler "
            f"lays out a step's sample indices at once)")
