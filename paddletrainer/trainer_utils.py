"""Small types and helpers shared by the trainer, its arguments and its callbacks.

The names mirror ``paddlenlp.trainer.trainer_utils`` so that code written against PaddleNLP keeps working.
This module imports only the standard library and numpy (never paddle: ``TrainingArguments`` imports it, and
importing the arguments must stay cheap); everything else in the package may import it. ``set_seed`` and
``_get_distributed_seeds`` are defined in :mod:`paddletrainer.runtime.seeding` and resolved here on first use.
"""

import datetime
import importlib
import logging
import os
import re
import socket
import time
from enum import Enum
from typing import TYPE_CHECKING, Any, Dict, Iterable, List, NamedTuple, Optional, Tuple, Union

import numpy as np

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

PREFIX_CHECKPOINT_DIR = "checkpoint"
# A checkpoint directory is published atomically: the writer creates this empty file last, so a directory
# without it is a save that crashed or is still being written, and must never be resumed from.
CHECKPOINT_COMPLETE_MARKER = ".checkpoint_complete"
# The index our writer puts beside the marker; ``checkpoint.layout.INDEX_NAME`` is this name.
CHECKPOINT_INDEX_NAME = "checkpoint_index.json"

_CHECKPOINT_DIR_RE = re.compile(r"^" + PREFIX_CHECKPOINT_DIR + r"-(\d+)$")


def checkpoint_dir_name(step: int) -> str:
    """``checkpoint-<step>``: the one spelling of a checkpoint directory's name (``checkpoint.layout`` re-exports
    it and :func:`parse_checkpoint_step`)."""
    return f"{PREFIX_CHECKPOINT_DIR}-{step}"


def parse_checkpoint_step(dir_name: str) -> Optional[int]:
    """Step of a published ``checkpoint-N`` directory name; None for anything else (tmp dirs too)."""
    match = _CHECKPOINT_DIR_RE.match(dir_name)
    return int(match.group(1)) if match else None


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


def sorted_checkpoints(folder: str) -> List[str]:
    """The completed ``checkpoint-N`` directories in ``folder``, oldest (lowest N) first.

    Directories without the :data:`CHECKPOINT_COMPLETE_MARKER` file are skipped: they are interrupted or
    in-flight saves, and resuming from one would load partial state. Temporary ``checkpoint-N.tmp-*``
    directories never match the name pattern.
    """
    if not os.path.isdir(folder):
        return []
    found = []
    for name in os.listdir(folder):
        step = parse_checkpoint_step(name)
        path = os.path.join(folder, name)
        if step is not None and os.path.isfile(os.path.join(path, CHECKPOINT_COMPLETE_MARKER)):
            found.append((step, path))
    return [path for _, path in sorted(found)]


_TMP_INFIX = ".tmp-"  # checkpoint.layout.TMP_INFIX: a save in progress (this module imports no checkpoint code)
# checkpoint.layout's shard names (model_state.tp00_pp00.safetensors, optimizer.tp00_pp00_shard00.safetensors)
_OUR_SHARD = re.compile(r"^(model_state|optimizer)\.tp\d+_pp\d+.*\.safetensors$")
# the index files of PaddleNLP's unified checkpoint (``--unified_checkpoint true``): safetensors, no pickles
PADDLENLP_UNIFIED_INDEXES = ("model.safetensors.index.json", "peft_model.safetensors.index.json",
                             "optimizer.safetensors.index.json", "master_weights.safetensors.index.json")
# the weights of PaddleNLP's non-unified checkpoint: a model's, or a LoRAModel's adapters (``lora_model_state``)
_PADDLENLP_WEIGHTS = re.compile(r"^(lora_)?model_state(\..+)?\.pdparams$")


def _foreign_names(path: str) -> Optional[list]:
    """The file names of ``path`` when it is a directory carrying neither our index nor our marker, else None."""
    if not os.path.isdir(path):
        return None
    names = os.listdir(path)
    return None if "checkpoint_index.json" in names or CHECKPOINT_COMPLETE_MARKER in names else names


def is_paddlenlp_unified_checkpoint(path: str) -> bool:
    """Whether ``path`` is a checkpoint PaddleNLP's Trainer wrote with ``unified_checkpoint``: its
    ``optimizer.safetensors.index.json`` or ``model.safetensors.index.json`` and its ``trainer_state.json``
    (written last), and neither our ``checkpoint_index.json`` nor our completion marker (ours write a
    ``model.safetensors.index.json`` too, for ``from_pretrained``)."""
    names = _foreign_names(path)
    return names is not None and "trainer_state.json" in names and any(n in names for n in PADDLENLP_UNIFIED_INDEXES)


