"""Read the pickles of a PaddleNLP checkpoint (``paddle.save``'s ``.pdparams``/``.pdopt``/``.pth`` files) without
running code from them: an allowlist unpickler, the idea of torch's ``weights_only=True``.

``paddle.load`` unpickles with Python's full unpickler, which calls whatever callable the file names (a
``__reduce__`` payload runs on load). :func:`load_pickle` gives back what ``paddle.load`` gives for the files
PaddleNLP's Trainer writes, but its unpickler resolves only these names, and anything else is refused with
:class:`~.read.UnsafeCheckpointFileError` naming the file and the ``module.qualname`` it asked for:

* containers and scalars: ``dict``/``list``/``tuple``/``set``/``frozenset`` (the pickle opcodes build most of
  them without any name), ``collections.OrderedDict``; ``builtins.tuple`` is also how ``paddle.save`` pickles a
  ``paddle.Tensor`` (``tuple(((name, ndarray),))``);
* numpy arrays, dtypes and scalars (``_reconstruct``, ``ndarray``, ``dtype``, ``scalar`` under
  ``numpy.core.multiarray`` or numpy 2's ``numpy._core.multiarray``) of bool, integer, float and complex
  dtypes only (no objects, records or subclasses);
* ``paddle.base.libpaddle.GeneratorState`` (the RNG states in ``rng_state.pth``);
* two callables ``paddle.save`` and protocol 2 use, each replaced by a function that accepts only that use:
  ``builtins.eval`` (a ``DenseTensor`` pickles as ``eval('data', {'data': ndarray})``: the array is returned,
  nothing is evaluated) and ``_codecs.encode`` (protocol 2's bytes: ``encode(str, 'latin1')``).

The names are not enough: a pickle's ``BUILD`` hands a state to an object's ``__setstate__``, and numpy's
takes anything (a dtype's state can set its "holds objects" flag, and that dtype's arrays would read the file's
bytes as pointers). So the unpickler is Python's own (``pickle._Unpickler``: the C one's opcodes cannot be
overridden) and each ``BUILD`` is checked before ``__setstate__`` runs: a dtype takes only the state numpy pickles
for it (either byte order), an array from ``_reconstruct`` one state ``(1, shape, numeric dtype, is_fortran,
bytes)`` with exactly the bytes the shape needs, a ``GeneratorState`` from ``NEWOBJ`` one ``(device, seed,
offset, [engine text])``; anything else — and ``INST``/``OBJ``/``NEWOBJ_EX``/``EXT`` — is refused.

After unpickling, the arrays become tensors as ``paddle.load`` makes them (3.3.1, ``framework/io.py``): a
dict carrying ``paddle.save``'s name table (``StructuredToParameterName@@``) gets its top-level arrays as
named tensors and loses the table; otherwise every ``(name, ndarray)`` pair becomes a named tensor, or, when
there is none, every array a tensor. ``return_numpy=True`` keeps arrays. Big arrays that protocol 2/3 split
(``UnpackBigParamInfor@@``) are joined back.
"""
from __future__ import annotations

import codecs
import collections
import io
import math
import os
import pickle
import reprlib
from typing import Any, Callable, Dict, Tuple

import numpy as np
import paddle

from .placement import CheckpointError
from .read import UnsafeCheckpointFileError, open_member

try:  # numpy >= 2 moved the module; pickles name whichever numpy wrote them
    from numpy._core import multiarray as _multiarray
except ImportError:  # numpy 1.x
    from numpy.core import multiarray as _multiarray

__all__ = ["load_pickle"]

_NAME_TABLE = "StructuredToParameterName@@"
_SPLIT_INFO = "UnpackBigParamInfor@@"  # (paddle's spelling)


class _Refused(Exception):
    """A name or a use outside the allowlist; :func:`load_pickle` adds the file's name."""


class _Name:
    """What a name resolves to when only our own code may use it (the pickle's ``REDUCE``/``NEWOBJ`` of it fail)."""

    def __init__(self, qualname: str):
        self.qualname = qualname

    def __repr__(self):
        return self.qualname


