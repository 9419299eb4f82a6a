"""The loader: ``paddle.io.DataLoader`` that ends the run with a collator's exception instead of hanging
(``DataLoader``, ``CollateErrorCarrier``), stops its reader when abandoned (``close_batches``), and the split of a
stream over the data ranks (``IterableDatasetShard``)."""
from __future__ import annotations

import math
import threading
from typing import Any, Callable, List, Optional

import numpy as np
import paddle

from .collate import default_data_collator
from ..paddle_contract import loader_reader_state

__all__ = ["IterableDatasetShard", "CollateErrorCarrier", "worker_error_printed_first", "DataLoader",
           "close_batches"]


class IterableDatasetShard(paddle.io.IterableDataset):
    """Splits a stream as :class:`~.sampling.GlobalBatchSampler` splits a dataset: each block of
    ``batch_size × num_processes`` consecutive items is one global micro-batch and process ``r``
    (``process_index``) keeps items ``[r·B, (r+1)·B)`` of it. PaddleNLP's class, with its signature.

    The last, incomplete block: with ``drop_last`` it is dropped (the Trainer's training stream: a stream has no
    epoch start to wrap to); without it (PaddleNLP's default) it is filled up with the pass's first block,
    repeated, so every process yields whole batches. With ``keep_last`` (the Trainer's evaluation; it overrides
    ``drop_last``) each process keeps its own share of it, so every item is evaluated once; a process whose share
    is empty then yields one *padding* item (the pass's first item) as a batch of its own, so that, as with
    :class:`~.sampling.EvalBatchSampler`, every process runs the same number of forward passes (sharding stage 3
    gathers parameters in each one). ``num_real_batches`` — None until the stream has ended, then this pass's
    batch count without a padding one — tells the evaluation loop what to count. ``skip_items`` items are skipped
    first (a resumed run's consumed items); ``num_examples`` counts the items this pass read after them.
    ``set_epoch`` is passed on to the stream; ``seed`` is kept for PaddleNLP's signature (it seeds nothing there
    either).

    Every data rank must iterate the same stream (this class splits it): then every rank's pass ends at the same
    block, and the Trainer's "an epoch without a batch ends training" stop happens at the same step everywhere
    with no collective (``tests/distributed/test_finite_stream_dp2.py``). A dataset that gives each rank its own
    stream of unequal length breaks that contract (not detected: it would take a collective every step): a rank
    left without data stops while the others enter their next step's collectives, which it then never joins
    or joins with another collective (a hang, bounded by ``collective_timeout_seconds``, or an error)."""

    def __init__(self, dataset, batch_size: int = 1, drop_last: bool = False, num_processes: int = 1,
                 process_index: int = 0, seed: int = 0, *, skip_items: int = 0, keep_last: bool = False):
        self.dataset = dataset
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.num_processes = num_processes
        self.process_index = process_index
        self.seed = seed
        self.epoch = 0
        self.num_examples = 0
        self.skip_items = skip_items
        self.keep_last = keep_last
        self.num_real_batches: Optional[int] = None

    def set_epoch(self, epoch: int) -> None:
        """Record ``epoch`` and pass it to the stream's own ``set_epoch`` when it has one."""
        self.epoch = epoch
        if hasattr(self.dataset, "set_epoch"):
            self.dataset.set_epoch(epoch)

    def __iter__(self):
        self.num_real_batches, self.num_examples = None, 0
        span = self.batch_size * self.num_processes
        lo, hi = self.process_index * self.batch_size, (self.process_index + 1) * self.batch_size
        block: List[Any] = []
        first_block: Optional[List[Any]] = None
        full_blocks = 0
        for i, item in enumerate(self.dataset):
            if i < self.skip_items:
                continue
            self.num_examples += 1
            block.append(item)
            if len(block) == span:
                yield from block[lo:hi]
                first_block = block if first_block is None else first_block
                full_blocks += 1
                block = []
        if self.keep_last:
            # Every rank got exactly B items per full block, so what follows starts a batch of its own.
            self.num_real_batches = full_blocks + (1 if block[lo:hi] else 0)
            yield from block[lo:hi]
            if block and not block[lo:hi]:
                yield (first_block or block)[0]
            return
        self.num_real_batches = full_blocks
        if block and not self.drop_last:
            filler = first_block or list(block)
            while len(block) < span:
                block += filler
            self.num_real_batches += 1
            yield from block[lo:hi]

    def __len__(self) -> int:
        """Items each process yields per pass (PaddleNLP's count; the stream must have a length)."""
        blocks = len(self.dataset) / (self.batch_size * self.num_processes)
        return (math.floor(blocks) if self.drop_last else math.ceil(blocks)) * self.batch_size


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
        if self.error is not None:  # the sampler failed (:class:`_SamplerErrorCarrier`): pass the marker on
            return {self.MARKER: np.zeros([1], dtype="int64")}
        try:
            return self.collator(features)
        except Exception as exc:  # re-raised by DataLoader in the training loop's thread
            self.error = exc
            return {self.MARKER: np.zeros([1], dtype="int64")}


