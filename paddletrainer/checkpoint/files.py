"""Files of a checkpoint directory other than tensor shards: small JSON files written with size + crc32,
directory discovery (only marked ``checkpoint-N`` dirs count), rotation, stale tmp dirs and the index reader.

Nothing here unpickles: a checkpoint is safetensors + JSON, and :func:`read_json` refuses a pickle planted in
place of a JSON file (:class:`UnsafeCheckpointFileError`) instead of handing it to any loader."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import shutil
import stat
import struct
import threading
import time
import uuid
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import paddle

from .output_lock import describe, live_holder
from ..trainer_utils import is_empty_dir, is_our_checkpoint, sorted_checkpoints
from . import layout as L
from .checksum import crc32, crc32_combine
from .local_state import unwrap_model
from .members import MAX_INDEX_BYTES, CheckpointPathError, member_path, read_member
from .validate import validate_index
from .verified_read import read_small_file

logger = logging.getLogger(__name__)


# ------------------------------------------------------------------------------------ small files
def jsonable(x):
    if isinstance(x, dict):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    if isinstance(x, paddle.Tensor):
        x = x.numpy()
    if isinstance(x, np.ndarray):
        return {"__ndarray__": x.tolist(), "dtype": str(x.dtype)}
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, (str, int, float, bool)) or x is None:
        return x
    return str(x)


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


def json_bytes(obj) -> bytes:
    return json.dumps(jsonable(obj), indent=2, sort_keys=True).encode()


def args_json(args) -> Optional[bytes]:
    if args is None:
        return None
    if hasattr(args, "to_json_string"):
        return args.to_json_string().encode()
    if dataclasses.is_dataclass(args):
        return json_bytes(dataclasses.asdict(args))
    return json_bytes(vars(args))


def model_config_dict(model) -> Optional[dict]:
    """The model's PaddleNLP config as a single-process config (tp degree/rank reset) for export."""
    cfg = getattr(unwrap_model(model), "config", None)
    if cfg is None or not hasattr(cfg, "to_dict"):
        return None
    d = cfg.to_dict()
    if not d.get("architectures"):  # set by save_pretrained only; from_pretrained's Auto classes need it
        arch = type(unwrap_model(model)).__name__
        d["architectures"] = [arch[: -len("Pipe")] if arch.endswith("Pipe") else arch]
    for k, v in (("tensor_parallel_degree", 1), ("tensor_parallel_rank", 0), ("tensor_parallel_output", True)):
        if k in d:
            d[k] = v
    return d


def write_file(path: str, data: bytes) -> Dict[str, int]:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    return {"size": len(data), "crc32": crc32(data)}


# safetensors dtype codes (https://github.com/huggingface/safetensors, "Format"); bfloat16 arrives as uint16 bits
_SAFETENSORS_DTYPES = {
    np.dtype(np.float64): "F64", np.dtype(np.float32): "F32", np.dtype(np.float16): "F16",
    np.dtype(np.int64): "I64", np.dtype(np.int32): "I32", np.dtype(np.int16): "I16", np.dtype(np.int8): "I8",
    np.dtype(np.uint64): "U64", np.dtype(np.uint32): "U32", np.dtype(np.uint16): "U16", np.dtype(np.uint8): "U8",
    np.dtype(np.bool_): "BOOL",
}


_CRC_STEP = 16 << 20