_NDARRAY = _Name("numpy.ndarray")  # only :meth:`_RestrictedUnpickler._reconstruct` accepts it
_RECONSTRUCT = _Name("numpy's _reconstruct")  # find_class hands out the unpickler's own, which records the array
_GENERATOR_STATE = _Name("paddle.base.libpaddle.GeneratorState")  # only NEWOBJ() of it, then one BUILD
_NUMBER_KINDS = "biufc"  # bool, int, uint, float, complex: every dtype a paddle tensor becomes (bf16 as uint16)


MAX_NESTING = 100  # containers inside containers: paddle.save writes a few levels (a state dict of dicts)
MAX_MESSAGE = 300  # characters of an underlying error quoted in the one-line refusal

_REPR = reprlib.Repr()  # a refusal quotes what the file holds, cut short (a state can be any size)
_REPR.maxtuple, _REPR.maxlist, _REPR.maxstring, _REPR.maxother, _REPR.maxlevel = 10, 8, 60, 60, 3


def _short(obj) -> str:
    return _REPR.repr(obj)


def _plain_dtype(dtype) -> np.dtype:
    if not isinstance(dtype, np.dtype):
        raise _Refused(f"{_short(dtype)} as a numpy dtype")
    if dtype.hasobject or dtype.kind not in _NUMBER_KINDS or dtype.fields is not None or dtype.subdtype is not None:
        raise _Refused(f"a numpy array of dtype {dtype} (only bool, integer, float and complex numbers)")
    return dtype


def _dtype(spec, align=False, copy=True):
    """numpy's ``dtype(str, False, True)``; always a copy, so a ``BUILD`` could never reach numpy's own dtypes."""
    if type(spec) is not str or type(align) not in (bool, int) or align:
        raise _Refused(f"numpy.dtype({_short(spec)}, {_short(align)}) (only a type string, as numpy pickles one)")
    return _plain_dtype(np.dtype(spec, False, True))


def _scalar(dtype, data=None):
    dtype = _plain_dtype(dtype)
    if type(data) is not bytes or len(data) != dtype.itemsize:
        raise _Refused(f"a numpy {dtype} scalar from {_short(data)} (only its {dtype.itemsize} bytes)")
    return _multiarray.scalar(dtype, data)


def _dense_tensor_data(expression, namespace=None, *rest):
    """``paddle.save``'s ``eval('data', {'data': array})`` for a ``DenseTensor``: that array, nothing evaluated."""
    if expression != "data" or rest or not isinstance(namespace, dict) or set(namespace) != {"data"}:
        raise _Refused(f"builtins.eval({_short(expression)}, ...) (only paddle.save's eval('data', {{'data': array}}))")
    return namespace["data"]


def _latin1_bytes(text, encoding="utf-8", *rest):
    if rest or not isinstance(text, str) or codecs.lookup(encoding).name != "iso8859-1":
        raise _Refused(f"_codecs.encode(..., {_short(encoding)}) (only protocol 2's latin1 bytes)")
    return text.encode("latin1")


def _allowlist() -> Dict[Tuple[str, str], Any]:
    names: Dict[Tuple[str, str], Any] = {
        ("builtins", "tuple"): tuple, ("builtins", "list"): list, ("builtins", "dict"): dict,
        ("builtins", "set"): set, ("builtins", "frozenset"): frozenset,
        ("collections", "OrderedDict"): collections.OrderedDict,
        ("builtins", "eval"): _dense_tensor_data, ("_codecs", "encode"): _latin1_bytes,
        ("numpy", "ndarray"): _NDARRAY, ("numpy", "dtype"): _dtype,
        ("paddle.base.libpaddle", "GeneratorState"): _GENERATOR_STATE,
    }
    # protocols 0-2 write Python 2's module names (pickle's fix_imports)
    names.update({("__builtin__", name): obj for (module, name), obj in list(names.items()) if module == "builtins"})
    for module in ("numpy.core.multiarray", "numpy._core.multiarray"):
        names[(module, "_reconstruct")] = _RECONSTRUCT
        names[(module, "scalar")] = _scalar
    return names


