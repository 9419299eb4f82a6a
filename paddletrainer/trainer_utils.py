"""Small types and helpers shared by the trainer, its arguments and its callbacks.

The names mirror ``paddlenlp.trainer.trainer_utils`` so that code written against PaddleNLP keeps working.
This module imports only the standard library, numpy and the paddle-free checkpoint naming and discovery
(``checkpoint.discovery``, whose PaddleNLP names it re-exports) — never paddle: ``TrainingArguments`` imports it, and
importing the arguments must stay cheap; everything else in the package may import it. ``set_seed`` and
``_get_distributed_seeds`` are defined in :mod:`paddletrainer.runtime.seeding` and resolved here on first use.
"""

import datetime
import logging
import os
import socket
import time
from enum import Enum
from typing import TYPE_CHECKING, Any, Dict, Iterable, List, NamedTuple, Optional, Tuple, Union

import numpy as np

# checkpoint naming and discovery live in checkpoint.discovery (paddle-free); PaddleNLP's scripts import them here
from .checkpoint.discovery import (PADDLENLP_UNIFIED_INDEXES, RESUME_AUTO, foreign_checkpoint_entries,  # noqa: F401
                                   get_last_checkpoint, is_empty_dir, is_our_checkpoint, is_paddlenlp_checkpoint,
                                   is_paddlenlp_unified_checkpoint, requested_resume, resolve_resume_checkpoint,
                                   sorted_checkpoints)
from .checkpoint.placement import (CHECKPOINT_COMPLETE_MARKER, CHECKPOINT_INDEX_NAME,  # noqa: F401
                                   PREFIX_CHECKPOINT_DIR, checkpoint_dir_name, parse_checkpoint_step)
from .lazy_exports import lazy_attributes

__all__ = [
    "ExplicitEnum",
    "IntervalStrategy",
    "SchedulerType",
    "OptimizerNames",
    "ShardingOption",
    "EvalPrediction",
    "EvalLoopOutput",
    "PredictionOutput",
    "TrainOutput",
    "PREFIX_CHECKPOINT_DIR",
    "CHECKPOINT_COMPLETE_MARKER",
    "set_seed",
    "get_last_checkpoint",
    "sorted_checkpoints",
    "requested_resume",
    "speed_metrics",
    "default_logdir",
    "normalize_report_to",
    "has_length",
    "find_batch_size",
    "_get_distributed_seeds",
    "is_paddlenlp_checkpoint",
    "is_our_checkpoint",
    "foreign_checkpoint_entries",
    "is_paddlenlp_unified_checkpoint",
    "EvaluationStrategy",
    "is_main_process",
    "total_processes_number",
    "log_trainer_start",
    "should_skip_data",
    "split_parallel_config",
    "download_recovery_ckpt_from_pdc",
    # resolved on first use (they need paddle): _PADDLE_NAMES below
    "set_hyrbid_parallel_seed",
    "get_scheduler",
    "get_constant_schedule",
    "get_constant_schedule_with_warmup",
    "get_linear_schedule_with_warmup",
    "get_cosine_schedule_with_warmup",
    "get_polynomial_decay_schedule_with_warmup",
    "metrics_format",
    "log_metrics",
    "save_metrics",
    "save_state",
    "TrainerMemoryTracker",
    "IterableDatasetShard",
    "LastBatchPaddingSampler",
    "RemoveColumnsCollator",
]

class ExplicitEnum(str, Enum):
    """A string enum whose error for an unknown value lists the valid values.

    Members compare equal to their string value (``IntervalStrategy.STEPS == "steps"``), which keeps code that
    compares against PaddleNLP-style strings working.
    """

    @classmethod
    def _missing_(cls, value):
        valid = ", ".join(m.value for m in cls)
        raise ValueError(f"{value!r} is not a valid {cls.__name__}; choose one of: {valid}")

    def __str__(self):
        return self.value


class IntervalStrategy(ExplicitEnum):
    """When to evaluate, save or log: never, every N steps, or at the end of each epoch."""

    NO = "no"
    STEPS = "steps"
    EPOCH = "epoch"


# PaddleNLP keeps HF's deprecated name for the same three values; one enum here, so both compare equal to "steps"
EvaluationStrategy = IntervalStrategy


class SchedulerType(ExplicitEnum):
    """Learning-rate schedules (the five PaddleNLP 3.0 offers; ``optim/schedules.py`` implements them)."""

    LINEAR = "linear"
    COSINE = "cosine"
    CONSTANT = "constant"
    CONSTANT_WITH_WARMUP = "constant_with_warmup"
    POLYNOMIAL = "polynomial"


class OptimizerNames(ExplicitEnum):
    """Optimizers selectable with ``--optim``.

    Only optimizers that Paddle 3.3.1 ships in ``paddle.optimizer`` and that work with ``multi_precision`` and
    hybrid-parallel wrapping are listed: AdamW (PaddleNLP's default), Adam, SGD, Momentum, Lamb and Adamax.
    PaddleNLP's ``adafactor`` (its own Trainer raises for it), ``adamw_mini``, ``adamw_custom`` and
    ``adamw_16bit_moment`` (custom PaddleNLP kernels) are deliberately absent, so asking for them fails at
    argument time instead of mid-run.
    """

    ADAMW = "adamw"
    ADAM = "adam"
    SGD = "sgd"
    MOMENTUM = "momentum"
    LAMB = "lamb"
    ADAMAX = "adamax"