def is_paddlenlp_checkpoint(path: str) -> bool:
    """Whether ``path`` is a checkpoint PaddleNLP's Trainer wrote, in its non-unified format (a
    ``model_state*.pdparams``, or a LoRAModel's ``lora_model_state*.pdparams``) or its unified one (:func:`is_paddlenlp_unified_checkpoint`), with its
    ``trainer_state.json`` (written after the weights), and neither our ``checkpoint_index.json`` nor our
    completion marker. A directory carrying our marker is always read as ours (whose loader refuses pickles), so
    planting ``.pdparams`` files in one of our checkpoints never routes it to the pickle-reading interop loader."""
    names = _foreign_names(path)
    return names is not None and "trainer_state.json" in names and (
        any(_PADDLENLP_WEIGHTS.match(n) for n in names) or any(n in names for n in PADDLENLP_UNIFIED_INDEXES))


def _not_a_checkpoint(value: str, resume: str) -> str:
    """Why the directory ``resume`` named by ``resume_from_checkpoint`` cannot be resumed (it has no marker)."""
    names = sorted(os.listdir(resume))
    paddlenlp = [n for n in names if n in PADDLENLP_UNIFIED_INDEXES or _PADDLENLP_WEIGHTS.match(n)]
    if paddlenlp:  # PaddleNLP writes trainer_state.json after the weights and optimizer
        return (f"resume_from_checkpoint={value!r} is a PaddleNLP checkpoint whose save did not finish (it has "
                f"{paddlenlp[0]} but no trainer_state.json, which PaddleNLP writes last)")
    ours = [n for n in names if n == "checkpoint_index.json" or _OUR_SHARD.match(n)]
    if ours or not names or _TMP_INFIX in os.path.basename(os.path.normpath(resume)):  # empty: a save just begun
        found = sorted_checkpoints(os.path.dirname(os.path.abspath(resume)))
        return (f"resume_from_checkpoint={value!r} is incomplete (no completion marker: its save did not finish); "
                f"complete checkpoints beside it: {[os.path.basename(c) for c in found] or 'none'}")
    shown = names[:8] + (["..."] if len(names) > 8 else [])
    return (f"resume_from_checkpoint={value!r} is not a paddletrainer checkpoint (found: {shown}); "
            f"valid: a checkpoint-N directory paddletrainer wrote (with {CHECKPOINT_COMPLETE_MARKER}), or one "
            f"PaddleNLP's Trainer wrote ([lora_]model_state*.pdparams or unified *.safetensors.index.json, with "
            f"trainer_state.json)")


def is_our_checkpoint(path: str) -> bool:
    """Whether ``path`` is a checkpoint paddletrainer published: a real directory (not a symlink) holding both our
    completion marker and our ``checkpoint_index.json``. Only these are ever replaced or rotated away; anything
    else named ``checkpoint-*`` (a PaddleNLP checkpoint, a user's directory or file) is never deleted or renamed."""
    return (os.path.isdir(path) and not os.path.islink(path)
            and os.path.isfile(os.path.join(path, CHECKPOINT_COMPLETE_MARKER))
            and os.path.isfile(os.path.join(path, CHECKPOINT_INDEX_NAME)))


def is_empty_dir(path: str) -> bool:
    """A real (not symlinked) directory with nothing in it."""
    if os.path.islink(path) or not os.path.isdir(path):
        return False
    with os.scandir(path) as entries:
        return next(entries, None) is None


def foreign_checkpoint_entries(folder: str) -> List[Tuple[int, str]]:
    """``(step, name)`` of the entries of ``folder`` named ``checkpoint-<step>`` that are not checkpoints of ours
    (:func:`is_our_checkpoint`) and hold something (an empty directory holds nothing to lose: a save of its step
    takes its place): a save of that step would collide with them. Sorted by step."""
    if not folder or not os.path.isdir(folder):
        return []
    found = [(parse_checkpoint_step(name), os.path.join(folder, name)) for name in os.listdir(folder)]
    return sorted((step, os.path.basename(path)) for step, path in found
                  if step is not None and not is_our_checkpoint(path) and not is_empty_dir(path))


