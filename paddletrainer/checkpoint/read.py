"""Reading a checkpoint: every file opened by one rule, every byte checksummed as it is read, small JSON files
verified and parsed (pickles refused). Paddle-free.

Opening (``member_path``/``open_member``/``read_member``): Opening the files of a checkpoint directory: plain names inside it, regular files only, sizes known before a
byte is read.

The names come from ``checkpoint_index.json``, which is data: a name like ``../../x`` or ``/etc/passwd``, or a
symlink pointing out of the directory, would read bytes from elsewhere; a symlink to ``/dev/zero`` would be read
until memory runs out, and opening a FIFO blocks until someone writes to it. So every file of a checkpoint is
opened here: the name must be one path component, its real path must lie in the checkpoint directory, it is
opened without blocking (a FIFO opens at once) and refused unless ``fstat`` says it is a regular file, whose size
the caller checks against the index (or a cap) before reading.

PaddleNLP's checkpoints (:mod:`.paddlenlp_unified`, :mod:`.paddlenlp_interop`) and a LoRA merge's base model
(:mod:`.peft`) are read by the same rule: their indexes (:func:`read_weight_map`, size-bounded, every file name
checked) and safetensors headers (:func:`open_safetensors`, every entry checked; :func:`map_safetensors` maps such a
file) come through here too.

Reading once: Read checkpoint files once: every byte is checksummed as it arrives, and lands where it is used.

A load used to checksum each file in one pass and read the tensors in a second one. Here each file is read
from start to end exactly once, in 16 MiB chunks:

* a tensor that fills a host tensor exactly (same layout as saved, same dtype) is read straight into that
  tensor's memory (``direct``); everything else goes into one host buffer per file, whose NumPy views
  the slice reads of :mod:`.reshard` then use (:class:`~.reshard.MemoryFile`) — no assembly copy for a piece stored
  whole;
* a second thread per file computes the crc32 of each chunk right after it is read (``read``/``readinto``
  release the GIL, so reading and checksumming overlap; :mod:`.checksum`), and files are read in parallel;
* a rank that needs only some tensors of a file (a replicated tensor another rank wrote) reads just those,
  each verified against its own crc32 in the index (``parts``, with the header's);
* sizes and crc32s are compared to the index before anything is returned; a bad file raises
  :class:`~.placement.CheckpointCorruptError` naming every bad file. The tensors being filled then hold
  partial data: the error ends the load, and nothing trains on them.

Only the safetensors layout is parsed (8-byte header length, JSON header, raw little-endian data); a file
that is not one (a planted pickle, say) is refused as corrupt, never handed to another loader.

Small files: :func:`read_index` (the index, checked field by field), :func:`read_small`/:func:`read_json` (a file the
index lists, its size and crc32 compared first), :func:`read_valid_json` (one of our JSON files, also checked by its
kind's schema: the one place a JSON document of ours is validated). Nothing here unpickles: a checkpoint is safetensors + JSON, and
:func:`read_json` refuses a pickle planted in place of a JSON file (:class:`UnsafeCheckpointFileError`) instead of
handing it to any loader.
"""

from __future__ import annotations

import json
import os
import stat
import struct
from concurrent.futures import ThreadPoolExecutor
from typing import BinaryIO, Dict, List, Optional, Set, Tuple

import numpy as np
from safetensors import safe_open

from ..errors import CheckpointError
from . import placement as L
from .checksum import crc32
from .reshard import MemoryFile
from .placement import HEADER_PART, CheckpointCorruptError
from .validate import (InvalidCheckpointFileError, plain_name_problem, safetensors_entries, validate_batch_args,
                       validate_data_state, validate_index, validate_scaler_state, validate_scheduler_state,
                       validate_trainer_state)

MAX_INDEX_BYTES = 1 << 30  # an index describes tensors and files in a few hundred bytes each
MAX_SMALL_FILE_BYTES = 1 << 30  # JSON states (a long run's log_history) and RNG states stay far below
MAX_WEIGHT_MAP_BYTES = 64 << 20  # a PaddleNLP/Hugging Face index: ~100 bytes a tensor, room for 600k tensors
MAX_SAFETENSORS_HEADER = 100_000_000  # the safetensors library's own bound on a header
# safetensors dtype code -> the numpy dtype its bytes are read as (bfloat16 as its uint16 bit pattern)
SAFETENSORS_NP_DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": np.uint16, "I64": np.int64,
                         "I32": np.int32, "I16": np.int16, "I8": np.int8, "U64": np.uint64, "U32": np.uint32,
                         "U16": np.uint16, "U8": np.uint8, "BOOL": np.bool_}