def write_safetensors(path: str, arrays: Dict[str, np.ndarray]) -> Dict[str, int]:
    """Write ``arrays`` as one safetensors file straight from their memory; return its size and crc32, and
    ``parts``: the crc32 of the header (``layout.HEADER_PART``) and of each array's bytes, so that a reader that
    needs a few arrays of the file verifies just those.

    The file is the format's 8-byte little-endian header length, the JSON header (padded with spaces to a
    multiple of 8 bytes) and every array's bytes in header order. The crc32 is computed from the same
    buffers in a second thread while this one writes them (large ``write`` calls release the GIL; the crc
    runs in 16 MiB steps, so it never holds the GIL long), so the file is never read back.
    """
    header: Dict[str, object] = {"__metadata__": {"format": "np"}}
    chunks: List[memoryview] = []
    offset = 0
    for name in sorted(arrays):
        arr = np.require(arrays[name], requirements="C")  # (not ascontiguousarray: it makes 0-d arrays 1-d)
        if arr.dtype.byteorder == ">":
            arr = arr.astype(arr.dtype.newbyteorder("<"))
        code = _SAFETENSORS_DTYPES.get(arr.dtype)
        if code is None:
            raise L.CheckpointError(f"cannot store {name}: dtype {arr.dtype} has no safetensors code")
        header[name] = {"dtype": code, "shape": list(arr.shape), "data_offsets": [offset, offset + arr.nbytes]}
        chunks.append(memoryview(arr.reshape(-1)).cast("B"))
        offset += arr.nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    chunks.insert(0, memoryview(struct.pack("<Q", len(text)) + text))

    checksum: Dict[str, object] = {}

    def crc_of_chunks():
        try:
            crc, parts = 0, []
            for chunk in chunks:  # each byte is read once: the file's crc is combined from its parts'
                part = 0
                for lo in range(0, chunk.nbytes, _CRC_STEP):
                    part = crc32(chunk[lo: lo + _CRC_STEP], part)
                parts.append(part)
                crc = crc32_combine(crc, part, chunk.nbytes)
            checksum["crc32"], checksum["parts"] = crc, parts
        except BaseException as e:  # noqa: BLE001 - re-raised in the writing thread
            checksum["error"] = e

    worker = threading.Thread(target=crc_of_chunks, name="paddletrainer-crc32", daemon=True)
    worker.start()
    try:
        with open(path, "wb") as f:
            for chunk in chunks:
                f.write(chunk)
            f.flush()
            os.fsync(f.fileno())
    finally:
        worker.join()
    if "error" in checksum:
        raise checksum["error"]
    parts = dict(zip([L.HEADER_PART] + sorted(arrays), checksum["parts"]))
    return {"size": sum(c.nbytes for c in chunks), "crc32": checksum["crc32"], "parts": parts}


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def foreign_entries(path: str) -> List[str]:
    """The entries of directory ``path`` that our writer never puts in a checkpoint: names that are not ours
    (:func:`~.layout.is_our_file_name`), subdirectories, symlinks, anything but a regular file; sorted."""
    with os.scandir(path) as entries:
        return sorted(e.name for e in entries if not (e.is_file(follow_symlinks=False) and L.is_our_file_name(e.name)))


def is_our_staging_dir(path: str) -> bool:
    """Whether ``path`` (named ``checkpoint-N.tmp-*``) holds only what our writer leaves there: a real directory
    whose entries are all regular files with our file names (an unfinished save: no marker yet, or a checkpoint
    of ours moved aside to be replaced or rotated away). A user's file in it, a subdirectory or a symlink makes it
    not ours: it is then never removed."""
    if os.path.islink(path) or not os.path.isdir(path):
        return False
    return not foreign_entries(path)


def remove_stale_tmp_dirs(parent: str) -> List[str]:
    """Remove the ``checkpoint-N.tmp-*`` dirs of crashed saves in ``parent``; returns the removed paths.

    Only staging dirs of ours (:func:`is_our_staging_dir`) go; anything else with such a name is left alone with
    a warning. Nothing is removed while another live run holds ``parent``'s lock (:mod:`paddletrainer.checkpoint.output_lock`):
    its tmp dir is the save it is writing."""
    holder = live_holder(parent)
    if holder is not None:
        logger.warning("not removing stale checkpoint tmp dirs in %s: another run holds its lock (%s)", parent,
                       holder.get("unreadable") or describe(holder))
        return []
    removed = []
    for name in sorted(os.listdir(parent)):
        if not L.is_tmp_dir_name(name):
            continue
        path = os.path.join(parent, name)
        if is_our_staging_dir(path):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
        else:
            logger.warning("left %s in place: it is named like a checkpoint tmp dir but holds files paddletrainer "
                           "does not write (or is not a directory); paddletrainer never deletes what it did not write",
                           path)
    return removed


# ----------------------------------------------------------------------------------- discovery
def is_complete_checkpoint(path: str) -> bool:
    return os.path.isfile(os.path.join(path, L.CHECKPOINT_COMPLETE_MARKER))


