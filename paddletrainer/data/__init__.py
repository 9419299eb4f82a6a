"""Data order, splitting over data ranks, and collation.

The rule that makes every parallel layout train on the same data:

    the sequence of global batches depends only on the seed, the epoch and the global batch size.

One optimizer step consumes ``G = B × A × W`` samples (B = per-device batch, A = gradient accumulation
steps, W = data world size = dp × sharding). Within the step, micro-step ``m`` covers the ``B × W`` samples
``[m·B·W, (m+1)·B·W)`` and data rank ``r`` takes ``[r·B, (r+1)·B)`` of them. One process with B=8 and
dp2 × B=4 therefore see the same 8 samples at every step, and so does B=4 × A=2 on one process.

PaddleNLP's Trainer uses a plain shuffled sampler with one process and a ``DistributedBatchSampler`` with
several, so its data order — and its loss curve — changes with the layout.

Position is kept in samples (``consumed_samples``), so a resume skips in O(1) and still lands on the same
sample when the layout (and even the global batch size) changed.
"""
from __future__ import annotations

import inspect
import logging
import threading
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence

import numpy as np
import paddle
from paddle.distributed.fleet.meta_parallel import PipelineLayer

from ..parallel.collectives import all_gather_object_over_data_group
from ..trainer_utils import has_length

logger = logging.getLogger(__name__)


# --------------------------------------------------------------------------------------- ordering
def epoch_permutation(num_samples: int, seed: int, epoch: int, shuffle: bool) -> np.ndarray:
    """The global order of one epoch: a permutation seeded by (seed, epoch), identical on every rank."""
    if not shuffle:
        return np.arange(num_samples)
    return np.random.RandomState((seed + epoch) % (2**32)).permutation(num_samples)


def padded_epoch_order(num_samples: int, batch_span: int, seed: int, epoch: int, shuffle: bool, drop_last: bool) -> np.ndarray:
    """The epoch's order cut to a whole number of ``batch_span``-sized blocks.

    With ``drop_last`` the incomplete tail is dropped; otherwise it is filled by wrapping around to the
    epoch's first samples, so every rank gets a full micro-batch (an empty rank would hang the collectives)
    and the filled batch is the same whatever the layout.
    """
    order = epoch_permutation(num_samples, seed, epoch, shuffle)
    full, rest = divmod(num_samples, batch_span)
    if rest == 0:
        return order
    if drop_last:
        return order[: full * batch_span]
    pad = batch_span - rest
    return np.concatenate([order, np.resize(order, pad)])


class _RankBatchSampler(paddle.io.BatchSampler):
    """What every sampler here shares: a non-empty dataset of ``num_samples``, the per-device ``batch_size`` and
    this rank's place ``data_rank`` among ``data_world_size`` data ranks."""

    def __init__(self, num_samples: int, batch_size: int, data_rank: int = 0, data_world_size: int = 1):
        if num_samples <= 0:
            raise ValueError("the dataset is empty: a sampler needs at least one sample")
        self.num_samples = num_samples
        self.batch_size = batch_size
        self.data_rank = data_rank
        self.data_world_size = data_world_size