class _SamplerErrorCarrier:
    """A batch sampler whose exception (a ``MemoryError`` laying out a huge step, a user sampler's bug) ends the run
    with that exception: Paddle's single-process reader thread asks the sampler for indices outside any ``try``,
    so an exception there ends the thread without waking the training loop, which then waits forever. Here the
    exception is handed to the :class:`CollateErrorCarrier` and one empty batch follows, which the collator turns
    into the marker batch that :class:`DataLoader` re-raises."""

    def __init__(self, batch_sampler, carrier: CollateErrorCarrier):
        self.batch_sampler, self.carrier = batch_sampler, carrier

    def __len__(self) -> int:
        return len(self.batch_sampler)

    def __iter__(self):
        try:
            yield from self.batch_sampler
        except Exception as exc:  # re-raised by DataLoader in the training loop's thread
            self.carrier.error = exc
            yield []


class _DatasetErrorCarrier:
    """A data set whose exception (a user's ``__getitem__`` failing on one bad sample, a stream's generator raising)
    ends the run with that exception: Paddle's single-process reader thread reads samples outside any ``try``, so
    the exception would end the thread without waking the training loop, which then waits forever (and a SIGTERM
    to stop it gracefully waits too). Here the first exception goes to the :class:`CollateErrorCarrier`, the sample
    becomes ``None``, and the collator turns the batch into the marker batch that :class:`DataLoader` re-raises."""

    def __init__(self, dataset, carrier: CollateErrorCarrier):
        self.dataset, self.carrier = dataset, carrier

    def _keep(self, exc: Exception) -> None:
        if self.carrier.error is None:
            self.carrier.error = exc

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index):
        try:
            return self.dataset[index]
        except Exception as exc:  # re-raised by DataLoader in the training loop's thread
            self._keep(exc)
            return None

    def __iter__(self):
        try:
            yield from self.dataset
        except Exception as exc:  # re-raised by DataLoader in the training loop's thread
            self._keep(exc)
            yield None


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
            reader = loader_reader_state(batches)[2]
            if reader is not None:
                reader.join(timeout)
            raise
        yield batch


class DataLoader(paddle.io.DataLoader):
    """``paddle.io.DataLoader`` that re-raises an exception of the sampler, the data set or the collator (carried by
    :class:`CollateErrorCarrier`) in the training loop instead of hanging,
    and with worker processes shows a worker's exception before its own error (:func:`worker_error_printed_first`)."""

    def __init__(self, dataset, collate_fn=None, num_workers: int = 0, **kwargs):
        self.carrier = CollateErrorCarrier(collate_fn or default_data_collator) if num_workers == 0 else None
        super().__init__(dataset, collate_fn=self.carrier or collate_fn, num_workers=num_workers, **kwargs)

    def __iter__(self):
        if self.carrier is None:
            batches = super().__iter__()
        else:  # Paddle's iterator takes the batch sampler and the data set when it is made: it gets guarded ones
            sampler, self.batch_sampler = self.batch_sampler, _SamplerErrorCarrier(self.batch_sampler, self.carrier)
            dataset, self.dataset = self.dataset, _DatasetErrorCarrier(self.dataset, self.carrier)
            try:
                batches = super().__iter__()
            finally:
                self.batch_sampler, self.dataset = sampler, dataset
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
    shut_down, workers, _reader = loader_reader_state(batches)
    if shut_down:
        return
    if workers is None:  # single process: the reader is a thread of this process
        batches._thread_done_event.set()
        if batches._blocking_queue is not None:
            batches._blocking_queue.close()
        if batches._thread is not None and batches._thread is not threading.current_thread():
            batches._thread.join(timeout)
    batches._try_shutdown_all()


