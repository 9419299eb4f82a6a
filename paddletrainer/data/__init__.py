"""The data path, one module per job (``paddletrainer.data.X`` names stay importable from here):

* :mod:`.sampling` — the layout-free training order and its split over data ranks (``GlobalBatchSampler``),
  evaluation batches (``EvalBatchSampler``), a user's sampler cut to whole steps, the resume position;
* :mod:`.collate` — collators, and the batch keys the model's forward takes (``forward_parameters``, column
  filtering);
* :mod:`.loader` — the ``DataLoader`` that carries a collator's exception, ``close_batches``, stream sharding
  (``IterableDatasetShard``);
* :mod:`.gather` — evaluation outputs gathered back into dataset order;
* :mod:`.nested` — PaddleNLP's nested-output helpers (``nested_concat``, ``nested_numpify`` ...);
* :mod:`.pretrain` — the pretraining token dataset;
* :mod:`.packing` — packed fine-tuning rows (``pack_dataset``, ``pad_packed_rows``).
"""
from .collate import (
    ColumnFilter,
    DataCollatorWithPadding,
    default_data_collator,
    forward_argument_names,
    forward_parameters,
    remove_unused_columns,
)
from .gather import gather_in_dataset_order, interleave_rank_batches, sum_over_data_ranks
from .loader import CollateErrorCarrier, DataLoader, IterableDatasetShard, close_batches, worker_error_printed_first
from .packing import pack_dataset, pad_packed_rows
from .sampling import (
    EvalBatchSampler,
    GlobalBatchSampler,
    WholeStepBatchSampler,
    epoch_permutation,
    padded_epoch_order,
    resume_position,
)

__all__ = [
    "pack_dataset",
    "pad_packed_rows",
    "ColumnFilter",
    "CollateErrorCarrier",
    "DataCollatorWithPadding",
    "DataLoader",
    "EvalBatchSampler",
    "GlobalBatchSampler",
    "IterableDatasetShard",
    "WholeStepBatchSampler",
    "close_batches",
    "default_data_collator",
    "epoch_permutation",
    "forward_argument_names",
    "forward_parameters",
    "gather_in_dataset_order",
    "interleave_rank_batches",
    "padded_epoch_order",
    "remove_unused_columns",
    "resume_position",
    "sum_over_data_ranks",
    "worker_error_printed_first",
]
