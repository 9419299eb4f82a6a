"""Opening the files of a checkpoint directory: plain names inside it, regular files only, sizes known before a
byte is read.

The names come from ``checkpoint_index.json``, which is data: a name like ``../../x`` or ``/etc/passwd``, or a
symlink pointing out of the directory, would read bytes from elsewhere; a symlink to ``/dev/zero`` would be read
until memory runs out, and opening a FIFO blocks until someone writes to it. So every file of a checkpoint is
opened here: the name must be one path component, its real path must lie in the checkpoint directory, it is
opened without blocking (a FIFO opens at once) and refused unless ``fstat`` says it is a regular file, whose size
the caller checks against the index (or a cap) before reading.

PaddleNLP's checkpoints (:mod:`.paddlenlp_unified`, :mod:`.paddlenlp_interop`) and a LoRA merge's base model
(:mod:`.peft`) are read by the same rule: their indexes (:func:`read_weight_map`, size-bounded, every file name
checked) and safetensors headers (:func:`open_safetensors`, every entry checked) come through here too.
"""

from __future__ import annotations

import json
import os
import stat
import struct
from typing import BinaryIO, Dict, Tuple

from ..errors import CheckpointError
from .validate import InvalidCheckpointFileError, plain_name_problem, safetensors_entries

MAX_INDEX_BYTES = 1 << 30  # an index describes tensors and files in a few hundred bytes each
MAX_SMALL_FILE_BYTES = 1 << 30  # JSON states (a long run's log_history) and RNG states stay far below
MAX_WEIGHT_MAP_BYTES = 64 << 20  # a PaddleNLP/Hugging Face index: ~100 bytes a tensor, room for 600k tensors
MAX_SAFETENSORS_HEADER = 100_000_000  # the safetensors library's own bound on a header


class CheckpointPathError(CheckpointError):
    """A checkpoint file name leaves the directory, or the file is not a regular file; ``path`` names it and
    ``problem`` is ``<file name>: <what is wrong>`` (the form :class:`~.layout.CheckpointCorruptError` lists)."""

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
