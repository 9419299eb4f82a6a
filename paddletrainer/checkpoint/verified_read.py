"""Read checkpoint files once: every byte is checksummed as it arrives, and lands where it is used.

A load used to checksum each file in one pass and read the tensors in a second one. Here each file is read
from start to end exactly once, in 16 MiB chunks:

* a tensor that fills a host tensor exactly (same layout as saved, same dtype) is read straight into that
  tensor's memory (``direct``); everything else goes into one host buffer per file, whose NumPy views
  the slice reads of :mod:`.reshard` then use (:class:`MemoryFile`) — no assembly copy for a piece stored
  whole;
* a second thread per file computes the crc32 of each chunk right after it is read (``read``/``readinto``
  release the GIL, so reading and checksumming overlap; :mod:`.checksum`), and files are read in parallel;
* a rank that needs only some tensors of a file (a replicated tensor another rank wrote) reads just those,
  each verified against its own crc32 in the index (``parts``, with the header's);
* sizes and crc32s are compared to the index before anything is returned; a bad file raises
  :class:`~.layout.CheckpointCorruptError` naming every bad file. The tensors being filled then hold
  partial data: the error ends the load, and nothing trains on them.

Only the safetensors layout is parsed (8-byte header length, JSON header, raw little-endian data); a file
that is not one (a planted pickle, say) is refused as corrupt, never handed to another loader.
"""

from __future__ import annotations

import os
import struct
from concurrent.futures import ThreadPoolExecutor
from typing import Dict, List, Optional, Set, Tuple

import numpy as np

from .checksum import crc32
from .layout import HEADER_PART, CheckpointCorruptError
from .members import MAX_SMALL_FILE_BYTES, CheckpointPathError, open_member, read_exactly
from .validate import safetensors_entries

CHUNK = 16 << 20
MAX_PARALLEL_FILES = 4
_NP_DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": np.uint16, "I64": np.int64,
              "I32": np.int32, "I16": np.int16, "I8": np.int8, "U64": np.uint64, "U32": np.uint32,
              "U16": np.uint16, "U8": np.uint8, "BOOL": np.bool_}


class MemoryFile:
    """A safetensors file held in memory, with ``safe_open``'s reading interface (views, no copies)."""

    def __init__(self, header: Dict[str, dict], data: Dict[str, np.ndarray]):
        self._header = header
        self._data = data

    def keys(self) -> List[str]:
        return [k for k in self._header if k != "__metadata__"]

    def get_tensor(self, key: str) -> np.ndarray:
        if key not in self._data:
            raise KeyError(f"{key} was read directly into its tensor, or is not in the file")
        return self._data[key]

    get_slice = get_tensor  # NumPy slicing of the view is the slice read


def _open(ckpt_dir: str, name: str):
    """(problem or None, file, size): only a regular file inside ``ckpt_dir`` (:func:`.members.open_member`)."""
    try:
        f, size = open_member(ckpt_dir, name)
    except FileNotFoundError:
        return f"{name}: missing", None, 0
    except CheckpointPathError as e:
        return e.problem, None, 0
    return None, f, size


