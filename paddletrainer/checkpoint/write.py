"""Writing a checkpoint's files: safetensors straight from the tensors' memory with their crc32 computed beside
the write, small files (JSON: trainer state, args, schedule, scaler, data position, model config) with their size and
crc32, each fsynced, and the directory fsync that makes a rename durable. The save (:mod:`.save`) decides what
is written where; the readers are in :mod:`.read`."""

from __future__ import annotations

import dataclasses
import json
import os
import struct
import threading
from typing import Dict, List, Optional

import numpy as np
import paddle

from . import placement as L
from .checksum import crc32, crc32_combine
from ..parallel.wrappers import unwrap_model


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