class GlobalBatchSampler(_RankBatchSampler):
    """Yields this data rank's indices for each micro-batch, in the layout-free global order.

    Args:
        num_samples: dataset length.
        batch_size: per-device micro-batch size B.
        data_rank: this rank's position r among the W data ranks.
        data_world_size: W = dp × sharding, the number of data ranks.
        seed: the epoch order's seed (see ``padded_epoch_order``).
        shuffle: a seeded permutation per epoch (else dataset order).
        drop_last: drop the epoch's incomplete tail (else it is filled by wrapping around to its first samples).
        step_span: samples one optimizer step consumes (B × A × W); epochs are padded or cut to a multiple
            of it, so every optimizer step has all its A micro-batches.
    """

    def __init__(
        self,
        num_samples: int,
        batch_size: int,
        data_rank: int = 0,
        data_world_size: int = 1,
        seed: int = 0,
        shuffle: bool = True,
        drop_last: bool = False,
        step_span: Optional[int] = None,
    ):
        super().__init__(num_samples, batch_size, data_rank, data_world_size)
        self.seed = seed
        self.shuffle = shuffle
        self.drop_last = drop_last
        self.micro_span = batch_size * data_world_size
        self.step_span = step_span or self.micro_span
        if self.step_span % self.micro_span:
            raise ValueError(f"step_span={self.step_span} must be a multiple of batch_size×data_world_size={self.micro_span}")
        self.epoch = 0
        self.skip_samples = 0  # samples of the current epoch already consumed (resume)

    def set_epoch(self, epoch: int, consumed_in_epoch: int = 0) -> None:
        """Select the epoch, and where in it to start (in samples; rounded down to a micro-batch)."""
        self.epoch = epoch
        self.skip_samples = consumed_in_epoch - consumed_in_epoch % self.micro_span

    def samples_per_epoch(self) -> int:
        """Samples one epoch consumes after padding/cutting to whole optimizer steps."""
        full, rest = divmod(self.num_samples, self.step_span)
        return (full + (1 if rest and not self.drop_last else 0)) * self.step_span

    def __len__(self) -> int:
        return (self.samples_per_epoch() - self.skip_samples) // self.micro_span

    def __iter__(self) -> Iterator[List[int]]:
        order = padded_epoch_order(self.num_samples, self.step_span, self.seed, self.epoch, self.shuffle, self.drop_last)
        lo = self.data_rank * self.batch_size
        for start in range(self.skip_samples, len(order), self.micro_span):
            yield order[start + lo : start + lo + self.batch_size].tolist()


