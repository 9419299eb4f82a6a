"""Convert one of our checkpoints (any layout) into a PaddleNLP 3.0.0b4 unified checkpoint its Trainer resumes.

The Trainer never writes PaddleNLP's unified files itself: our format is already layout-independent, and
``--unified_checkpoint true`` only warns (see :func:`paddletrainer.config.paddlenlp_options.parse_unified_checkpoint_options`).
This export is how a run continues under PaddleNLP's Trainer (``paddletrainer-export-paddlenlp-unified``,
:mod:`paddletrainer.tools.export_paddlenlp_unified`).

Written into ``out_dir`` (PaddleNLP's names, one file each): ``model-00001-of-00001.safetensors`` and
``model.safetensors.index.json``; ``optimizer-00001-of-00001.safetensors`` with ``<structured name>/<state>_0``
keys and ``optimizer.safetensors.index.json`` (``"master_weights"`` says whether
``master_weights-00001-of-00001.safetensors`` and its index hold fp32 master weights); ``scheduler.pdparams``
(``paddle.save`` of the scheduler state: numbers only); ``trainer_state.json`` (its ``consumed_samples`` from
our data state) and ``config.json``. No RNG state (PaddleNLP resumes without one), no ``training_args.bin``.
Every file of the source is checked against its index's size and crc32 as it is read; the tensors are merged
whole in memory (about the size of weights and optimizer state).
"""
from __future__ import annotations

import json
import os
import shutil
import struct
from typing import Dict, Tuple

import numpy as np

from . import placement as L
from .read import from_json, read_index, read_json, read_verified
from .reshard import read_placement

__all__ = ["export_paddlenlp_unified"]

_TAGS = {"float64": "F64", "float32": "F32", "float16": "F16", "bfloat16": "BF16", "int64": "I64", "int32": "I32",
         "int16": "I16", "int8": "I8", "uint8": "U8", "bool": "BOOL"}
# PaddleNLP 3.0.0b4's TrainerState fields: its load_from_json refuses any other key (ours adds skipped_steps)
_PADDLENLP_STATE_FIELDS = ("epoch", "global_step", "consumed_samples", "max_steps", "num_train_epochs", "total_flos",
                           "log_history", "best_metric", "best_model_checkpoint", "is_local_process_zero",
                           "is_world_process_zero", "trial_name", "trial_params")
_SHARD = "{stem}-00001-of-00001.safetensors"


def _write_safetensors(path: str, tensors: Dict[str, Tuple[np.ndarray, str]]) -> int:
    """A safetensors file labelled with our dtype names (bfloat16 as ``BF16``: numpy's writer cannot); its size."""
    header, offset, arrays = {"__metadata__": {"format": "np"}}, 0, []
    for name in sorted(tensors):
        arr, dtype = tensors[name]
        if dtype not in _TAGS:
            raise L.CheckpointError(f"{name}: dtype {dtype} has no safetensors label PaddleNLP reads")
        data = np.ascontiguousarray(arr).tobytes()
        header[name] = {"dtype": _TAGS[dtype], "shape": list(arr.shape), "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        arrays.append(data)
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the data section starts 8-byte aligned
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        for data in arrays:
            f.write(data)
    return offset


def _write_shard(out_dir: str, stem: str, index_name: str, tensors, **extra) -> None:
    file = _SHARD.format(stem=stem)
    total = _write_safetensors(os.path.join(out_dir, file), tensors)
    index = {"metadata": {"total_size": total}, "weight_map": {name: file for name in sorted(tensors)}, **extra}
    with open(os.path.join(out_dir, index_name), "w") as f:
        json.dump(index, f, indent=2)


def _merged(ckpt_dir: str, index: dict):
    """Model weights, optimizer states and master weights, whole, under PaddleNLP's unified keys."""
    names = sorted(index["tensors"])
    files = read_verified(ckpt_dir, index, sorted({p["file"] for k in names for p in index["tensors"][k]["pieces"]}))
    model, optim, master = {}, {}, {}
    for key in names:
        info = index["tensors"][key]
        value = (read_placement(index, key, L.replicated(info["shape"]), files.__getitem__), info["dtype"])
        if key.startswith(L.MODEL_PREFIX):
            model[key[len(L.MODEL_PREFIX):]] = value
            continue
        param, kind = L.split_optim_key(key)
        if kind == L.MASTER_WEIGHT:
            master[param] = value
        else:  # a fresh PaddleNLP process names each accumulator <parameter>_<state>_0
            optim[f"{param}/{kind}_0"] = value
    return model, optim, master


def export_paddlenlp_unified(ckpt_dir: str, out_dir: str) -> str:
    """Write the PaddleNLP unified checkpoint of our complete checkpoint ``ckpt_dir`` into ``out_dir`` (created;
    must not hold a checkpoint already). Returns ``out_dir``."""
    index = read_index(ckpt_dir)
    if os.path.isdir(out_dir) and os.listdir(out_dir):
        raise L.CheckpointError(f"{out_dir} is not empty: export into a new directory")
    model, optim, master = _merged(ckpt_dir, index)
    if not optim:
        raise L.CheckpointError(f"{ckpt_dir} holds no optimizer state (saved with ignore_save_lr_and_optim?): "
                                "PaddleNLP's Trainer could not resume it; merge_checkpoint.py exports its weights")
    os.makedirs(out_dir, exist_ok=True)
    _write_shard(out_dir, "model", "model.safetensors.index.json", model)
    _write_shard(out_dir, "optimizer", "optimizer.safetensors.index.json", optim, master_weights=bool(master))
    if master:
        _write_shard(out_dir, "master_weights", "master_weights.safetensors.index.json", master)
    scheduler = read_json(ckpt_dir, index, L.SCHEDULER_NAME)
    if scheduler is not None:
        import paddle  # PaddleNLP reads scheduler.pdparams with paddle.load: numbers only are written

        paddle.save(from_json(scheduler), os.path.join(out_dir, "scheduler.pdparams"))
    saved = read_json(ckpt_dir, index, L.TRAINER_STATE_NAME) or {}
    state = {k: v for k, v in saved.items() if k in _PADDLENLP_STATE_FIELDS}
    data_state = read_json(ckpt_dir, index, L.DATA_STATE_NAME) or {}
    if "consumed_samples" in data_state:
        state["consumed_samples"] = int(data_state["consumed_samples"])
    if os.path.isfile(os.path.join(ckpt_dir, L.CONFIG_NAME)):
        shutil.copyfile(os.path.join(ckpt_dir, L.CONFIG_NAME), os.path.join(out_dir, L.CONFIG_NAME))
    tmp = os.path.join(out_dir, L.TRAINER_STATE_NAME + ".tmp")
    with open(tmp, "w") as f:
        json.dump(state, f, indent=2, sort_keys=True)
    os.replace(tmp, os.path.join(out_dir, L.TRAINER_STATE_NAME))  # last: PaddleNLP's sign of a finished save
    return out_dir