def get_last_checkpoint(folder: str) -> Optional[str]:
    """The newest checkpoint in ``folder``, or None: the ``checkpoint-N`` of ours with the highest N that is
    complete (has its completion marker); only when ``folder`` holds none of ours, the newest PaddleNLP-written one
    (:func:`is_paddlenlp_checkpoint`), as PaddleNLP's own ``get_last_checkpoint`` would find it.

    Ours always win so that a PaddleNLP directory (whose loading unpickles files) is never preferred to a
    checkpoint of ours, whatever its step number. A script passing a PaddleNLP path found here as
    ``resume_from_checkpoint`` names it (it is read, with the allowlist unpickler); ``true`` does not resume one."""
    ours = sorted_checkpoints(folder)
    if ours:
        return ours[-1]
    names = os.listdir(folder) if os.path.isdir(folder) else []
    theirs = [(step, os.path.join(folder, name)) for name in names
              for step in [parse_checkpoint_step(name)] if step is not None]
    theirs = [(step, path) for step, path in theirs if is_paddlenlp_checkpoint(path)]
    return max(theirs)[1] if theirs else None


def requested_resume(value: Any) -> Union[None, bool, str]:
    """Normalise a ``resume_from_checkpoint`` value: None (no resume), True (the newest checkpoint) or a path.

    Config files and command lines carry booleans as strings, so "True"/"true" and "False"/"false"/"" count too.
    """
    if value in (None, False, "", "False", "false"):
        return None
    if value is True or value in ("True", "true"):
        return True
    return str(value)


RESUME_AUTO = "auto"


def resolve_resume_checkpoint(value: Any, output_dir: Optional[str]) -> Optional[str]:
    """The checkpoint directory a ``resume_from_checkpoint`` value asks for, or None (start fresh).

    * None / False / "false" / "": no resume;
    * True / "true": the newest checkpoint of ours in ``output_dir`` (``get_last_checkpoint``); none is an error,
      and so is a PaddleNLP checkpoint found there (reading one unpickles its files: only a path the user names
      is read);
    * ``"auto"``: the newest complete checkpoint *of ours* in ``output_dir`` if there is one, else start fresh —
      what a job restarted by ``python -m paddletrainer.launch --max_restart`` needs to pick up where its previous
      attempt stopped (half-written ``checkpoint-N.tmp-*`` dirs never count). A PaddleNLP checkpoint is never
      picked here. (The Trainer goes further back past a damaged one: ``TrainerCheckpoints._resolve_resume``);
    * a path: must exist and be a complete checkpoint (its save finished), or a PaddleNLP checkpoint.

    Raises ``ValueError`` naming ``resume_from_checkpoint``, so a bad value is a usage error before training.
    """
    resume = requested_resume(value)
    if resume is None:
        return None
    if resume == RESUME_AUTO:
        ours = sorted_checkpoints(output_dir) if output_dir else []
        return ours[-1] if ours else None
    if resume is True:
        path = get_last_checkpoint(output_dir) if output_dir else None
        if path is None:
            # PaddleNLP's sentence first: scripts and tests match on it
            raise ValueError(f"No valid checkpoint found in output directory ({output_dir}): "
                             f"resume_from_checkpoint=True but it holds no complete checkpoint; use "
                             f"resume_from_checkpoint=auto to start fresh when there is none")
        if is_paddlenlp_checkpoint(path):  # its files are pickles: read only from a path the user names
            raise ValueError(f"resume_from_checkpoint=True: output_dir={output_dir!r} holds no complete checkpoint of "
                             f"paddletrainer, only PaddleNLP's {os.path.basename(path)}, whose files are pickles and "
                             f"are read only from a path you name: pass --resume_from_checkpoint {path}")
        return path
    if not os.path.isdir(resume):
        raise ValueError(f"Can't find a valid checkpoint at {resume}: resume_from_checkpoint={resume!r} does not "
                         f"exist; give a checkpoint-N directory, true (the newest in output_dir) or auto (the newest "
                         f"if any)")
    if not os.path.isfile(os.path.join(resume, CHECKPOINT_COMPLETE_MARKER)) and not is_paddlenlp_checkpoint(resume):
        raise ValueError(_not_a_checkpoint(value, resume))
    return resume


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


def __getattr__(name):
    if name in _PADDLE_NAMES:
        module, path = _PADDLE_NAMES[name]
        obj = importlib.import_module(f"{__package__}.{module}")
        for attr in path.split("."):
            obj = getattr(obj, attr)
        return obj
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_PADDLE_NAMES))
