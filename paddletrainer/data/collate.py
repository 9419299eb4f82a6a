"""Collation: samples → one batch (``default_data_collator``, ``DataCollatorWithPadding``), and the batch keys the
model takes (``forward_parameters``; ``ColumnFilter`` and ``remove_unused_columns`` for ``remove_unused_columns``)."""
from __future__ import annotations

import inspect
import logging
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence

import numpy as np
import paddle
from paddle.distributed.fleet.meta_parallel import PipelineLayer

from .packing import DOCUMENT_ENDS, is_packed_row, pad_packed_rows

__all__ = ["default_data_collator", "DataCollatorWithPadding", "forward_parameters", "forward_argument_names",
           "ColumnFilter", "remove_unused_columns", "RemoveColumnsCollator"]

logger = logging.getLogger("paddletrainer.data")  # the package's logger name before the split: filters keep working


def _stack(values: Sequence[Any]) -> np.ndarray:
    first = values[0]
    if isinstance(first, paddle.Tensor):
        return np.stack([v.numpy() for v in values])
    return np.stack([np.asarray(v) for v in values])


def default_data_collator(features: List[Dict[str, Any]]) -> Dict[str, np.ndarray]:
    """Stacks equal-shaped fields of a list of dict samples into numpy arrays.

    ``label``/``label_ids`` are renamed to ``labels`` (the name models take), as in PaddleNLP/HF. Non-numeric
    fields (strings) are left out. Packed rows of different lengths (PaddleNLP's ``ZeroPaddingMapDataset`` /
    ``ZeroPaddingIterableDataset`` output) are padded to the longest first (:func:`.packing.pad_packed_rows`);
    their document ends become int32, as PaddleNLP passes them to FlashMask.
    """
    if not isinstance(features[0], dict):
        raise TypeError(f"default_data_collator expects dict samples, got {type(features[0]).__name__}")
    if is_packed_row(features[0]):
        if len({len(f["input_ids"]) for f in features}) > 1:
            features = pad_packed_rows(features)
        if features[0].get(DOCUMENT_ENDS) is not None:
            features = [dict(f, **{DOCUMENT_ENDS: np.asarray(f[DOCUMENT_ENDS], dtype="int32")}) for f in features]
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
    sequences are padded with -100 so losses ignore them. Packed rows (PaddleNLP's zero-padding data: document ends
    or a block-diagonal mask) are padded by :func:`.packing.pad_packed_rows`, the padding a document of its own.
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
        if self.padding and is_packed_row(features[0]):
            length = self.max_length if self.padding == "max_length" and self.max_length else 0
            length = max([length] + [len(f["input_ids"]) for f in features])
            if self.pad_to_multiple_of:
                length = -(-length // self.pad_to_multiple_of) * self.pad_to_multiple_of
            return default_data_collator(pad_packed_rows(features, length, pad_token_id=self._pad_value("input_ids"),
                                                         label_pad=self.label_pad_token_id))
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




class RemoveColumnsCollator:
    """PaddleNLP's collator wrapper: each dict *feature* loses the keys not in ``signature_columns`` before
    ``data_collator`` sees it (other features pass unchanged). The first time keys are dropped, and when
    ``logger`` and ``model_name`` are given, ``logger.info`` names them (with ``description``, the split)."""

    def __init__(self, data_collator: Callable, signature_columns: Sequence[str], logger=None,
                 model_name: Optional[str] = None, description: Optional[str] = None):
        self.data_collator = data_collator
        self.signature_columns = signature_columns
        self.logger = logger
        self.model_name = model_name
        self.description = description
        self.message_logged = False

    def _remove_columns(self, feature):
        if not isinstance(feature, dict):
            return feature
        if not self.message_logged and self.logger and self.model_name:
            ignored = [k for k in feature if k not in self.signature_columns]
            if ignored:
                where = f"in the {self.description} set" if self.description else ""
                self.logger.info(f"The following columns {where} don't have a corresponding argument in "
                                 f"`{self.model_name}.forward` and have been ignored: {', '.join(ignored)}.")
                self.message_logged = True
        return {k: v for k, v in feature.items() if k in self.signature_columns}

    def __call__(self, features: List[dict]):
        return self.data_collator([self._remove_columns(f) for f in features])