class EvalBatchSampler(_RankBatchSampler):
    """Sequential evaluation/prediction batches: every sample exactly once, in dataset order after gathering.

    Block k holds samples ``[k·B·W, (k+1)·B·W)`` and data rank r takes ``[r·B, (r+1)·B)`` of it, so the last
    block may give a rank a short batch or nothing. Every rank must run the same number of forward passes
    (sharding stage 3 gathers parameters in each one), so a rank with nothing left gets one *padding* batch
    (the dataset's first sample); it is always the rank's last batch and ``num_real_batches`` excludes it,
    so its outputs are never counted.
    """

    def __init__(self, num_samples: int, batch_size: int, data_rank: int = 0, data_world_size: int = 1):
        super().__init__(num_samples, batch_size, data_rank, data_world_size)
        self._span = batch_size * data_world_size
        blocks = -(-num_samples // self._span)
        last_start = (blocks - 1) * self._span + data_rank * batch_size
        self._num_blocks = blocks
        self.num_real_batches = blocks if last_start < num_samples else blocks - 1

    def __len__(self) -> int:
        return self._num_blocks

    def __iter__(self) -> Iterator[List[int]]:
        for k in range(self._num_blocks):
            lo = k * self._span + self.data_rank * self.batch_size
            yield list(range(lo, min(lo + self.batch_size, self.num_samples))) if k < self.num_real_batches else [0]


class IterableDatasetShard(paddle.io.IterableDataset):
    """Splits a stream the same way: each block of B × W consecutive items is one global micro-batch and data
    rank r keeps items ``[r·B, (r+1)·B)`` of it. For training an incomplete final block is dropped (a stream
    has no epoch start to wrap to). With ``keep_last`` (evaluation) each rank keeps its share of it, so every
    item is evaluated once; a rank whose share is empty then yields one *padding* item (the pass's first item)
    as a batch of its own, so that, as with :class:`EvalBatchSampler`, every rank runs the same number of
    forward passes (sharding stage 3 gathers parameters in each one). ``num_real_batches`` — None until the
    stream has ended, then this pass's batch count without the padding one — tells the evaluation loop what
    to count. The number of items already consumed is skipped on resume.

    Every data rank must iterate the same stream (this class splits it): then every rank's pass ends at the same
    block, and the Trainer's "an epoch without a batch ends training" stop happens at the same step everywhere
    with no collective (``tests/distributed/test_finite_stream_dp2.py``). A dataset that gives each rank its own
    stream of unequal length breaks that contract (not detected: it would take a collective every step): a rank
    left without data stops while the others enter their next step's collectives, which it then never joins
    or joins with another collective (a hang, bounded by ``collective_timeout_seconds``, or an error)."""

    def __init__(self, dataset, batch_size: int, data_rank: int = 0, data_world_size: int = 1, skip_items: int = 0,
                 keep_last: bool = False):
        self.dataset = dataset
        self.batch_size = batch_size
        self.data_rank = data_rank
        self.data_world_size = data_world_size
        self.skip_items = skip_items
        self.keep_last = keep_last
        self.num_real_batches: Optional[int] = None

    def __iter__(self):
        self.num_real_batches = None
        span = self.batch_size * self.data_world_size
        lo, hi = self.data_rank * self.batch_size, (self.data_rank + 1) * self.batch_size
        block: List[Any] = []
        first, full_blocks = None, 0
        for i, item in enumerate(self.dataset):
            if i < self.skip_items:
                continue
            if first is None:
                first = item
            block.append(item)
            if len(block) == span:
                yield from block[lo:hi]
                full_blocks += 1
                block = []
        if not self.keep_last:
            self.num_real_batches = full_blocks
            return
        # Every rank got exactly B items per full block, so what follows starts a batch of its own.
        self.num_real_batches = full_blocks + (1 if block[lo:hi] else 0)
        yield from block[lo:hi]
        if block and not block[lo:hi]:
            yield first


# --------------------------------------------------------------------------------------- collation
def _stack(values: Sequence[Any]) -> np.ndarray:
    first = values[0]
    if isinstance(first, paddle.Tensor):
        return np.stack([v.numpy() for v in values])
    return np.stack([np.asarray(v) for v in values])


def default_data_collator(features: List[Dict[str, Any]]) -> Dict[str, np.ndarray]:
    """Stacks equal-shaped fields of a list of dict samples into numpy arrays.

    ``label``/``label_ids`` are renamed to ``labels`` (the name models take), as in PaddleNLP/HF. Non-numeric
    fields (strings) are left out.
    """
    if not isinstance(features[0], dict):
        raise TypeError(f"default_data_collator expects dict samples, got {type(features[0]).__name__}")
    batch: Dict[str, np.ndarray] = {}
    for key in features[0]:
        values = [f[key] for f in features]
        if values[0] is None or isinstance(values[0], str):
            continue
        name = "labels" if key in ("label", "label_ids") else key
        batch[name] = _stack(values)
    if "labels" in batch and batch["labels"].dtype.kind in "iub":
        batch["labels"] = batch["labels"].astype("int64")  # class ids; float labels (regression) stay float
    return batch


@dataclass
class DataCollatorWithPadding:
    """Pads ``input_ids``/``token_type_ids``/``attention_mask``-style fields to the longest sample of the batch
    (or ``max_length``, or a multiple of ``pad_to_multiple_of``), then stacks like ``default_data_collator``.

    Uses ``tokenizer.pad_token_id`` (0 when absent) for ids and 0 for masks and type ids; labels that are
    sequences are padded with -100 so losses ignore them.
    """

    tokenizer: Any = None
    padding: Any = True
    max_length: Optional[int] = None
    pad_to_multiple_of: Optional[int] = None
    return_tensors: str = "np"
    label_pad_token_id: int = -100

    def _pad_value(self, key: str) -> int:
        if key in ("labels", "label", "label_ids"):
            return self.label_pad_token_id
        if key == "input_ids":
            pad = getattr(self.tokenizer, "pad_token_id", None)
            return 0 if pad is None else int(pad)
        return 0

    def __call__(self, features: List[Dict[str, Any]]) -> Dict[str, np.ndarray]:
        seq_keys = [k for k, v in features[0].items() if isinstance(v, (list, tuple, np.ndarray)) and np.ndim(v) == 1]
        if seq_keys and self.padding:
            longest = max(len(f[k]) for f in features for k in seq_keys)
            target = self.max_length if self.padding == "max_length" and self.max_length else longest
            if self.pad_to_multiple_of:
                target = -(-target // self.pad_to_multiple_of) * self.pad_to_multiple_of
            padded = []
            for f in features:
                g = dict(f)
                for k in seq_keys:
                    v = list(f[k])[:target]
                    g[k] = v + [self._pad_value(k)] * (target - len(v))
                padded.append(g)
            features = padded
        return default_data_collator(features)


def forward_parameters(model: paddle.nn.Layer) -> Optional[List[str]]:
    """The named parameters of the model's ``forward`` in order, or None when the batch keys it accepts are
    unknown (``**kwargs``, or a ``PipelineLayer``, whose ``forward(input, chunk_id)`` is not the batch's
    signature) — then nothing is removed and nothing is checked."""
    if isinstance(model, PipelineLayer):
        return None
    params = inspect.signature(model.forward).parameters.values()
    if any(p.kind == p.VAR_KEYWORD for p in params):
        return None
    return [p.name for p in params if p.kind != p.VAR_POSITIONAL]


def forward_argument_names(model: paddle.nn.Layer) -> Optional[set]:
    """:func:`forward_parameters` as a set."""
    names = forward_parameters(model)
    return None if names is None else set(names)


class ColumnFilter:
    """Wraps a collator so the *batch* only keeps keys the model's forward accepts (``remove_unused_columns``).

    The collator itself sees the dataset's samples untouched (PaddleNLP's contract: a collator may read raw
    fields such as ``text`` that the model never takes); what it returns is filtered. Label keys are kept even
    if the forward does not take them: a criterion needs them.
    """

    def __init__(self, collator: Callable, allowed: set, keep: Sequence[str]):
        self.collator = collator
        self.allowed = set(allowed) | set(keep) | {"label", "label_ids"}

    def __call__(self, features):
        batch = self.collator(features)
        if isinstance(batch, dict):
            return {k: v for k, v in batch.items() if k in self.allowed}
        return batch


def remove_unused_columns(dataset, allowed: Optional[set], keep: Sequence[str], description: str = "training"):
    """PaddleNLP's column removal: a Hugging Face ``datasets.Dataset`` loses the columns the model's forward
    does not take (labels kept); any other dataset is returned as is (its samples reach the collator whole)."""
    if allowed is None or type(dataset).__module__.split(".")[0] != "datasets" or not hasattr(dataset, "column_names"):
        return dataset
    wanted = set(allowed) | set(keep) | {"label", "label_ids"}
    unused = [c for c in dataset.column_names if c not in wanted]
    if not unused:
        return dataset
    logger.info("The following columns in the %s set don't have a corresponding argument in "
                                     "the model's forward and have been ignored: %s", description, ", ".join(unused))
    return dataset.remove_columns(unused)


class SubclassBatchSampler(GlobalBatchSampler):
    """Runs a batch sampler returned by a Trainer subclass's ``_get_train_sampler`` (PaddleNLP's hook) in the
    training loop, which counts whole optimizer steps and resumes by sample position.

    The subclass's sampler decides the order (e.g. ``run_pretrain.py``'s unshuffled ``DistributedBatchSampler``);
    this wrapper only cuts each epoch to whole steps of ``gradient_accumulation_steps`` micro-batches, calls the
    inner ``set_epoch(epoch)`` when it has one, and on resume skips the micro-batches already consumed.
    """

    def __init__(self, inner, batch_size: int, data_world_size: int, step_span: int):
        if not has_length(inner):
            raise ValueError(f"_get_train_sampler returned {type(inner).__name__}, which has no len(); a batch "
                             "sampler must know its number of batches")
        self.inner = inner
        self.batch_size = batch_size
        self.data_rank, self.data_world_size = 0, data_world_size
        self.seed, self.shuffle, self.drop_last = 0, False, True
        self.micro_span = batch_size * data_world_size
        self.step_span = step_span
        self.num_samples = len(inner) * self.micro_span
        self.epoch = 0
        self.skip_samples = 0

    def samples_per_epoch(self) -> int:
        return (self.num_samples // self.step_span) * self.step_span

    def set_epoch(self, epoch: int, consumed_in_epoch: int = 0) -> None:
        super().set_epoch(epoch, consumed_in_epoch)
        if hasattr(self.inner, "set_epoch"):
            self.inner.set_epoch(epoch)

    def __iter__(self) -> Iterator[List[int]]:
        skip = self.skip_samples // self.micro_span
        stop = self.samples_per_epoch() // self.micro_span
        for i, batch in enumerate(self.inner):
            if i >= stop:
                return
            if i >= skip:
                yield batch


class CollateErrorCarrier:
    """Wraps a collator so that an exception raised inside it ends the run with that exception.

    Paddle's single-process ``DataLoader`` (``num_workers=0``) calls the collator in a reader thread; an
    exception there kills the thread without waking the reader, and the training loop then waits forever
    (Paddle 3.3.1, ``_DataLoaderIterSingleProcess._thread_loop``). This wrapper catches the exception, hands a
    one-key marker batch through the queue instead, and :class:`DataLoader` re-raises the exception in the
    caller's thread when that batch arrives. (Worker processes, ``num_workers > 0``, already send exceptions
    back; there the collator is used as is.)
    """

    MARKER = "__paddletrainer_collate_error__"

    def __init__(self, collator: Callable):
        self.collator = collator
        self.error: Optional[BaseException] = None

    def __call__(self, features):
        try:
            return self.collator(features)
        except Exception as exc:  # re-raised by DataLoader in the training loop's thread
            self.error = exc
            return {self.MARKER: np.zeros([1], dtype="int64")}


def worker_error_printed_first(batches, timeout: float = 10.0):
    """Iterate Paddle's multi-process loader iterator ``batches``; when it fails, first wait for its reader thread.

    With ``num_workers > 0`` a worker's exception (a collator's ``KeyError``, ...) is re-raised in Paddle's
    reader thread, which kills the batch queue first: the caller's ``next`` then fails with Paddle's
    ``SystemError: Blocking queue is killed ...`` while the reader thread is still printing the worker's
    exception. If the caller's error ends the process before that, the worker's exception is never shown
    (seen under load). Joining the reader thread (``_thread`` of Paddle 3.3.1's iterator) before re-raising
    puts the worker's traceback on stderr first, every time.
    """
    while True:
        try:
            batch = next(batches)
        except StopIteration:
            return
        except SystemError:
            reader = getattr(batches, "_thread", None)
            if reader is not None:
                reader.join(timeout)
            raise
        yield batch


class DataLoader(paddle.io.DataLoader):
    """``paddle.io.DataLoader`` that re-raises a :class:`CollateErrorCarrier`'s exception instead of hanging,
    and with worker processes shows a worker's exception before its own error (:func:`worker_error_printed_first`)."""

    def __init__(self, dataset, collate_fn=None, num_workers: int = 0, **kwargs):
        self.carrier = CollateErrorCarrier(collate_fn or default_data_collator) if num_workers == 0 else None
        super().__init__(dataset, collate_fn=self.carrier or collate_fn, num_workers=num_workers, **kwargs)

    def __iter__(self):
        batches = super().__iter__()
        if self.carrier is None:
            return _closing(worker_error_printed_first(batches), batches)
        return _closing(self._checked(batches), batches)

    def _checked(self, batches):
        for batch in batches:
            if isinstance(batch, dict) and CollateErrorCarrier.MARKER in batch:
                error, self.carrier.error = self.carrier.error, None
                raise error
            yield batch


def _closing(batches, loader_iterator):
    """``batches``, and Paddle's ``loader_iterator`` shut down (:func:`close_batches`) when the generator is
    closed or exhausted."""
    try:
        yield from batches
    finally:
        close_batches(loader_iterator)


def close_batches(batches, timeout: float = 30.0) -> None:
    """Stop the reader of a DataLoader iterator that will not be read to its end (ours or Paddle's).

    Paddle 3.3.1's iterator stops its reader thread (and worker processes) only at its end or in ``__del__``;
    abandoned with a full prefetch queue, its thread stays blocked in ``push``. Closing the queue releases the
    push. Paddle's own ``_try_shutdown_all`` then polls the single-process reader once a second, so the reader
    is told to stop and joined here first (milliseconds). Idempotent: an exhausted iterator is left as it is."""
    close = getattr(batches, "close", None)  # our generator: its ``finally`` comes back here with Paddle's iterator
    if close is not None:
        close()
        return
    if getattr(batches, "_shutdown", True):
        return
    if getattr(batches, "_workers", None) is None:  # single process: the reader is a thread of this process
        batches._thread_done_event.set()
        if batches._blocking_queue is not None:
            batches._blocking_queue.close()
        if batches._thread is not None and batches._thread is not threading.current_thread():
            batches._thread.join(timeout)
    batches._try_shutdown_all()


# --------------------------------------------------------------------------------------- gathering
def _concat_padded(arrays: List[np.ndarray], pad_value=-100) -> np.ndarray:
    """Concatenate along axis 0, padding later axes to the largest size (variable sequence lengths)."""
    if all(a.shape[1:] == arrays[0].shape[1:] for a in arrays):
        return np.concatenate(arrays, axis=0)
    target = np.max([a.shape for a in arrays], axis=0)
    padded = []
    for a in arrays:
        widths = [(0, 0)] + [(0, int(t - s)) for s, t in zip(a.shape[1:], target[1:])]
        padded.append(np.pad(a, widths, constant_values=pad_value))
    return np.concatenate(padded, axis=0)


def interleave_rank_batches(per_rank: List[List[Any]], num_samples: Optional[int] = None) -> Any:
    """Undo the eval split: batch k of rank 0, batch k of rank 1, ... is the dataset's order (see module doc).

    ``per_rank[r]`` is rank r's list of per-batch arrays (or tuples of arrays); ``num_samples`` (optional)
    trims the result.
    """
    ordered = [batches[k] for k in range(max(len(b) for b in per_rank)) for batches in per_rank if k < len(batches)]
    if isinstance(ordered[0], (tuple, list)):
        return type(ordered[0])(
            _concat_padded([b[i] for b in ordered])[:num_samples] for i in range(len(ordered[0]))
        )
    return _concat_padded(ordered)[:num_samples]


def gather_in_dataset_order(batches: List[Any], topology, num_samples: Optional[int] = None) -> Any:
    """All data ranks' eval outputs, concatenated in dataset order (every rank gets the result)."""
    if topology.data_world_size == 1:
        return interleave_rank_batches([batches], num_samples)
    return interleave_rank_batches(all_gather_object_over_data_group(batches, topology), num_samples)


def sum_over_data_ranks(values: List[float], topology) -> List[float]:
    """Element-wise sum of small host-side counters (eval loss sums, sample counts) over data ranks."""
    if topology.data_world_size == 1:
        return list(values)
    return [sum(col) for col in zip(*all_gather_object_over_data_group(list(values), topology))]


def resume_position(consumed: int, restart_epoch: bool, steps_per_epoch: Optional[int], global_batch: int) -> int:
    """Samples of the global order to skip when training (re)starts: all ``consumed`` ones; with
    ``restart_epoch`` (``ignore_data_skip`` on resume) only the finished epochs — PaddleNLP's rule: the current
    epoch restarts at its beginning, a stream (no ``steps_per_epoch``) from its start."""
    if not restart_epoch:
        return consumed
    if not steps_per_epoch:
        return 0
    return consumed - consumed % (steps_per_epoch * global_batch)