class CheckpointPathError(CheckpointError):
    """A checkpoint file name leaves the directory, or the file is not a regular file; ``path`` names it and
    ``problem`` is ``<file name>: <what is wrong>`` (the form :class:`~.placement.CheckpointCorruptError` lists)."""

    def __init__(self, ckpt_dir: str, name: str, what: str):
        self.path = os.path.join(ckpt_dir, str(name))
        self.problem = f"{name}: {what}"
        super().__init__(f"{self.path}: {what}")


_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def _kind(mode: int) -> str:
    return next((what for test, what in _KINDS if test(mode)), "not a regular file")


def member_path(ckpt_dir: str, name: str) -> str:
    """``ckpt_dir/name`` after checking that ``name`` is a plain file name and that the file (after symlinks)
    lies inside ``ckpt_dir``; raises :class:`CheckpointPathError`."""
    problem = plain_name_problem(name)
    if problem:
        raise CheckpointPathError(ckpt_dir, name, f"{name!r} {problem}")
    path = os.path.join(ckpt_dir, name)
    real, root = os.path.realpath(path), os.path.realpath(ckpt_dir)
    if real == root or os.path.commonpath([real, root]) != root:
        raise CheckpointPathError(ckpt_dir, name, f"is a symlink to {real}, outside the checkpoint directory "
                                                  "(checkpoint files must lie inside it)")
    return path


def open_member(ckpt_dir: str, name: str) -> Tuple[BinaryIO, int]:
    """``(unbuffered binary file, size)`` of regular file ``name`` of ``ckpt_dir`` (see :func:`member_path`).

    Raises :class:`CheckpointPathError` for anything but a regular file inside the directory, and
    ``FileNotFoundError`` when it does not exist. Never blocks: a FIFO is opened non-blocking and refused."""
    path = member_path(ckpt_dir, name)
    mode = os.stat(path).st_mode  # refuse devices before opening them (opening some has effects)
    if not stat.S_ISREG(mode):
        raise CheckpointPathError(ckpt_dir, name, f"is {_kind(mode)}, not a regular file")
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        st = os.fstat(fd)  # what was opened, in case the name changed since the stat
        if not stat.S_ISREG(st.st_mode):
            raise CheckpointPathError(ckpt_dir, name, f"is {_kind(st.st_mode)}, not a regular file")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb", buffering=0), st.st_size
    except BaseException:
        os.close(fd)
        raise


class PieceReader:
    """Opens each file of a checkpoint once (lazily) for slice reads (:func:`~.reshard.read_placement`'s
    ``open_file``): only a regular file inside the checkpoint (:func:`open_member`)."""

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


def read_exactly(f: BinaryIO, size: int) -> bytes:
    """The next ``size`` bytes of ``f``, and fewer only when the file ends early (the caller compares)."""
    buf = bytearray(size)
    view, got = memoryview(buf), 0
    while got < size:
        n = f.readinto(view[got:])
        if not n:
            break
        got += n
    return bytes(view[:got])


def read_member(ckpt_dir: str, name: str, max_size: int, what: str) -> bytes:
    """All bytes of regular file ``name`` of ``ckpt_dir`` whose size is at most ``max_size`` (checked before
    reading); ``what`` names the kind of file in the error. Raises :class:`CheckpointPathError`."""
    f, size = open_member(ckpt_dir, name)
    with f:
        if size > max_size:
            raise CheckpointPathError(ckpt_dir, name, f"is {size} bytes, more than a {what} can be ({max_size})")
        data = read_exactly(f, size)
    if len(data) != size:
        raise CheckpointPathError(ckpt_dir, name, f"shrank from {size} to {len(data)} bytes while being read")
    return data


