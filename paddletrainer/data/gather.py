"""Evaluation outputs of every data rank, gathered back into dataset order, and small counters summed over the
data ranks.

``EvalBatchSampler`` (:mod:`.sampling`) gives data rank r the r-th per-device batch of each block of B × W
samples; gathering interleaves (block k, rank 0), (block k, rank 1), ... which is the dataset's order.
"""
from __future__ import annotations

from typing import Any, List, Optional

from ..parallel.collectives import all_gather_object_over_data_group
from .nested import concat_padded

__all__ = ["interleave_rank_batches", "gather_in_dataset_order", "sum_over_data_ranks"]


def interleave_rank_batches(per_rank: List[List[Any]], num_samples: Optional[int] = None) -> Any:
    """Undo the eval split: batch k of rank 0, batch k of rank 1, ... is the dataset's order (see module doc).

    ``per_rank[r]`` is rank r's list of per-batch arrays (or tuples of arrays); ``num_samples`` (optional)
    trims the result.
    """
    ordered = [batches[k] for k in range(max(len(b) for b in per_rank)) for batches in per_rank if k < len(batches)]
    if isinstance(ordered[0], (tuple, list)):
        return type(ordered[0])(
            concat_padded([b[i] for b in ordered])[:num_samples] for i in range(len(ordered[0]))
        )
    return concat_padded(ordered)[:num_samples]


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