class ShardingOption(ExplicitEnum):
    """ZeRO-style sharding stages (values as PaddleNLP spells them on the command line)."""

    SHARD_OP = "stage1"  # optimizer state
    SHARD_GRAD_OP = "stage2"  # optimizer state + gradients
    FULL_SHARD = "stage3"  # optimizer state + gradients + parameters
    OFFLOAD = "offload"  # modifier: keep sharded state in host memory


class EvalPrediction(NamedTuple):
    """What ``compute_metrics`` receives: unpack it (``preds, labels = p``), index it, or use the names."""

    predictions: Union[np.ndarray, Tuple[np.ndarray, ...]]
    label_ids: Optional[Union[np.ndarray, Tuple[np.ndarray, ...]]]


class EvalLoopOutput(NamedTuple):
    """Result of one evaluation/prediction loop before it is split into metrics and predictions."""

    predictions: Optional[Union[np.ndarray, Tuple[np.ndarray, ...]]]
    label_ids: Optional[Union[np.ndarray, Tuple[np.ndarray, ...]]]
    metrics: Optional[Dict[str, float]]
    num_samples: Optional[int]


class PredictionOutput(NamedTuple):
    """Result of ``Trainer.predict``."""

    predictions: Optional[Union[np.ndarray, Tuple[np.ndarray, ...]]]
    label_ids: Optional[Union[np.ndarray, Tuple[np.ndarray, ...]]]
    metrics: Optional[Dict[str, float]]


class TrainOutput(NamedTuple):
    """Result of ``Trainer.train``."""

    global_step: int
    training_loss: float
    metrics: Dict[str, float]


def speed_metrics(
    split: str,
    start_time: float,
    num_samples: Optional[int] = None,
    num_steps: Optional[int] = None,
    num_tokens: Optional[int] = None,
) -> Dict[str, float]:
    """Throughput of a phase that started at ``start_time`` (a ``time.time()`` value) and just ended.

    Returns ``{split}_runtime`` and, for each count given, ``{split}_samples_per_second``,
    ``{split}_steps_per_second``, ``{split}_tokens_per_second`` (global rates, not per device).
    """
    runtime = time.time() - start_time
    result = {f"{split}_runtime": round(runtime, 4)}
    if runtime <= 0:
        return result  # a clock that did not advance gives no meaningful rate
    for name, count in (("samples", num_samples), ("steps", num_steps), ("tokens", num_tokens)):
        if count is not None:
            result[f"{split}_{name}_per_second"] = round(count / runtime, 4)
    return result


def default_logdir() -> str:
    """``runs/<Mon DD_HH-MM-SS>_<hostname>``, the default log directory below ``output_dir``."""
    current_time = datetime.datetime.now().strftime("%b%d_%H-%M-%S")
    return os.path.join("runs", current_time + "_" + socket.gethostname())


def normalize_report_to(report_to: Union[None, str, Iterable[str]]) -> List[str]:
    """PaddleNLP's ``args.report_to`` normalisation: None → ``["visualdl"]`` (its default), a string → a
    one-item list, ``"none"`` → ``[]``; names are kept as given (``metrics.writers.writer_names`` validates them)."""
    if report_to is None:
        return ["visualdl"]
    items = [report_to] if isinstance(report_to, str) else list(report_to)
    return [] if items == ["none"] else items


def has_length(dataset: Any) -> bool:
    """True if ``len(dataset)`` works (map-style datasets); False for iterable/streaming ones."""
    try:
        return len(dataset) is not None
    except (TypeError, ValueError, RuntimeError, NotImplementedError):
        return False


def find_batch_size(tensors: Any) -> Optional[int]:
    """The first dimension of the first tensor/array (with at least one dimension) found depth-first in a
    nested tuple/list/dict; None if there is none. PaddleNLP's helper for custom evaluation loops."""
    if isinstance(tensors, (list, tuple)):
        candidates = tensors
    elif isinstance(tensors, dict) or hasattr(tensors, "items"):  # dict or a tokenizer's BatchEncoding
        candidates = tensors.values()
    else:
        shape = getattr(tensors, "shape", None)
        return int(shape[0]) if shape is not None and len(shape) >= 1 else None
    for value in candidates:
        found = find_batch_size(value)
        if found is not None:
            return found
    return None


def is_main_process(local_rank: int) -> bool:
    """PaddleNLP's test for the main process of a node: ``local_rank`` is -1 (not distributed) or 0."""
    return local_rank in (-1, 0)


def total_processes_number(local_rank: int) -> int:
    """PaddleNLP's count of the processes launched: 1 when ``local_rank`` is -1 (not distributed), else the world
    size the launcher gave this process (``PADDLE_TRAINERS_NUM``, what ``paddle.distributed.get_world_size``
    reads before the parallel environment is initialised)."""
    if local_rank == -1:
        return 1
    return int(os.environ.get("PADDLE_TRAINERS_NUM", "1"))


