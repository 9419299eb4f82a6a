"""Read any slice of a stored tensor, whatever layout wrote it.

A loading rank describes what it holds with a :class:`Placement` (box, maybe a flat range in it); the
index says which pieces exist; :mod:`layout` computes the overlaps; this module reads just those slices
with ``safetensors.safe_open(...).get_slice`` from the shared filesystem. No collectives, so it works the
same in 1 process, on CPU, and in any new layout. A coverage mask makes a hole in the checkpoint an error
naming the tensor instead of silently leaving uninitialised memory.
"""

from __future__ import annotations

import math
import os
from typing import Callable, Dict

import numpy as np
from safetensors import safe_open

from .placement import (
    CheckpointError,
    Placement,
    box_overlap,
    flat_rows,
    relative_slices,
    row_block_of_flat,
    stored_key,
)
from .read import member_path, open_member

_NP_DTYPES = {"bfloat16": "uint16"}  # numpy has no bfloat16: stored as its bit pattern


class PieceReader:
    """Opens each file of a checkpoint once (lazily) for slice reads."""

    def __init__(self, ckpt_dir: str):
        self.ckpt_dir = ckpt_dir
        self._open: Dict[str, object] = {}

    def __call__(self, file: str):
        h = self._open.get(file)
        if h is None:
            f, _ = open_member(self.ckpt_dir, file)  # a regular file inside the checkpoint, or an error naming it
            f.close()
            try:
                h = safe_open(member_path(self.ckpt_dir, file), framework="np")
            except Exception as e:  # safetensors' own errors (SafetensorError: a bad header) name no file
                raise CheckpointError(f"{os.path.join(self.ckpt_dir, file)}: not a safetensors file ({e})") from None
            self._open[file] = h
        return h

    def close(self) -> None:
        self._open.clear()


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
