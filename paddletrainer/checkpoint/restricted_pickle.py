"""Read the pickles of a PaddleNLP checkpoint (``paddle.save``'s ``.pdparams``/``.pdopt``/``.pth`` files) without
running code from them: an allowlist unpickler, the idea of torch's ``weights_only=True``.

``paddle.load`` unpickles with Python's full unpickler, which calls whatever callable the file names (a
``__reduce__`` payload runs on load). :func:`load_pickle` gives back what ``paddle.load`` gives for the files
PaddleNLP's Trainer writes, but its unpickler resolves only these names, and anything else is refused with
:class:`~.files.UnsafeCheckpointFileError` naming the file and the ``module.qualname`` it asked for:

* containers and scalars: ``dict``/``list``/``tuple``/``set``/``frozenset`` (the pickle opcodes build most of
  them without any name), ``collections.OrderedDict``; ``builtins.tuple`` is also how ``paddle.save`` pickles a
  ``paddle.Tensor`` (``tuple(((name, ndarray),))``);
* numpy arrays, dtypes and scalars (``_reconstruct``, ``ndarray``, ``dtype``, ``scalar`` under
  ``numpy.core.multiarray`` or numpy 2's ``numpy._core.multiarray``); only a plain ``ndarray`` is rebuilt
  (no subclass) and object dtypes are refused;
* ``paddle.base.libpaddle.GeneratorState`` (the RNG states in ``rng_state.pth``);
* two callables ``paddle.save`` and protocol 2 use, each replaced by a function that accepts only that use:
  ``builtins.eval`` (a ``DenseTensor`` pickles as ``eval('data', {'data': ndarray})``: the array is returned,
  nothing is evaluated) and ``_codecs.encode`` (protocol 2's bytes: ``encode(str, 'latin1')``).

After unpickling, the arrays become tensors as ``paddle.load`` makes them (3.3.1, ``framework/io.py``): a
dict carrying ``paddle.save``'s name table (``StructuredToParameterName@@``) gets its top-level arrays as
named tensors and loses the table; otherwise every ``(name, ndarray)`` pair becomes a named tensor, or, when
there is none, every array a tensor. ``return_numpy=True`` keeps arrays. Big arrays that protocol 2/3 split
(``UnpackBigParamInfor@@``) are joined back.
"""
from __future__ import annotations

import collections
import codecs
import pickle
from typing import Any, Callable, Dict, Tuple

import numpy as np
import paddle

from .files import UnsafeCheckpointFileError
from .layout import CheckpointError

try:  # numpy >= 2 moved the module; pickles name whichever numpy wrote them
    from numpy._core import multiarray as _multiarray
except ImportError:  # numpy 1.x
    from numpy.core import multiarray as _multiarray

__all__ = ["load_pickle"]

_NAME_TABLE = "StructuredToParameterName@@"
_SPLIT_INFO = "UnpackBigParamInfor@@"  # (paddle's spelling)


class _Refused(Exception):
    """A name or a use outside the allowlist; :func:`load_pickle` adds the file's name."""


# What the name ``numpy.ndarray`` resolves to: only :func:`_reconstruct` accepts it, so the real class is never
# handed to the pickle's own calls (``REDUCE``/``NEWOBJ`` of this sentinel fail: it is neither callable nor a type).
_NDARRAY = object()


def _plain_dtype(dtype) -> np.dtype:
    dtype = np.dtype(dtype)
    if dtype.hasobject:
        raise _Refused(f"a numpy array of dtype {dtype} (objects)")
    return dtype


def _reconstruct(subtype, shape, typecode):
    if subtype is not _NDARRAY:
        raise _Refused(f"numpy's _reconstruct of {subtype!r} (only a plain numpy.ndarray is rebuilt)")
    return _multiarray._reconstruct(np.ndarray, shape, typecode)


def _dtype(spec, align=False, copy=False):
    return _plain_dtype(np.dtype(spec, align, copy))


def _scalar(dtype, data=None):
    _plain_dtype(dtype)
    return _multiarray.scalar(dtype) if data is None else _multiarray.scalar(dtype, data)


def _dense_tensor_data(expression, namespace=None, *rest):
    """``paddle.save``'s ``eval('data', {'data': array})`` for a ``DenseTensor``: that array, nothing evaluated."""
    if expression != "data" or rest or not isinstance(namespace, dict) or set(namespace) != {"data"}:
        raise _Refused(f"builtins.eval({expression!r}, ...) (only paddle.save's eval('data', {{'data': array}}))")
    return namespace["data"]


def _latin1_bytes(text, encoding="utf-8", *rest):
    if rest or not isinstance(text, str) or codecs.lookup(encoding).name != "iso8859-1":
        raise _Refused(f"_codecs.encode(..., {encoding!r}) (only protocol 2's latin1 bytes)")
    return text.encode("latin1")


