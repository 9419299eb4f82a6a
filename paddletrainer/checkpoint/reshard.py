"""Read any slice of a stored tensor, whatever layout wrote it.

A loading rank describes what it holds with a :class:`Placement` (box, maybe a flat range in it); the
index says which pieces exist; :mod:`layout` computes the overlaps; this module reads just those slices
from open files (``safetensors.safe_open(...).get_slice``, :class:`~.read.PieceReader`) or from a file held in
memory (:class:`MemoryFile`: a verified file, or a memory-mapped one). No collectives, so it works the
same in 1 process, on CPU, and in any new layout. A coverage mask makes a hole in the checkpoint an error
naming the tensor instead of silently leaving uninitialised memory.
"""

from __future__ import annotations

import math
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from .placement import (
    CheckpointError,
    Placement,
    box_overlap,
    stored_key,
)

_NP_DTYPES = {"bfloat16": "uint16"}  # numpy has no bfloat16: stored as its bit pattern


def relative_slices(offsets: Sequence[int], shape: Sequence[int], origin: Sequence[int]) -> Tuple[slice, ...]:
    """Slices selecting the global box (offsets, shape) inside an array whose [0,..] is at ``origin``."""
    return tuple(slice(o - g, o - g + s) for o, s, g in zip(offsets, shape, origin))


def flat_rows(piece_shape: Sequence[int], flat: Tuple[int, int], row_lo: int, row_hi: int) -> Optional[Tuple[int, int]]:
    """Which part of a flat piece falls in rows ``[row_lo, row_hi)`` (dim 0) of its box.

    Returns ``(lo, hi)`` as flat positions inside the box (so ``lo - flat[0]`` indexes the stored 1-D
    array, ``lo - row_lo * row_width`` indexes a buffer holding those rows), or None.
    """
    row_width = math.prod(piece_shape[1:]) if len(piece_shape) > 1 else 1
    lo, hi = max(row_lo * row_width, flat[0]), min(row_hi * row_width, flat[1])
    return (lo, hi) if lo < hi else None


def row_block_of_flat(shape: Sequence[int], flat: Tuple[int, int]) -> Tuple[int, int]:
    """Smallest row range ``[r0, r1)`` (dim 0) of a box whose flattening covers ``flat``."""
    row_width = math.prod(shape[1:]) if len(shape) > 1 else 1
    return flat[0] // row_width, -(-flat[1] // row_width)


class MemoryFile:
    """A safetensors file held in memory, with ``safe_open``'s reading interface (views, no copies): what
    :func:`read_box` reads besides an open file. Either a verified file :func:`~.read.read_verified` read into
    buffers, or a file mapped by :func:`~.read.map_safetensors` (PaddleNLP's unified checkpoints), whose views read
    the disk only when sliced. ``header`` is the file's safetensors header (entry name -> dtype, shape, offsets)."""

    def __init__(self, header: Dict[str, dict], data: Dict[str, np.ndarray]):
        self.header = header
        self._data = data

    def keys(self) -> List[str]:
        return [k for k in self.header if k != "__metadata__"]

    def get_tensor(self, key: str) -> np.ndarray:
        if key not in self._data:
            raise KeyError(f"{key} was read directly into its tensor, or is not in the file")
        return self._data[key]

    get_slice = get_tensor  # NumPy slicing of the view is the slice read


def read_box(info: dict, key: str, offsets, shape, open_file: Callable[[str], object]) -> np.ndarray:
    """The global box (offsets, shape) of tensor ``key`` assembled from every overlapping piece."""
    offsets, shape = tuple(offsets), tuple(shape)
    for p in info["pieces"]:  # the same layout as saved: one piece is exactly the box, read it as is
        if not p.get("flat") and tuple(p["offsets"]) == offsets and tuple(p["shape"]) == shape:
            return open_file(p["file"]).get_tensor(stored_key(p, key)).reshape(shape)
    out = None
    mask = np.zeros(shape, dtype=bool)
    for p in info["pieces"]:
        ov = box_overlap(p["offsets"], p["shape"], offsets, shape)
        if ov is None:
            continue
        ov_off, ov_shape = ov
        h, fkey = open_file(p["file"]), stored_key(p, key)
        dst = relative_slices(ov_off, ov_shape, offsets)
        if not p.get("flat"):
            if tuple(ov_shape) == tuple(p["shape"]):
                src = h.get_tensor(fkey)  # whole piece: one read, also the path for 0-d tensors
            else:
                src = h.get_slice(fkey)[relative_slices(ov_off, ov_shape, p["offsets"])]
            if out is None:
                out = np.empty(shape, dtype=src.dtype)
            out[dst] = src.reshape(ov_shape)
            mask[dst] = True
            continue
        # flat piece: read the part of its flat range that lies in the rows the overlap touches
        r_lo = ov_off[0] - p["offsets"][0]
        r_hi = r_lo + ov_shape[0]
        fr = flat_rows(p["shape"], tuple(p["flat"]), r_lo, r_hi)
        if fr is None:
            continue
        data = h.get_slice(fkey)[fr[0] - p["flat"][0]: fr[1] - p["flat"][0]]
        row_width = math.prod(p["shape"][1:]) if len(p["shape"]) > 1 else 1
        buf = np.zeros((r_hi - r_lo) * row_width, dtype=data.dtype)
        bmask = np.zeros(buf.shape, dtype=bool)
        lo = fr[0] - r_lo * row_width
        buf[lo: lo + data.size] = data
        bmask[lo: lo + data.size] = True
        rows_shape = (r_hi - r_lo,) + tuple(p["shape"][1:])
        origin = (ov_off[0],) + tuple(p["offsets"][1:])
        sel = relative_slices(ov_off, ov_shape, origin)
        buf, bmask = buf.reshape(rows_shape)[sel], bmask.reshape(rows_shape)[sel]
        if out is None:
            out = np.empty(shape, dtype=buf.dtype)
        np.copyto(out[dst], buf, where=bmask)
        mask[dst] |= bmask
    if out is None or not mask.all():
        missing = int(mask.size - mask.sum())
        raise CheckpointError(f"{key}: {missing} elements of box {offsets}+{shape} are in no stored piece")
    return out


def read_placement(index: dict, key: str, target: Placement, open_file: Callable[[str], object]) -> np.ndarray:
    """Exactly the data a rank with ``target`` placement holds (flat targets come back 1-D)."""
    info = index["tensors"][key]
    if list(info["shape"]) != list(target.global_shape):
        raise CheckpointError(f"{key}: checkpoint shape {info['shape']} vs target {list(target.global_shape)}")
    if target.local_numel == 0:  # e.g. the last stage-3 rank of a small parameter holds only padding
        return np.zeros(0, dtype=np.dtype(_NP_DTYPES.get(info["dtype"], info["dtype"])))
    if target.flat is None:
        return read_box(info, key, target.offsets, target.shape, open_file)
    r0, r1 = row_block_of_flat(target.shape, target.flat)
    offs = (target.offsets[0] + r0,) + tuple(target.offsets[1:])
    rows = read_box(info, key, offs, (r1 - r0,) + tuple(target.shape[1:]), open_file).reshape(-1)
    row_width = math.prod(target.shape[1:]) if len(target.shape) > 1 else 1
    start = target.flat[0] - r0 * row_width
    return rows[start: start + (target.flat[1] - target.flat[0])]
