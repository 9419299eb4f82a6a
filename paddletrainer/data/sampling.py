"""Data order and its split over data ranks: the training order, evaluation batches, a user's sampler cut to whole
steps, and where a resumed run starts.

The rule that makes every parallel layout train on the same data:

    the sequence of global batches depends only on the seed, the epoch and the global batch size.

One optimizer step consumes ``G = B × A × W`` samples (B = per-device batch, A = gradient accumulation
steps, W = data world size = dp × sharding). Within the step, micro-step ``m`` covers the ``B × W`` samples
``[m·B·W, (m+1)·B·W)`` and data rank ``r`` takes ``[r·B, (r+1)·B)`` of them. One process with B=8 and
dp2 × B=4 therefore see the same 8 samples at every step, and so does B=4 × A=2 on one process.

PaddleNLP's Trainer uses a plain shuffled sampler with one process and a ``DistributedBatchSampler`` with
several, so its data order — and its loss curve — changes with the layout.

Position is kept in samples (``consumed_samples``), so a resume skips in O(1) and still lands on the same
sample when the layout (and even the global batch size) changed. Evaluation batches (``EvalBatchSampler``) are
sequential, so gathering puts them back in dataset order (:mod:`.gather`); a stream is split the same way by
:class:`~.loader.IterableDatasetShard`.
"""
from __future__ import annotations

from typing import Iterator, List, Optional

import numpy as np
import paddle

from ..trainer_utils import has_length

__all__ = ["epoch_permutation", "padded_epoch_order", "GlobalBatchSampler", "EvalBatchSampler",
           "WholeStepBatchSampler", "resume_position", "LastBatchPaddingSampler"]


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


class WholeStepBatchSampler(GlobalBatchSampler):
    """A user's batch sampler cut to whole optimizer steps, so the training loop (which counts steps and resumes
    by sample position) can run it: the sampler a Trainer subclass's ``_get_train_sampler`` returns (PaddleNLP's
    hook).

    The user's sampler decides the order (e.g. ``run_pretrain.py``'s unshuffled ``DistributedBatchSampler``);
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


def resume_position(consumed: int, restart_epoch: bool, steps_per_epoch: Optional[int], global_batch: int) -> int:
    """Samples of the global order to skip when training (re)starts: all ``consumed`` ones; with
    ``restart_epoch`` (``ignore_data_skip`` on resume) only the finished epochs — PaddleNLP's rule: the current
    epoch restarts at its beginning, a stream (no ``steps_per_epoch``) from its start."""
    if not restart_epoch:
        return consumed
    if not steps_per_epoch:
        return 0
    return consumed - consumed % (steps_per_epoch * global_batch)


class LastBatchPaddingSampler(paddle.io.DistributedBatchSampler):
    """PaddleNLP's evaluation sampler: a ``DistributedBatchSampler`` whose order is filled up to whole global
    batches (``batch_size × nranks``) with the dataset's first global batch, repeated, so every rank yields only
    full batches; with ``shuffle`` the filled order is shuffled by the epoch (which then advances by one). Rank
    ``r`` takes items ``[r·B, (r+1)·B)`` of each global batch."""

    def __iter__(self) -> Iterator[List[int]]:
        span = self.batch_size * self.nranks
        order = list(range(len(self.dataset)))
        rest = len(order) % span
        if rest:
            order += np.resize(order[:span], span - rest).tolist()
        self.total_size = len(order)
        if self.shuffle:
            np.random.RandomState(self.epoch).shuffle(order)
            self.epoch += 1
        mine = np.asarray(order).reshape(-1, span)[:, self.local_rank * self.batch_size:
                                                   (self.local_rank + 1) * self.batch_size].ravel().tolist()
        local = self.batch_size * self._acc_steps
        if len(mine) % local:
            raise ValueError(f"LastBatchPaddingSampler: this rank's {len(mine)} samples are not a whole number of "
                             f"batches of {local} (batch_size × accumulation steps)")
        for k in range(0, len(mine), local):
            yield mine[k:k + local]
