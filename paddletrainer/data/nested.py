"""Operations on nested batch outputs: tensors or arrays inside (possibly nested) tuples, lists and dicts.

These are the helpers PaddleNLP's ``trainer.utils.helper`` exposes (``nested_concat``, ``nested_numpify``,
``nested_truncate``, ``nested_detach``, ``distributed_concat``) and which custom evaluation loops written for
PaddleNLP call; ``paddletrainer.utils.helper`` re-exports them under those names. Each function keeps the
container types it was given (a tuple stays a tuple, a dict a dict).
"""
from __future__ import annotations

from typing import Any, Optional

import numpy as np
import paddle

__all__ = ["nested_concat", "nested_numpify", "nested_truncate", "nested_detach", "distributed_concat",
           "pad_and_concatenate", "concat_padded"]


def _map(fn, value):
    """Apply ``fn`` to every leaf of ``value``, keeping tuples, lists and dicts."""
    if isinstance(value, (tuple, list)):
        return type(value)(_map(fn, v) for v in value)
    if isinstance(value, dict):
        return type(value)((k, _map(fn, v)) for k, v in value.items())
    return fn(value)


def concat_padded(arrays, padding_index: int = -100) -> np.ndarray:
    """NumPy arrays joined on axis 0. When their later axes differ (variable sequence lengths across batches), each
    is first padded with ``padding_index`` up to the largest size on every later axis. The one home of that rule:
    :func:`pad_and_concatenate` and the evaluation gathering (``data.interleave_rank_batches``) use it."""
    if all(a.shape[1:] == arrays[0].shape[1:] for a in arrays):
        return np.concatenate(arrays, axis=0)
    target = np.max([a.shape for a in arrays], axis=0)
    return np.concatenate([np.pad(a, [(0, 0)] + [(0, int(t - s)) for s, t in zip(a.shape[1:], target[1:])],
                                  constant_values=padding_index) for a in arrays], axis=0)


def pad_and_concatenate(first, second, padding_index: int = -100):
    """``first`` and ``second`` (both paddle Tensors or both NumPy arrays) joined on axis 0, later axes padded with
    ``padding_index`` where they differ (:func:`concat_padded`)."""
    if not isinstance(first, paddle.Tensor):
        return concat_padded([first, second], padding_index)
    if len(first.shape) <= 1 or list(first.shape[1:]) == list(second.shape[1:]):
        return paddle.concat([first, second], axis=0)
    # paddle.nn.functional.pad wants NCHW-style layouts; numpy's pad takes any rank, and evaluation outputs go to
    # the host anyway.
    return paddle.to_tensor(concat_padded([first.numpy(), second.numpy()], padding_index))


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
        return pad_and_concatenate(tensors, new_tensors, padding_index)
    return np.concatenate([np.atleast_1d(tensors), np.atleast_1d(new_tensors)])


def nested_detach(tensors):
    """``tensor.detach()`` on every leaf."""
    return _map(lambda t: t.detach(), tensors)


def nested_numpify(tensors):
    """Every leaf as a NumPy array on the host; float16/bfloat16 become float32 (NumPy has no bfloat16: a bf16
    tensor's ``.numpy()`` is its raw uint16 bits, not its values). The evaluation loop's conversion too
    (``trainer_evaluation.to_numpy`` is this function)."""

    def numpify(t):
        if isinstance(t, paddle.Tensor):
            if t.dtype in (paddle.float16, paddle.bfloat16):
                t = t.astype("float32")
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
