"""The loader: ``paddle.io.DataLoader`` that ends the run with a collator's exception instead of hanging
(``DataLoader``, ``CollateErrorCarrier``), stops its reader when abandoned (``close_batches``), and the split of a
stream over the data ranks (``IterableDatasetShard``)."""
from __future__ import annotations

import threading
from typing import Any, Callable, List, Optional

import numpy as np
import paddle

from .collate import default_data_collator

__all__ = ["IterableDatasetShard", "CollateErrorCarrier", "worker_error_printed_first", "DataLoader",
           "close_batches"]


class IterableDatasetShard(paddle.io.IterableDataset):
    """Splits a stream as :class:`~.sampling.GlobalBatchSampler` splits a dataset: each block of B × W consecutive items is one global micro-batch and data
    rank r keeps items ``[r·B, (r+1)·B)`` of it. For training an incomplete final block is dropped (a stream
    has no epoch start to wrap to). With ``keep_last`` (evaluation) each rank keeps its share of it, so every
    item is evaluated once; a rank whose share is empty then yields one *padding* item (the pass's first item)
    as a batch of its own, so that, as with :class:`~.sampling.EvalBatchSampler`, every rank runs the same number of
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


