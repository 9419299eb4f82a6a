"""Packed rows: several fine-tuning documents in one sequence instead of one padded sample each.

PaddleNLP's zero-padding data (``paddlenlp.datasets.zero_padding_dataset``: ``ZeroPaddingMapDataset``,
``ZeroPaddingIterableDataset``) concatenates tokenized records into rows of at most ``max_length`` tokens, with
``position_ids`` restarting per document and the document mask as FlashMask's ``attn_mask_startend_row_indices``
(every token's document end, when the records carry them) or a block-diagonal ``[1, L, L]`` ``attention_mask``.
Its rows have different lengths; :func:`pad_packed_rows` pads a batch of them to one length (both collators of
:mod:`.collate` call it), the padding being one more document no label counts. :func:`pack_dataset` is the one
call that packs a dataset of tokenized records: PaddleNLP's ``ZeroPaddingMapDataset`` (greedy), each record
given its positions and, for the FlashMask format, its document ends first.
"""
from __future__ import annotations

from typing import Any, Dict, List, Sequence

import numpy as np

__all__ = ["DOCUMENT_ENDS", "MASK_FORMATS", "is_packed_row", "pack_dataset", "pad_packed_rows"]

DOCUMENT_ENDS = "attn_mask_startend_row_indices"
MASK_FORMATS = ("startend", "attention_mask")


def is_packed_row(feature: Dict[str, Any]) -> bool:
    """Whether ``feature`` is a packed row: document ends, or a square (``[1, L, L]`` / ``[L, L]``) mask."""
    if feature.get(DOCUMENT_ENDS) is not None:
        return True
    mask = feature.get("attention_mask")
    return mask is not None and np.ndim(mask) >= 2


def _pad_mask(mask, length: int) -> np.ndarray:
    """A block-diagonal mask grown to ``length``: the padding is one causal block of its own."""
    mask = np.asarray(mask, dtype=bool)
    lead, n = mask.shape[:-2], mask.shape[-1]
    out = np.zeros(lead + (length, length), dtype=bool)
    out[..., :n, :n] = mask
    out[..., n:, n:] = np.tril(np.ones((length - n, length - n), dtype=bool))
    return out


def _pad_row(feature: Dict[str, Any], length: int, pad_token_id: int, label_pad: int) -> Dict[str, Any]:
    n = len(feature["input_ids"])
    if n > length:
        raise ValueError(f"a packed row of {n} tokens does not fit the padded length {length}; pack with "
                         f"max_length <= {length}")
    fill = {"input_ids": pad_token_id, "labels": label_pad, "position_ids": 0, DOCUMENT_ENDS: length}
    row = dict(feature)
    for key, value in fill.items():
        if feature.get(key) is not None:
            row[key] = np.concatenate([np.asarray(feature[key]).reshape(-1),
                                       np.full(length - n, value, dtype=np.asarray(feature[key]).dtype)])
    if feature.get("attention_mask") is not None:
        row["attention_mask"] = _pad_mask(feature["attention_mask"], length)
    return row


def pad_packed_rows(features: Sequence[Dict[str, Any]], length: int = 0, *, pad_token_id: int = 0,
                    label_pad: int = -100) -> List[Dict[str, Any]]:
    """Packed rows padded to one length (the longest row, or ``length`` if larger): ids with ``pad_token_id``,
    labels with ``label_pad``, positions with 0; the padding is a document of its own (its document end is the
    padded length; a block mask gets a causal block), so no real token sees it and no pad row is left without
    a key to attend to."""
    target = max([length] + [len(f["input_ids"]) for f in features])
    return [_pad_row(f, target, pad_token_id, label_pad) for f in features]


def _with_document_fields(record: Dict[str, Any], mask_format: str) -> Dict[str, Any]:
    n = len(record["input_ids"])
    out = dict(record)
    out.setdefault("position_ids", list(range(n)))
    if mask_format == "startend":
        out[DOCUMENT_ENDS] = [n] * n  # PaddleNLP's zero padding offsets each record's ends by its start
    return out


def pack_dataset(dataset, max_length: int, *, mask_format: str = "startend", greedy: bool = True):
    """Tokenized records (dicts with ``input_ids`` and ``labels``, any lengths) packed into rows of at most
    ``max_length`` tokens by PaddleNLP's ``ZeroPaddingMapDataset`` (``greedy``: its best-fit packing over windows
    of 500 records; else in order). ``mask_format``: ``"startend"`` (FlashMask's document ends, O(S) per row) or
    ``"attention_mask"`` (a block-diagonal ``[1, L, L]`` mask). Records longer than ``max_length`` are dropped, as
    PaddleNLP does. The rows go through the Trainer's default collator as they are."""
    if mask_format not in MASK_FORMATS:
        raise ValueError(f"pack_dataset: mask_format={mask_format!r}; valid: {', '.join(MASK_FORMATS)}")
    if int(max_length) < 1:
        raise ValueError(f"pack_dataset: max_length={max_length} must be a positive number of tokens")
    from paddlenlp.datasets.zero_padding_dataset import ZeroPaddingMapDataset

    records = [_with_document_fields(dataset[i], mask_format) for i in range(len(dataset))]
    return ZeroPaddingMapDataset(records, tokenizer=None, max_length=int(max_length), greedy_zero_padding=greedy)
