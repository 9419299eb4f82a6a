"""Operations on nested batch outputs: tensors or arrays inside (possibly nested) tuples, lists and dicts.

These are the helpers PaddleNLP's ``trainer.utils.helper`` exposes (``nested_concat``, ``nested_numpify``,
``nested_truncate``, ``nested_detach``, ``distributed_concat``) and which custom evaluation loops written for
PaddleNLP call; ``paddletrainer.utils.helper`` re-exports them under those names. Each function keeps the
container types it was given (a tuple stays a tuple, a dict a dict).

Two facts have their one home here, and the evaluation gathering (:mod:`.gather`, ``trainer_evaluation``) uses
them too: a tensor on the host as NumPy (:func:`nested_numpify`: float16/bfloat16 through float32) and the
concatenation of batches whose later axes differ, padded with -100 (:func:`concat_padded`).
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

import numpy as np
import paddle

__all__ = ["nested_concat", "nested_numpify", "nested_truncate", "nested_detach", "distributed_concat",
           "concat_padded", "paddle_pad_and_concatenate", "numpy_pad_and_concatenate"]


def _map(fn, value):
    """Apply ``fn`` to every leaf of ``value``, keeping tuples, lists and dicts."""
    if isinstance(value, (tuple, list)):
        return type(value)(_map(fn, v) for v in value)
    if isinstance(value, dict):
        return type(value)((k, _map(fn, v)) for k, v in value.items())
    return fn(value)


def concat_padded(parts: Sequence[Any], padding_index: int = -100):
    """``parts`` (all paddle Tensors or all NumPy arrays, with the same number of axes) joined on axis 0.

    When the later axes differ (variable sequence lengths across batches), every part is placed at the start of
    each later axis of the largest size and the rest is ``padding_index`` (-100, the label value losses
    ignore). A Tensor result keeps the first part's dtype (bfloat16 included) and device.
    """
    first = parts[0]
    if any(len(p.shape) != len(first.shape) for p in parts):
        raise ValueError(f"cannot concatenate outputs with different numbers of axes: shapes "
                         f"{[list(p.shape) for p in parts]}; every batch's output needs the same number of axes "
                         f"(the sizes after axis 0 may differ: they are padded with {padding_index})")
    is_tensor = isinstance(first, paddle.Tensor)
    if all(list(p.shape[1:]) == list(first.shape[1:]) for p in parts):
        return paddle.concat(list(parts), axis=0) if is_tensor else np.concatenate(parts, axis=0)
    shape = [sum(p.shape[0] for p in parts)] + [max(p.shape[i] for p in parts) for i in range(1, len(first.shape))]
    if is_tensor:
        out = paddle.full(shape, padding_index, dtype=first.dtype)
    else:
        out = np.full(shape, padding_index, dtype=np.result_type(*parts))
    row = 0
    for p in parts:
        out[(slice(row, row + p.shape[0]),) + tuple(slice(0, n) for n in p.shape[1:])] = p
        row += p.shape[0]
    return out


def paddle_pad_and_concatenate(tensor1: paddle.Tensor, tensor2: paddle.Tensor, padding_index: int = -100):
    """PaddleNLP's name for :func:`concat_padded` of two paddle Tensors."""
    return concat_padded([tensor1, tensor2], padding_index)


def numpy_pad_and_concatenate(array1: np.ndarray, array2: np.ndarray, padding_index: int = -100):
    """PaddleNLP's name for :func:`concat_padded` of two NumPy arrays."""
    return concat_padded([array1, array2], padding_index)


def nested_concat(tensors, new_tensors, padding_index: int = -100):
    """Concatenate ``new_tensors`` after ``tensors`` on axis 0, leaf by leaf (both must have the same nesting).

    Leaves may be paddle Tensors, NumPy arrays, or plain numbers (which become 1-element arrays). Later axes of
    different sizes are padded with ``padding_index``.
    """
    if type(tensors) is not type(new_tensors):
        raise TypeError(f"nested_concat: both arguments must have the same type, got {type(tensors).__name__} "
                        f"and {type(new_tensors).__name__}")
    if isinstance(tensors, (tuple, list)):
        return type(tensors)(nested_concat(t, n, padding_index) for t, n in zip(tensors, new_tensors))
    if isinstance(tensors, dict):
        return type(tensors)((k, nested_concat(v, new_tensors[k], padding_index)) for k, v in tensors.items())
    if isinstance(tensors, (paddle.Tensor, np.ndarray)):
        return concat_padded([tensors, new_tensors], padding_index)
    return np.concatenate([np.atleast_1d(tensors), np.atleast_1d(new_tensors)])


def nested_detach(tensors):
    """``tensor.detach()`` on every leaf."""
    return _map(lambda t: t.detach(), tensors)


def nested_numpify(tensors):
    """Every leaf as a NumPy array on the host; float16/bfloat16 become float32 (NumPy has no bfloat16)."""

    def numpify(t):
        if isinstance(t, paddle.Tensor):
            if t.dtype in (paddle.float16, paddle.bfloat16):
                t = t.astype("float32")  # a bf16 tensor's .numpy() is its raw uint16 bits, not its values
            return t.numpy()
        return np.asarray(t)

    return _map(numpify, tensors)


def nested_truncate(tensors, limit: int):
    """The first ``limit`` rows of every leaf (drops the padding a distributed sampler added at the end)."""
    return _map(lambda t: t[:limit], tensors)


def distributed_concat(tensor: Any, num_total_examples: Optional[int] = None) -> Any:
    """All-gather ``tensor`` (or every Tensor leaf of a nested structure) from every rank of the default group,
    concatenate on axis 0 in rank order, and keep the first ``num_total_examples`` rows.

    Collective: every rank must call it with tensors of the same shape. With one process it only truncates.
    0-d tensors are gathered as 1-element rows.
    """

    def gather(t):
        if paddle.distributed.get_world_size() > 1:
            parts = []
            paddle.distributed.all_gather(parts, t)
        else:
            parts = [t]
        parts = [p.reshape([1]) if len(p.shape) == 0 else p for p in parts]
        out = paddle.concat(parts, axis=0)
        return out[:num_total_examples] if num_total_examples is not None else out

    return _map(gather, tensor)