_ALLOWED = _allowlist()


def _equal_tuple(state, expected) -> bool:
    """``state == expected`` compared by type first, so nothing of the pickle's own is asked to compare itself."""
    return (type(state) is tuple and len(state) == len(expected)
            and all(type(a) is type(b) and a == b for a, b in zip(state, expected)))


def _check_dtype_state(dtype: np.dtype, state) -> None:
    """numpy's ``dtype.__setstate__`` sets whatever the state says, flags included ("holds objects": its arrays'
    bytes are then read as pointers). Only the state numpy itself pickles for that dtype, in either byte order."""
    if not any(_equal_tuple(state, d.__reduce__()[2]) for d in (dtype, dtype.newbyteorder())):
        raise _Refused(f"the numpy dtype state (BUILD) {_short(state)} for {dtype} (only numpy's own state of "
                       f"that dtype, {dtype.__reduce__()[2]})")


def _check_array_state(state) -> None:
    """numpy's own array state ``(1, shape, dtype, is_fortran, bytes)``: a dtype of numbers and exactly the bytes
    the shape needs (so a huge shape over short data is refused before numpy allocates anything)."""
    if not (type(state) is tuple and len(state) == 5 and type(state[0]) is int and state[0] == 1
            and type(state[1]) is tuple and all(type(n) is int and n >= 0 for n in state[1])
            and type(state[3]) is bool and type(state[4]) is bytes):
        raise _Refused(f"the numpy array state (BUILD) {_short(state)} (only numpy's (1, shape, dtype, "
                       "is_fortran, bytes))")
    shape, dtype, data = state[1], _plain_dtype(state[2]), state[4]
    if len(data) != math.prod(shape) * dtype.itemsize:
        raise _Refused(f"a numpy array state (BUILD) of shape {_short(shape)} and dtype {dtype} with {len(data)} "
                       f"bytes (it needs {math.prod(shape) * dtype.itemsize})")


def _check_generator_state(state) -> None:
    text = state[3] if type(state) is tuple and len(state) == 4 else []  # the engine's state as characters
    if not (type(state) is tuple and len(state) in (3, 4) and all(type(n) is int for n in state[:3])
            and type(text) is list and all(type(c) is int and 0 <= c < 256 for c in text)):
        raise _Refused(f"the GeneratorState state (BUILD) {_short(state)} (only Paddle's (device, seed, offset, "
                       "[engine text]))")


class _BoundedReader:
    """The pickle's file, each read clamped to what is left in it: a length field claiming more (``BINBYTES8``,
    ``FRAME``) makes no allocation beyond the file's size."""

    def __init__(self, f):
        self._f, self._left = f, os.fstat(f.fileno()).st_size - f.tell()

    def read(self, n: int = -1) -> bytes:
        data = self._f.read(self._left if n < 0 else min(n, self._left))
        self._left -= len(data)
        return data

    def readline(self) -> bytes:
        line = self._f.readline(self._left)
        self._left -= len(line)
        return line