def _read_file(ckpt_dir: str, name: str, expected: dict,
               direct: Dict[str, np.ndarray]) -> Tuple[Optional[str], Optional[MemoryFile]]:
    """(problem or None, file) for one file: one sequential pass, crc32 of each chunk in a second thread."""
    problem, f, size = _open(ckpt_dir, name)
    if problem:
        return problem, None
    with f, ThreadPoolExecutor(max_workers=1) as crc_thread:
        if size != expected["size"]:
            return f"{name}: size {size} != {expected['size']}", None
        crc = crc_thread.submit(lambda: 0)
        head = f.read(8)
        if len(head) < 8:
            return f"{name}: not a safetensors file (shorter than 8 bytes)", None
        (n,) = struct.unpack("<Q", head)
        if n > size - 8:
            return f"{name}: not a safetensors file (header length {n} > file size {size})", None
        text = f.read(n)

        def checksum(chunk) -> None:
            nonlocal crc
            prev = crc
            crc = crc_thread.submit(lambda: crc32(chunk, prev.result()))

        checksum(head)
        checksum(text)
        try:  # every offset inside the file before any buffer is sized from the header
            header, entries = safetensors_entries(text, size - 8 - n)
        except ValueError as e:
            crc.result()
            return f"{name}: not a safetensors file ({e})", None
        data_start = 8 + n
        buffered = [(k, v) for k, v in entries if k not in direct]
        total = sum(v["data_offsets"][1] - v["data_offsets"][0] for _, v in buffered)
        buf = np.empty(total, dtype=np.uint8)
        arrays: Dict[str, np.ndarray] = {}
        pos, used = data_start, 0
        for key, meta in entries:
            begin, end = (data_start + o for o in meta["data_offsets"])
            dtype, shape = _NP_DTYPES[meta["dtype"]], tuple(meta["shape"])
            if begin != pos:
                crc.result()
                return f"{name}: not a safetensors file written by paddletrainer (tensor {key})", None
            if key in direct:
                dst = direct[key]
                if dst.nbytes != end - begin:
                    crc.result()
                    return f"{name}: {key} has {end - begin} bytes, its tensor {dst.nbytes}", None
                target = memoryview(dst.reshape(-1).view(np.uint8))
            else:
                target = memoryview(buf[used: used + end - begin])
                arrays[key] = buf[used: used + end - begin].view(dtype).reshape(shape)
                used += end - begin
            for lo in range(0, end - begin, CHUNK):
                chunk = target[lo: lo + CHUNK]
                got = f.readinto(chunk)
                while got < len(chunk):  # a short read (signal, network filesystem): read the rest
                    more = f.readinto(chunk[got:])
                    if not more:
                        crc.result()
                        return f"{name}: truncated while reading", None
                    got += more
                checksum(chunk)
            pos = end
        rest = f.read()  # trailing bytes (none in our files) still count for the crc
        checksum(rest)
        value = crc.result()
    if pos + len(rest) != size:
        return f"{name}: size changed while reading", None
    if value != expected["crc32"]:
        return f"{name}: crc32 {value:08x} != {expected['crc32']:08x}", None
    return None, MemoryFile(header, arrays)


def _read_parts(ckpt_dir: str, name: str, expected: dict, keys: Set[str],
                direct: Dict[str, np.ndarray]) -> Tuple[Optional[str], Optional[MemoryFile]]:
    """Only the header and ``keys`` of one file, each checked against its own crc32 in the index
    (``parts``): a rank that needs a few tensors of another rank's file reads just those."""
    parts = expected["parts"]
    problem, f, size = _open(ckpt_dir, name)
    if problem:
        return problem, None
    with f:
        if size != expected["size"]:
            return f"{name}: size {size} != {expected['size']}", None
        head = f.read(8)
        (n,) = struct.unpack("<Q", head) if len(head) == 8 else (size,)
        if n > size - 8:
            return f"{name}: not a safetensors file (header length {n} > file size {size})", None
        text = f.read(n)
        if crc32(text, crc32(head)) != parts.get(HEADER_PART):
            return f"{name}: header crc32 does not match the index", None
        try:  # the bytes the index says the writer wrote, which an edited index can still say of nonsense
            header, _ = safetensors_entries(text, size - 8 - n)
        except ValueError as e:
            return f"{name}: not a safetensors file ({e})", None
        absent = sorted(set(keys) - set(header))
        if absent:
            return f"{name}: has no tensor {absent[0]} (the index says it has)", None
        arrays: Dict[str, np.ndarray] = {}
        for key in sorted(keys, key=lambda k: header[k]["data_offsets"][0]):
            meta = header[key]
            begin, end = (8 + n + o for o in meta["data_offsets"])
            dtype, shape = _NP_DTYPES[meta["dtype"]], tuple(meta["shape"])
            dst = direct.get(key)
            if dst is None:
                dst = np.empty(shape, dtype=dtype)
                arrays[key] = dst
            elif dst.nbytes != end - begin:
                return f"{name}: {key} has {end - begin} bytes, its tensor {dst.nbytes}", None
            target = memoryview(dst.reshape(-1).view(np.uint8))
            got = 0
            while got < len(target):
                k = os.preadv(f.fileno(), [target[got: got + CHUNK]], begin + got)
                if not k:
                    return f"{name}: truncated while reading {key}", None
                got += k
            crc = 0
            for lo in range(0, len(target), CHUNK):
                crc = crc32(target[lo: lo + CHUNK], crc)
            if crc != parts.get(key):
                return f"{name}: crc32 of {key} does not match the index", None
    return None, MemoryFile(header, arrays)


