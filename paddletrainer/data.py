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
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence

import numpy as np
import paddle


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


class GlobalBatchSampler(paddle.io.BatchSampler):
    """Yields this data rank's indices for each micro-batch, in the layout-free global order.

    Args:
        num_samples: dataset length.
        batch_size: per-device micro-batch size B.
        data_rank, data_world_size: this rank's position r among W = dp × sharding data ranks.
        seed, shuffle, drop_last: the epoch order (see ``padded_epoch_order``).
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
        if num_samples <= 0:
            raise ValueError("the dataset is empty: a sampler needs at least one sample")
        self.num_samples = num_samples
        self.batch_size = batch_size
        self.data_rank = data_rank
        self.data_world_size = data_world_size
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


class EvalBatchSampler(GlobalBatchSampler):
    """Sequential order for evaluation/prediction; the tail is padded by wrap-around and trimmed after gather."""

    def __init__(self, num_samples: int, batch_size: int, data_rank: int = 0, data_world_size: int = 1):
        super().__init__(num_samples, batch_size, data_rank, data_world_size, shuffle=False, drop_last=False)


class IterableDatasetShard(paddle.io.IterableDataset):
    """Splits a stream the same way: each block of B × W consecutive items is one global micro-batch and data
    rank r keeps items ``[r·B, (r+1)·B)`` of it. An incomplete final block is dropped (a stream has no
    epoch start to wrap to). The number of items already consumed is skipped on resume."""

    def __init__(self, dataset, batch_size: int, data_rank: int = 0, data_world_size: int = 1, skip_items: int = 0):
        self.dataset = dataset
        self.batch_size = batch_size
        self.data_rank = data_rank
        self.data_world_size = data_world_size
        self.skip_items = skip_items

    def __iter__(self):
        span = self.batch_size * self.data_world_size
        lo, hi = self.data_rank * self.batch_size, (self.data_rank + 1) * self.batch_size
        block: List[Any] = []
        for i, item in enumerate(self.dataset):
            if i < self.skip_items:
                continue
            block.append(item)
            if len(block) == span:
                yield from block[lo:hi]
                block = []


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


def forward_argument_names(model: paddle.nn.Layer) -> Optional[set]:
    """Names the model's ``forward`` accepts, or None when unknown (``**kwargs``, or a ``PipelineLayer``, whose
    ``forward(input, chunk_id)`` is not the batch's signature) — then nothing is removed."""
    from paddle.distributed.fleet.meta_parallel import PipelineLayer

    if isinstance(model, PipelineLayer):
        return None
    sig = inspect.signature(model.forward)
    if any(p.kind == p.VAR_KEYWORD for p in sig.parameters.values()):
        return None
    return set(sig.parameters)


class ColumnFilter:
    """Wraps a collator so the batch only keeps keys the model's forward accepts (``remove_unused_columns``).

    Label keys are kept even if the forward does not take them: the criterion needs them.
    """

    def __init__(self, collator: Callable, allowed: set, keep: Sequence[str]):
        self.collator = collator
        self.allowed = set(allowed) | set(keep) | {"label", "label_ids"}

    def __call__(self, features):
        if isinstance(features[0], dict):
            features = [{k: v for k, v in f.items() if k in self.allowed} for f in features]
        return self.collator(features)


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


def interleave_rank_batches(per_rank: List[List[Any]], num_samples: int) -> Any:
    """Undo the eval split: batch k of rank 0, batch k of rank 1, ... is the dataset's order (see module doc).

    ``per_rank[r]`` is rank r's list of per-batch arrays (or tuples of arrays); the wrap-around padding of
    the last global batch is trimmed to ``num_samples``.
    """
    ordered = [batches[k] for k in range(len(per_rank[0])) for batches in per_rank if k < len(batches)]
    if isinstance(ordered[0], (tuple, list)):
        return type(ordered[0])(
            _concat_padded([b[i] for b in ordered])[:num_samples] for i in range(len(ordered[0]))
        )
    return _concat_padded(ordered)[:num_samples]


def gather_in_dataset_order(batches: List[Any], topology, num_samples: int) -> Any:
    """All data ranks' eval outputs, concatenated in dataset order (every rank gets the result)."""
    if topology.data_world_size == 1:
        return interleave_rank_batches([batches], num_samples)
    from .parallel.collectives import all_gather_object_over_data_group

    return interleave_rank_batches(all_gather_object_over_data_group(batches, topology), num_samples)


def sum_over_data_ranks(values: List[float], topology) -> List[float]:
    """Element-wise sum of small host-side counters (eval loss sums, sample counts) over data ranks."""
    if topology.data_world_size == 1:
        return list(values)
    from .parallel.collectives import all_gather_object_over_data_group

    return [sum(col) for col in zip(*all_gather_object_over_data_group(list(values), topology))]