def log_trainer_start() -> None:
    """Log once per process tree that the main training process started (PaddleNLP's marker line, which job
    watchers grep for); the ``MAIN_PROCESS_STARTED`` variable keeps a restarted or child process from logging it
    again."""
    if "MAIN_PROCESS_STARTED" not in os.environ:
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime())
        logging.getLogger("paddletrainer.trainer").info(
            "The Training Main Process Started Successfully. time: %s, pid: %d", started, os.getpid())
        os.environ["MAIN_PROCESS_STARTED"] = "1"


def should_skip_data(global_step: int, skip_data_intervals: Optional[List[List[int]]]) -> bool:
    """Whether the step after ``global_step`` (steps counted from 1) lies in one of ``skip_data_intervals``, a list
    of ``[first, last]`` step pairs (PaddleNLP's ``skip_data_intervals``); None skips nothing."""
    if skip_data_intervals is None:
        return False
    for interval in skip_data_intervals:
        if len(interval) != 2 or interval[0] > interval[1] or interval[0] <= 0:
            raise ValueError(f"skip_data_intervals: {interval} is not a [first, last] pair of steps with "
                             f"1 <= first <= last")
    return any(first <= global_step + 1 <= last for first, last in skip_data_intervals)


def split_parallel_config(parallel_config: str) -> set:
    """The options of a PaddleNLP ``*_parallel_config`` string, split on commas if it has any, else on spaces."""
    return set(parallel_config.split("," if "," in parallel_config else " "))


def download_recovery_ckpt_from_pdc(recovery_checkpoint_path: str, timeout: int) -> None:
    """Refused: PaddleNLP downloads a checkpoint from PaddleCloud's PDC storage here, a service only its
    long-job environment provides. Raises ``NotImplementedError`` saying what to do instead."""
    raise NotImplementedError(
        f"download_recovery_ckpt_from_pdc({recovery_checkpoint_path!r}): PaddleCloud PDC downloads are not "
        f"supported by paddletrainer; copy the checkpoint to a local path and pass it as resume_from_checkpoint")


# PaddleNLP's names that need paddle: ``name -> (module below paddletrainer, attribute path)``. This module must
# import without paddle (TrainingArguments imports it), so each is imported from its implementation on first use
# (PEP 562); tests/unit/test_import_graph.py reads this table.
_PADDLE_NAMES = {
    "set_seed": ("runtime.seeding", "set_seed"),
    "_get_distributed_seeds": ("runtime.seeding", "_get_distributed_seeds"),
    "set_hyrbid_parallel_seed": ("runtime.seeding", "set_hyrbid_parallel_seed"),
    "get_scheduler": ("optim.schedules", "get_scheduler"),
    "get_constant_schedule": ("optim.schedules", "get_constant_schedule"),
    "get_constant_schedule_with_warmup": ("optim.schedules", "get_constant_schedule_with_warmup"),
    "get_linear_schedule_with_warmup": ("optim.schedules", "get_linear_schedule_with_warmup"),
    "get_cosine_schedule_with_warmup": ("optim.schedules", "get_cosine_schedule_with_warmup"),
    "get_polynomial_decay_schedule_with_warmup": ("optim.schedules", "get_polynomial_decay_schedule_with_warmup"),
    # PaddleNLP's functions of a Trainer (``self``): the Trainer's own methods
    "metrics_format": ("metrics.results", "TrainerResults.metrics_format"),
    "log_metrics": ("metrics.results", "TrainerResults.log_metrics"),
    "save_metrics": ("metrics.results", "TrainerResults.save_metrics"),
    "save_state": ("trainer_checkpoints", "TrainerCheckpoints.save_state"),
    "TrainerMemoryTracker": ("metrics.process_memory", "TrainerMemoryTracker"),
    "IterableDatasetShard": ("data.loader", "IterableDatasetShard"),
    "LastBatchPaddingSampler": ("data.sampling", "LastBatchPaddingSampler"),
    "RemoveColumnsCollator": ("data.collate", "RemoveColumnsCollator"),
}


if TYPE_CHECKING:  # the same names for type checkers and editors' go-to-definition (never executed)
    from .data.collate import RemoveColumnsCollator
    from .data.loader import IterableDatasetShard
    from .data.sampling import LastBatchPaddingSampler
    from .metrics.process_memory import TrainerMemoryTracker
    from .optim.schedules import (get_constant_schedule, get_constant_schedule_with_warmup,
                                  get_cosine_schedule_with_warmup, get_linear_schedule_with_warmup,
                                  get_polynomial_decay_schedule_with_warmup, get_scheduler)
    from .runtime.seeding import _get_distributed_seeds, set_hyrbid_parallel_seed, set_seed
    from .metrics.results import TrainerResults
    from .trainer_checkpoints import TrainerCheckpoints
    metrics_format = TrainerResults.metrics_format
    log_metrics = TrainerResults.log_metrics
    save_metrics = TrainerResults.save_metrics
    save_state = TrainerCheckpoints.save_state

__getattr__, __dir__ = lazy_attributes(globals(), _PADDLE_NAMES)