def _allowlist() -> Dict[Tuple[str, str], Any]:
    names: Dict[Tuple[str, str], Any] = {
        ("builtins", "tuple"): tuple, ("builtins", "list"): list, ("builtins", "dict"): dict,
        ("builtins", "set"): set, ("builtins", "frozenset"): frozenset,
        ("collections", "OrderedDict"): collections.OrderedDict,
        ("builtins", "eval"): _dense_tensor_data, ("_codecs", "encode"): _latin1_bytes,
        ("numpy", "ndarray"): _NDARRAY, ("numpy", "dtype"): _dtype,
        ("paddle.base.libpaddle", "GeneratorState"): paddle.framework.core.GeneratorState,
    }
    # protocols 0-2 write Python 2's module names (pickle's fix_imports)
    names.update({("__builtin__", name): obj for (module, name), obj in list(names.items()) if module == "builtins"})
    for module in ("numpy.core.multiarray", "numpy._core.multiarray"):
        names[(module, "_reconstruct")] = _reconstruct
        names[(module, "scalar")] = _scalar
    return names


_ALLOWED = _allowlist()


class _RestrictedUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        try:
            return _ALLOWED[(module, name)]
        except KeyError:
            raise _Refused(f"{module}.{name}") from None

    def persistent_load(self, pid):
        raise _Refused(f"a persistent id {pid!r}")


def _join_split_arrays(obj: dict) -> dict:
    info = obj.pop(_SPLIT_INFO, None)
    for key, record in (info or {}).items():
        parts = [obj.pop(part) for part in record["slices"]]
        obj[key] = np.concatenate(parts).reshape(record["OriginShape"])
    return obj


def _tensor(array: np.ndarray, name, return_numpy: bool):
    if return_numpy:
        return array
    tensor = paddle.to_tensor(array, place=paddle.CPUPlace())  # host memory: the loader copies it where it belongs
    if name:
        tensor.name = name
    return tensor


def _is_named_array(obj) -> bool:
    return type(obj) is tuple and len(obj) == 2 and isinstance(obj[0], str) and isinstance(obj[1], np.ndarray)


def _any(obj, test: Callable[[Any], bool]) -> bool:
    if test(obj):
        return True
    if type(obj) in (dict, collections.OrderedDict):
        return any(_any(v, test) for v in obj.values())
    if type(obj) in (list, tuple):
        return any(_any(v, test) for v in obj)
    return False


def _convert(obj, test: Callable[[Any], bool], convert: Callable[[Any], Any]):
    if test(obj):
        return convert(obj)
    if type(obj) in (dict, collections.OrderedDict):
        for key in list(obj):
            obj[key] = _convert(obj[key], test, convert)
    elif type(obj) is list:
        obj[:] = [_convert(v, test, convert) for v in obj]
    elif type(obj) is tuple:
        return tuple(_convert(v, test, convert) for v in obj)
    return obj


def _as_paddle_load_returns(obj, return_numpy: bool):
    if isinstance(obj, dict):
        obj = _join_split_arrays(obj)
        if _NAME_TABLE in obj:
            for key, name in obj.pop(_NAME_TABLE).items():
                if isinstance(obj.get(key), np.ndarray):
                    obj[key] = _tensor(obj[key], name, return_numpy)
            return obj
    if _any(obj, _is_named_array):
        return _convert(obj, _is_named_array, lambda pair: _tensor(pair[1], pair[0], return_numpy))
    return _convert(obj, lambda x: isinstance(x, np.ndarray), lambda a: _tensor(a, None, return_numpy))


def load_pickle(path: str, *, return_numpy: bool = False):
    """What ``paddle.load(path, return_numpy=...)`` returns for a file ``paddle.save`` pickled, read with the
    allowlist unpickler (module docstring). Raises :class:`~.files.UnsafeCheckpointFileError` naming ``path``
    and the ``module.qualname`` (or use) outside the allowlist; nothing outside it is imported or called."""
    with open(path, "rb") as f:
        try:
            obj = _RestrictedUnpickler(f, encoding="latin1").load()
        except _Refused as refused:
            raise UnsafeCheckpointFileError(
                f"{path}: refused to unpickle {refused}: a PaddleNLP checkpoint file holds only arrays, tensors, "
                "numbers, strings and containers, and anything else could run code when loaded; this file was "
                "not loaded (re-save it from a trusted run)") from None
        except Exception as e:  # noqa: BLE001 - whatever a malformed or hostile file raises: one line naming it
            raise CheckpointError(f"{path} is not a pickle paddle.save wrote ({type(e).__name__}: {e})") from None
    if _any(obj, lambda x: isinstance(x, np.ndarray) and x.dtype.hasobject):  # a dtype's state can say "objects"
        raise UnsafeCheckpointFileError(f"{path}: refused a numpy array of objects (a PaddleNLP checkpoint holds "
                                        "numbers only); this file was not loaded")
    return _as_paddle_load_returns(obj, return_numpy)