# Discovery of published checkpoints lives in trainer_utils (the Trainer's get_last_checkpoint uses it too).
list_complete_checkpoints = sorted_checkpoints


def get_last_complete_checkpoint(folder: str) -> Optional[str]:
    """The newest complete checkpoint *of ours* in ``folder`` (never a PaddleNLP directory), or None."""
    found = sorted_checkpoints(folder)
    return found[-1] if found else None


def checkpoint_problem(ckpt_dir: str) -> Optional[str]:
    """Why ``ckpt_dir`` (a complete checkpoint of ours) cannot be loaded, found without reading its tensors, or
    None: its index must parse and every file it lists must be a regular file inside the directory (no symlink
    out of it: loading refuses those) with the listed size. (Checksums are compared
    while a load reads the files; this check is what every rank can run alike before choosing one.)"""
    try:
        index = read_index(ckpt_dir)
        records = index["files"].items()
        expected = {name: int(record["size"]) for name, record in records}
    except (OSError, ValueError, TypeError, KeyError, AttributeError, L.CheckpointError) as e:
        return f"its {L.INDEX_NAME} is unreadable ({type(e).__name__}: {e})"
    for name, size in sorted(expected.items()):
        try:
            st = os.stat(member_path(ckpt_dir, name))  # a symlink out of the directory is refused by every load
        except CheckpointPathError as e:
            return e.problem
        except OSError:
            return f"{name} is missing"
        if not stat.S_ISREG(st.st_mode):
            return f"{name} is not a regular file"
        if st.st_size != size:
            return f"{name} has {st.st_size} bytes, its index says {size}"
    return None


def newest_sound_checkpoint(folder: str, before: Optional[int] = None) -> Tuple[Optional[str], List[Tuple[str, str]]]:
    """The newest complete checkpoint of ours in ``folder`` that passes :func:`checkpoint_problem` (or None), and
    the newer ones passed over, each with its problem. ``before``: only checkpoints of lower steps count."""
    skipped: List[Tuple[str, str]] = []
    for path in reversed(sorted_checkpoints(folder)):
        if before is not None and L.parse_checkpoint_step(os.path.basename(path)) >= before:
            continue
        problem = checkpoint_problem(path)
        if problem is None:
            return path, skipped
        skipped.append((path, problem))
    return None, skipped


DAMAGED_INFIX = ".damaged-"


def set_aside_damaged(ckpt_dir: str) -> Optional[str]:
    """Rename damaged checkpoint ``ckpt_dir`` of ours to ``checkpoint-N.damaged-<unix time>`` (nothing reads,
    rotates or removes that name) and return the new path; None when the rename failed (logged). Rank 0 only.

    Left under its name, a damaged newest checkpoint would be passed over by every restart and collide with the
    save of its step; it is kept, not deleted: it may be repaired. Left under its name (None) when it is not
    wholly ours: not a checkpoint of ours (marker and index), or holding an entry our writer never makes."""
    target = f"{ckpt_dir}{DAMAGED_INFIX}{int(time.time())}"
    try:
        if not is_our_checkpoint(ckpt_dir) or foreign_entries(ckpt_dir):
            return None  # not ours to rename
        os.rename(ckpt_dir, target)
    except OSError as e:
        logger.warning("could not move the damaged checkpoint %s aside to %s (%s)", ckpt_dir, target, e)
        return None
    return target