def open_safetensors(ckpt_dir: str, file: str) -> Tuple[dict, int, BinaryIO]:
    """``(header, data offset, open file)`` of safetensors file ``file`` of ``ckpt_dir`` (:func:`open_member`):
    the header at most :data:`MAX_SAFETENSORS_HEADER` bytes and every entry checked (dtype, shape, offsets inside
    the file, no overlaps) before the caller sizes anything from it; ``__metadata__`` dropped. Raises
    :class:`~.errors.CheckpointError` naming the file (``FileNotFoundError`` when it does not exist)."""
    path = os.path.join(ckpt_dir, file)
    f, size = open_member(ckpt_dir, file)
    try:
        raw = read_exactly(f, 8)
        if len(raw) != 8:
            raise CheckpointError(f"{path}: not a safetensors file (shorter than its header length)")
        (n,) = struct.unpack("<Q", raw)
        if n > min(size - 8, MAX_SAFETENSORS_HEADER):
            raise CheckpointError(f"{path}: not a safetensors file (header length {n} past the end of the file "
                                  f"or above {MAX_SAFETENSORS_HEADER} bytes)")
        try:
            header, _ = safetensors_entries(read_exactly(f, n), size - 8 - n)
        except ValueError as e:
            raise CheckpointError(f"{path}: not a safetensors file ({e})") from None
    except BaseException:
        f.close()
        raise
    header.pop("__metadata__", None)
    return header, 8 + n, f


def map_safetensors(ckpt_dir: str, file: str) -> MemoryFile:
    """Safetensors file ``file`` of ``ckpt_dir`` (opened and its header checked by :func:`open_safetensors`) as a
    :class:`~.reshard.MemoryFile` of read-only views of the file's memory map: nothing is read until a view is
    (bfloat16 as its bit pattern). Raises as :func:`open_safetensors`."""
    header, data_start, f = open_safetensors(ckpt_dir, file)
    with f:
        mapped = np.memmap(f, dtype=np.uint8, mode="r")
    views = {}
    for key, entry in header.items():
        lo, hi = entry["data_offsets"]
        views[key] = mapped[data_start + lo: data_start + hi].view(SAFETENSORS_NP_DTYPES[entry["dtype"]]).reshape(
            entry["shape"])
    return MemoryFile(header, views)


def read_weight_map(ckpt_dir: str, index_name: str) -> Dict[str, str]:
    """The ``weight_map`` of a PaddleNLP/Hugging Face index ``index_name`` of ``ckpt_dir``: tensor name -> plain file
    name, from a regular file inside ``ckpt_dir`` of at most :data:`MAX_WEIGHT_MAP_BYTES`. Raises
    :class:`~.validate.InvalidCheckpointFileError` naming the file and field (``FileNotFoundError`` without it)."""
    path = os.path.join(ckpt_dir, index_name)
    raw = read_member(ckpt_dir, index_name, MAX_WEIGHT_MAP_BYTES, "checkpoint index")
    try:
        index = json.loads(raw)
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise InvalidCheckpointFileError(path, "", f"not JSON ({e})") from None
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict):
        raise InvalidCheckpointFileError(path, "weight_map", "missing or not an object of tensor name -> file name "
                                                             "(not a PaddleNLP checkpoint index)")
    for name, file in weight_map.items():
        problem = "is not a string" if not isinstance(file, str) else plain_name_problem(file)
        if problem:
            raise InvalidCheckpointFileError(path, f"weight_map.{name[:80]}", f"{_short(file)} {problem}; valid: the "
                                             "name of a file in the checkpoint directory")
    return weight_map


def _short(value) -> str:
    text = json.dumps(value)
    return text if len(text) <= 80 else text[:77] + "..."


# ----------------------------------------------------------------------------------- read once
CHUNK = 16 << 20
MAX_PARALLEL_FILES = 4