def read_verified(ckpt_dir: str, index: dict, files: List[str],
                  direct: Optional[Dict[str, Dict[str, np.ndarray]]] = None,
                  needed: Optional[Dict[str, Set[str]]] = None) -> Dict[str, MemoryFile]:
    """Read ``files`` of ``ckpt_dir`` once each (in parallel), verifying size and crc32 against ``index``.

    ``direct[file][in-file key]`` is a writable array (the memory of the tensor it belongs to) that the
    stored bytes of that tensor are read into; every other tensor is returned as a view of its file's buffer.
    ``needed[file]``: the in-file keys the caller uses; when that is not every tensor of the file and the
    index has per-tensor checksums (``parts``), only those tensors are read and verified.
    Raises :class:`CheckpointCorruptError` naming every bad file.
    """
    direct, needed = direct or {}, needed or {}
    problems: List[Tuple[str, str]] = []
    jobs = []
    for name in files:
        meta = index["files"].get(name)
        if meta is None:
            problems.append((name, f"{name}: not in the index"))
        else:
            jobs.append((name, meta))
    out: Dict[str, MemoryFile] = {}
    with ThreadPoolExecutor(max_workers=max(1, min(MAX_PARALLEL_FILES, len(jobs)))) as pool:
        def read(job):
            name, meta = job
            keys, dests = needed.get(name), direct.get(name, {})
            stored = set(meta.get("parts", ())) - {HEADER_PART}
            if keys is not None and stored and set(keys) < stored:
                return _read_parts(ckpt_dir, name, meta, set(keys), dests)
            return _read_file(ckpt_dir, name, meta, dests)

        results = list(pool.map(read, jobs))
    for (name, _), (problem, mf) in zip(jobs, results):
        if problem is not None:
            problems.append((name, problem))
        else:
            out[name] = mf
    if problems:
        raise CheckpointCorruptError(ckpt_dir, [n for n, _ in problems], [d for _, d in problems])
    return out


def read_small_file(ckpt_dir: str, index: dict, name: str) -> bytes:
    """The bytes of a small file (JSON, RNG state) of ``ckpt_dir``, read once: the bytes whose size and crc32
    are checked against ``index`` are the bytes returned. Raises :class:`CheckpointCorruptError`."""
    meta = index["files"].get(name)
    problem, data = (f"{name}: not in the index", b"") if meta is None else _read_small(ckpt_dir, name, meta["size"])
    if problem is None and len(data) != meta["size"]:
        problem = f"{name}: size {len(data)} != {meta['size']}"
    if problem is None and crc32(data) != meta["crc32"]:
        problem = f"{name}: crc32 {crc32(data):08x} != {meta['crc32']:08x}"
    if problem is not None:
        raise CheckpointCorruptError(ckpt_dir, [name], [problem])
    return data


def _read_small(ckpt_dir: str, name: str, size: int) -> Tuple[Optional[str], bytes]:
    """(problem or None, bytes): a regular file inside ``ckpt_dir``, read only when its size is the index's
    ``size`` and at most :data:`.members.MAX_SMALL_FILE_BYTES`; one byte more is asked for, to notice growth."""
    problem, f, actual = _open(ckpt_dir, name)
    if problem:
        return problem, b""
    with f:
        if actual != size:
            return f"{name}: size {actual} != {size}", b""
        if size > MAX_SMALL_FILE_BYTES:
            return f"{name}: {size} bytes, more than a small checkpoint file can be ({MAX_SMALL_FILE_BYTES})", b""
        return None, read_exactly(f, size + 1)