def rotate_checkpoints(output_dir: str, save_total_limit: Optional[int], best_checkpoint: Optional[str] = None,
                       keep: Sequence[str] = ()) -> List[str]:
    """Delete the oldest checkpoints beyond the limit; never the best, the newest sound one, nor those in ``keep``
    (a save keeps the one it just published). Rank 0 only. Returns the deleted paths.

    Counted are the *sound* checkpoints of ours (:func:`~paddletrainer.trainer_utils.is_our_checkpoint`: marker and
    index; and no :func:`checkpoint_problem`) and the *empty* ``checkpoint-N`` directories (PaddleNLP/HF count
    every directory of that name; an empty one holds nothing that is not ours, and ``os.rmdir`` removes it only
    while it is still empty). A damaged checkpoint is neither counted nor deleted: counted, a damaged newest one
    would be protected while the sound ones it outnumbers were deleted. A PaddleNLP checkpoint or a user's
    non-empty ``checkpoint-*`` entry is neither counted nor touched, and a checkpoint of ours holding an entry our
    writer never makes (:func:`foreign_entries`) is left with a warning naming them."""
    sound = [p for p in list_complete_checkpoints(output_dir) if is_our_checkpoint(p) and checkpoint_problem(p) is None]
    empty = _empty_checkpoint_dirs(output_dir)
    steps = {L.parse_checkpoint_step(os.path.basename(p)): p for p in sound + empty}
    protected = [L.parse_checkpoint_step(os.path.basename(os.path.normpath(p))) for p in keep if p]
    if sound:
        protected.append(L.parse_checkpoint_step(os.path.basename(sound[-1])))
    best = L.parse_checkpoint_step(os.path.basename(os.path.normpath(best_checkpoint))) if best_checkpoint else None
    doomed = [steps[s] for s in L.select_checkpoints_to_delete(list(steps), save_total_limit, best, keep=protected)]
    deleted = []
    for path in doomed:
        if path in empty:
            with contextlib.suppress(OSError):  # gone, or no longer empty: then it is not ours to delete
                os.rmdir(path)
                deleted.append(path)
            continue
        if _delete_checkpoint_of_ours(path):
            deleted.append(path)
    return deleted


def _delete_checkpoint_of_ours(path: str) -> bool:
    """Delete checkpoint ``path`` of ours unless it holds an entry our writer never makes (then warn, keep it)."""
    try:
        extra = foreign_entries(path)
    except FileNotFoundError:
        return False
    if extra:
        logger.warning("save_total_limit: not deleting %s: it holds entries paddletrainer does not write (%s); "
                       "paddletrainer never deletes what it did not write: move them out, then delete it yourself",
                       path, ", ".join(extra))
        return False
    # rename to a tmp name first (atomic): a kill mid-delete leaves a tmp dir, which no reader takes for a
    # checkpoint and the next save or train() start removes, never a half-deleted ``checkpoint-N``
    trash = path + L.TMP_INFIX + "deleted-" + uuid.uuid4().hex[:8]
    try:
        os.rename(path, trash)
    except FileNotFoundError:
        return False
    if is_our_staging_dir(trash):  # nothing was added between the check and the rename
        shutil.rmtree(trash, ignore_errors=True)
    return True


def _empty_checkpoint_dirs(output_dir: str) -> List[str]:
    if not os.path.isdir(output_dir):
        return []
    paths = (os.path.join(output_dir, n) for n in os.listdir(output_dir) if L.parse_checkpoint_step(n) is not None)
    return [p for p in paths if is_empty_dir(p)]


def read_index(ckpt_dir: str) -> dict:
    """The checkpoint's index, read as a bounded regular file and checked field by field
    (:func:`.validate.validate_index`: file names are plain names inside the directory); raises
    :class:`~.layout.CheckpointError` naming the file."""
    if not is_complete_checkpoint(ckpt_dir):
        raise L.CheckpointError(f"{ckpt_dir} is not a complete checkpoint (no {L.CHECKPOINT_COMPLETE_MARKER})")
    source = os.path.join(ckpt_dir, L.INDEX_NAME)
    try:
        raw = read_member(ckpt_dir, L.INDEX_NAME, MAX_INDEX_BYTES, "checkpoint index")
    except FileNotFoundError:
        raise L.CheckpointError(f"{source} is missing although {ckpt_dir} has its completion marker "
                                f"{L.CHECKPOINT_COMPLETE_MARKER}: the checkpoint is damaged; resume from another one") from None
    return validate_index(_parse_json(raw, source), source)


def read_small(ckpt_dir: str, index: dict, name: str):
    """The bytes of small file ``name``, read once and returned only if their size and crc32 match the index
    (:func:`.verified_read.read_small_file`); None when the index lacks it."""
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


def _parse_json(raw: bytes, source: str):
    refuse_pickle(raw, source)
    try:
        return json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise L.CheckpointError(f"{source} is not valid JSON ({type(e).__name__}: {e})") from None