def _open(ckpt_dir: str, name: str):
    """(problem or None, file, size): only a regular file inside ``ckpt_dir`` (:func:`open_member`)."""
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
            dtype, shape = SAFETENSORS_NP_DTYPES[meta["dtype"]], tuple(meta["shape"])
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
            dtype, shape = SAFETENSORS_NP_DTYPES[meta["dtype"]], tuple(meta["shape"])
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
    ``size`` and at most :data:`MAX_SMALL_FILE_BYTES`; one byte more is asked for, to notice growth."""
    problem, f, actual = _open(ckpt_dir, name)
    if problem:
        return problem, b""
    with f:
        if actual != size:
            return f"{name}: size {actual} != {size}", b""
        if size > MAX_SMALL_FILE_BYTES:
            return f"{name}: {size} bytes, more than a small checkpoint file can be ({MAX_SMALL_FILE_BYTES})", b""
        return None, read_exactly(f, size + 1)


# ----------------------------------------------------------------------------------- small files
def from_json(x):
    if isinstance(x, dict):
        if "__ndarray__" in x:
            if np.dtype(x["dtype"]).kind not in "biuf":  # numbers only: an object array would hold anything
                raise L.CheckpointError(f"array of dtype {x['dtype']!r} in a checkpoint JSON file: only numbers are stored")
            return np.asarray(x["__ndarray__"], dtype=x["dtype"])
        return {k: from_json(v) for k, v in x.items()}
    if isinstance(x, list):
        return [from_json(v) for v in x]
    return x


def read_index(ckpt_dir: str) -> dict:
    """The checkpoint's index, read as a bounded regular file and checked field by field
    (:func:`.validate.validate_index`: file names are plain names inside the directory); raises
    :class:`~.placement.CheckpointError` naming the file."""
    if not os.path.isfile(os.path.join(ckpt_dir, L.CHECKPOINT_COMPLETE_MARKER)):
        raise L.CheckpointError(f"{ckpt_dir} is not a complete checkpoint (no {L.CHECKPOINT_COMPLETE_MARKER})")
    source = os.path.join(ckpt_dir, L.INDEX_NAME)
    try:
        raw = read_member(ckpt_dir, L.INDEX_NAME, MAX_INDEX_BYTES, "checkpoint index")
    except FileNotFoundError:
        raise L.CheckpointError(f"{source} is missing although {ckpt_dir} has its completion marker "
                                f"{L.CHECKPOINT_COMPLETE_MARKER}: the checkpoint is damaged; resume from another one") from None
    return _checked(_parse_json(raw, source), L.INDEX_NAME, source)


def read_small(ckpt_dir: str, index: dict, name: str):
    """The bytes of small file ``name``, read once and returned only if their size and crc32 match the index
    (:func:`read_small_file`); None when the index lacks it."""
    if name not in index["files"]:
        return None
    return read_small_file(ckpt_dir, index, name)


class UnsafeCheckpointFileError(L.CheckpointError):
    """A checkpoint file holds a pickle (which runs code when loaded): it is refused, never loaded."""


# the first byte of every pickle: PROTO (protocol >= 2) or, for protocols 0/1, MARK / EMPTY_LIST / EMPTY_DICT / GLOBAL
_PICKLE_FIRST_BYTES = (b"\x80", b"(", b"]", b"}", b"c")


def refuse_pickle(data: bytes, source: str) -> None:
    """Raise :class:`UnsafeCheckpointFileError` when ``data`` looks like a pickle (JSON starts otherwise)."""
    if data[:1] in _PICKLE_FIRST_BYTES:
        raise UnsafeCheckpointFileError(
            f"{source} is a pickle, not JSON: paddletrainer never unpickles checkpoint files (a pickle can run code "
            "when loaded); this file was not written by paddletrainer")


def read_json(ckpt_dir: str, index: dict, name: str):
    """Small JSON file ``name``, verified and parsed; None when the index lacks it. Never unpickles."""
    raw = read_small(ckpt_dir, index, name)
    if raw is None:
        return None
    return _parse_json(raw, os.path.join(ckpt_dir, name))


def read_valid_json(ckpt_dir: str, index: dict, name: str):
    """Our JSON file ``name`` (the schedule, the scaler, the trainer state, the data state, the batch fields of the
    training arguments), verified, parsed and checked field by field by its kind's schema (:mod:`.validate`) before
    anything uses it; None when the index lacks it."""
    doc = read_json(ckpt_dir, index, name)
    return None if doc is None else _checked(doc, name, os.path.join(ckpt_dir, name))


# every JSON document read from a checkpoint of ours passes one gate, its kind's schema, before anything uses it
_SCHEMAS = {L.INDEX_NAME: validate_index, L.SCHEDULER_NAME: validate_scheduler_state,
            L.SCALER_NAME: validate_scaler_state, L.TRAINER_STATE_NAME: validate_trainer_state,
            L.DATA_STATE_NAME: validate_data_state, L.TRAINING_ARGS_NAME: validate_batch_args}


def _checked(doc, name: str, source: str):
    return _SCHEMAS[name](doc, source)


def _parse_json(raw: bytes, source: str):
    refuse_pickle(raw, source)
    try:
        return json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise L.CheckpointError(f"{source} is not valid JSON ({type(e).__name__}: {e})") from None