class _RestrictedUnpickler(pickle._Unpickler):  # the Python unpickler: its opcodes can be checked
    """Python's own unpickler (the C one's opcodes cannot be overridden) with names from the allowlist only and
    every ``BUILD`` checked before ``__setstate__`` runs: only numpy dtypes (a no-op state), numpy arrays fresh
    from ``_reconstruct`` and Paddle generator states fresh from ``NEWOBJ`` (each built once) take a state."""

    dispatch = dict(pickle._Unpickler.dispatch)

    def __init__(self, f, **kw):
        super().__init__(_BoundedReader(f), **kw)
        self._unbuilt: Dict[int, Any] = {}  # id -> array/GeneratorState awaiting its one BUILD (kept alive here)

    def find_class(self, module: str, name: str):
        try:
            obj = _ALLOWED[(module, name)]
        except KeyError:
            raise _Refused(f"{module}.{name}") from None
        return self._reconstruct if obj is _RECONSTRUCT else obj

    def persistent_load(self, pid):
        raise _Refused(f"a persistent id {_short(pid)}")

    def _reconstruct(self, subtype, shape, typecode):
        """numpy's ``_reconstruct(ndarray, (0,), b'b')``: an empty array its ``BUILD`` fills."""
        if not (subtype is _NDARRAY and _equal_tuple(shape, (0,)) and type(typecode) in (bytes, str)
                and typecode in (b"b", "b")):
            raise _Refused(f"numpy's _reconstruct({_short(subtype)}, {_short(shape)}, {_short(typecode)}) (only "
                           "numpy's own (numpy.ndarray, (0,), b'b'))")
        array = _multiarray._reconstruct(np.ndarray, (0,), b"b")
        self._unbuilt[id(array)] = array
        return array

    def load(self):
        obj = super().load()
        if self._unbuilt:
            raise _Refused(f"a {type(next(iter(self._unbuilt.values()))).__name__} pickled without its state")
        return obj

    def _load_reduce(self):
        if not callable(self.stack[-2]):
            raise _Refused(f"a call of {_short(self.stack[-2])}")
        pickle._Unpickler.load_reduce(self)

    def _load_newobj(self):
        args, cls = self.stack.pop(), self.stack.pop()
        if cls is not _GENERATOR_STATE or type(args) is not tuple or args:
            name = f"{cls.__module__}.{cls.__qualname__}" if isinstance(cls, type) else _short(cls)
            raise _Refused(f"NEWOBJ of {name}{_short(args)} (only of paddle's GeneratorState, with no arguments)")
        state = paddle.framework.core.GeneratorState.__new__(paddle.framework.core.GeneratorState)
        self._unbuilt[id(state)] = state
        self.append(state)

    def _load_build(self):
        state = self.stack.pop()
        inst = self.stack[-1]
        if isinstance(inst, np.dtype):
            _check_dtype_state(inst, state)
        elif self._unbuilt.pop(id(inst), None) is not inst:
            raise _Refused(f"a state (BUILD) for a {type(inst).__name__} (only numpy dtypes and, once each, "
                           "fresh numpy arrays and Paddle generator states take one)")
        elif isinstance(inst, np.ndarray):
            _check_array_state(state)
        else:
            _check_generator_state(state)
        inst.__setstate__(state)

    def _load_other(self):
        raise _Refused("an opcode paddle.save never writes (INST, OBJ, NEWOBJ_EX or EXT*)")

    dispatch[pickle.REDUCE[0]] = _load_reduce
    dispatch[pickle.NEWOBJ[0]] = _load_newobj
    dispatch[pickle.BUILD[0]] = _load_build
    for _opcode in (pickle.INST, pickle.OBJ, pickle.NEWOBJ_EX, pickle.EXT1, pickle.EXT2, pickle.EXT4):
        dispatch[_opcode[0]] = _load_other
    del _opcode


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


_CONTAINERS = (dict, collections.OrderedDict, list, tuple)


def _children(obj) -> list:
    return list(obj.values()) if type(obj) in (dict, collections.OrderedDict) else list(obj)


def _any(obj, test: Callable[[Any], bool]) -> bool:
    """Whether ``test`` holds for anything in ``obj``; each object looked at once (a pickle's memo shares one
    object among any number of references, so a walk of the references as a tree costs exponentially more)."""
    seen, todo = set(), [obj]
    while todo:
        item = todo.pop()
        if id(item) in seen:
            continue
        seen.add(id(item))
        if test(item):
            return True
        if type(item) in _CONTAINERS:
            todo.extend(_children(item))
    return False


class _Converter:
    """``convert`` applied to everything ``test`` holds for, in place in dicts and lists, tuples rebuilt: each
    object converted once and the result shared by all its references (as the pickle shared the object), nesting
    at most :data:`MAX_NESTING` deep and no container inside itself (``paddle.save`` writes neither)."""

    def __init__(self, test: Callable[[Any], bool], convert: Callable[[Any], Any]):
        self.test, self.convert = test, convert
        self.done: Dict[int, Any] = {}  # id of an object -> what it became (the object itself kept alive by it)
        self.open: set = set()  # ids of the containers being converted (a reference back to one is a cycle)
        self.keep: list = []  # every object looked at: an id stays unique only while its object lives

    def __call__(self, obj, depth: int = 0):
        key = id(obj)
        if key in self.done:
            return self.done[key]
        if key in self.open:
            raise _Refused(f"a {type(obj).__name__} that contains itself (paddle.save never writes one)")
        if depth > MAX_NESTING:
            raise _Refused(f"containers nested more than {MAX_NESTING} deep (paddle.save nests a few levels)")
        if self.test(obj):
            out = self.convert(obj)
        elif type(obj) in _CONTAINERS:
            self.open.add(key)
            out = self._container(obj, depth)
            self.open.discard(key)
        else:
            out = obj
        self.done[key] = out
        self.keep.append(obj)
        return out

    def _container(self, obj, depth: int):
        if type(obj) in (dict, collections.OrderedDict):
            for name in list(obj):
                obj[name] = self(obj[name], depth + 1)
            return obj
        if type(obj) is list:
            obj[:] = [self(v, depth + 1) for v in obj]
            return obj
        return tuple(self(v, depth + 1) for v in obj)


def _convert(obj, test: Callable[[Any], bool], convert: Callable[[Any], Any]):
    return _Converter(test, convert)(obj)


def _as_paddle_load_returns(obj, return_numpy: bool):
    if isinstance(obj, dict):
        obj = _join_split_arrays(obj)
        if _NAME_TABLE in obj:
            table = obj.pop(_NAME_TABLE)
            if type(table) not in (dict, collections.OrderedDict):
                raise _Refused(f"a name table {_NAME_TABLE} that is a {type(table).__name__}, not a dict")
            for key, name in table.items():
                if isinstance(obj.get(key), np.ndarray):
                    obj[key] = _tensor(obj[key], name, return_numpy)
            return obj
    if _any(obj, _is_named_array):
        return _convert(obj, _is_named_array, lambda pair: _tensor(pair[1], pair[0], return_numpy))
    return _convert(obj, lambda x: isinstance(x, np.ndarray), lambda a: _tensor(a, None, return_numpy))


def load_pickle(path: str, *, return_numpy: bool = False):
    """What ``paddle.load(path, return_numpy=...)`` returns for a file ``paddle.save`` pickled, read with the
    allowlist unpickler (module docstring). Raises :class:`~.read.UnsafeCheckpointFileError` naming ``path``
    and the ``module.qualname`` (or use) outside the allowlist; nothing outside it is imported or called."""
    raw, _ = open_member(os.path.dirname(path) or ".", os.path.basename(path))  # a regular file, never blocks
    try:
        with io.BufferedReader(raw) as f:
            obj = _RestrictedUnpickler(f, encoding="latin1").load()
        return _as_paddle_load_returns(obj, return_numpy)
    except _Refused as refused:
        raise UnsafeCheckpointFileError(
            f"{path}: refused to unpickle {_cut(str(refused))}: a PaddleNLP checkpoint file holds only arrays, "
            "tensors, numbers, strings and containers, and anything else could run code when loaded; this file was "
            "not loaded (re-save it from a trusted run)") from None
    except Exception as e:  # noqa: BLE001 - whatever a malformed or hostile file raises: one line naming it
        detail = "; ".join(arg if type(arg) is str else _short(arg) for arg in e.args)  # never str() of a whole state
        raise CheckpointError(f"{path} is not a pickle paddle.save wrote ({type(e).__name__}: {_cut(detail)})") \
            from None


def _cut(text: str) -> str:
    return text if len(text) <= MAX_MESSAGE else text[:MAX_MESSAGE] + f"... ({len(text)} characters)"
