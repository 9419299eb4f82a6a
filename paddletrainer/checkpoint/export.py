"""Merge a sharded checkpoint into one directory PaddleNLP's ``from_pretrained`` loads.

Output: ``model.safetensors`` (float weights) or ``model_state.pdparams`` (chosen automatically when a
weight is bfloat16, which numpy-safetensors cannot label), plus ``config.json`` — the model config stored
in the checkpoint with tensor-parallel settings reset, or copied from ``config_from``. The optimizer is
not exported. The model's shard files are read once each, checksummed as they are read
(:mod:`.read`), and held in memory while the merged tensors are assembled: peak memory is about the
weights' size, plus one more copy of the tensors whose pieces are split over several files (tensor parallel,
stage-3 slices); a tensor stored whole is a view of its file's bytes.
A checkpoint whose weights are whole needs no export: it carries ``model.safetensors.index.json`` itself
(:func:`.layout.whole_weight_map`).
"""

from __future__ import annotations

import json
import os
import shutil
from typing import Dict, Optional

import numpy as np

from . import placement as L
from .reshard import read_placement
from .read import PieceReader, read_index, read_verified

SAFE_WEIGHTS_NAME = "model.safetensors"
PADDLE_WEIGHTS_NAME = "model_state.pdparams"


def merged_model_state(ckpt_dir: str, verify: bool = True) -> Dict[str, tuple]:
    """``{state_dict name: (full numpy array, dtype name)}`` of the model weights of a checkpoint.

    ``verify``: read each model file once, checking its size and crc32 against the index as it is read;
    ``False`` reads only the slices used, unchecked (safetensors' lazy reader)."""
    index = read_index(ckpt_dir)
    keys = sorted(k for k in index["tensors"] if k.startswith(L.MODEL_PREFIX))
    if verify:
        files = read_verified(ckpt_dir, index, sorted({p["file"] for k in keys for p in index["tensors"][k]["pieces"]}))
        open_file = files.__getitem__
    else:
        open_file = PieceReader(ckpt_dir)
    out = {}
    for key in keys:
        info = index["tensors"][key]
        arr = read_placement(index, key, L.replicated(info["shape"]), open_file)
        out[key[len(L.MODEL_PREFIX):]] = (arr, info["dtype"])
    return out


def export_for_from_pretrained(
    ckpt_dir: str, out_dir: str, config_from: Optional[str] = None, require_config: bool = True
) -> str:
    """Write the merged weights and config.json into ``out_dir``; returns the weights file path.

    ``require_config=False`` accepts a model without a config (a plain ``paddle.nn.Layer``): only the
    weights are written, loadable with ``set_state_dict``.
    """
    peft = read_index(ckpt_dir).get("peft")  # checkpoint.peft.INDEX_KEY (that module builds on this one)
    if peft:
        raise L.CheckpointError(
            f"{ckpt_dir} is a {peft['type']} checkpoint: it holds the adapters only, not the base model; merge it into "
            "its base with paddletrainer-merge-checkpoint --base-model <base dir> (checkpoint.peft.export_merged_lora)")
    state = merged_model_state(ckpt_dir)
    os.makedirs(out_dir, exist_ok=True)
    if any(dt == "bfloat16" for _, dt in state.values()):
        import paddle

        tensors = {}
        for name, (arr, dt) in state.items():
            t = paddle.to_tensor(arr, place=paddle.CPUPlace())  # merged on the host, never on a device
            tensors[name] = t.view(paddle.bfloat16) if dt == "bfloat16" else t
        path = os.path.join(out_dir, PADDLE_WEIGHTS_NAME)
        paddle.save(tensors, path)
    else:
        from safetensors.numpy import save_file

        path = os.path.join(out_dir, SAFE_WEIGHTS_NAME)
        save_file({n: np.ascontiguousarray(a) for n, (a, _) in state.items()}, path, metadata={"format": "np"})

    if config_from:
        src = os.path.join(config_from, L.CONFIG_NAME)
        if not os.path.isfile(src):
            raise FileNotFoundError(f"--config-from {config_from} has no {L.CONFIG_NAME}")
        shutil.copyfile(src, os.path.join(out_dir, L.CONFIG_NAME))
    elif os.path.isfile(os.path.join(ckpt_dir, L.CONFIG_NAME)):
        with open(os.path.join(ckpt_dir, L.CONFIG_NAME)) as f:
            cfg = json.load(f)
        with open(os.path.join(out_dir, L.CONFIG_NAME), "w") as f:
            json.dump(cfg, f, indent=2, sort_keys=True)
    elif require_config:
        raise FileNotFoundError(f"{ckpt_dir} stores no model config; pass config_from=<model dir>")
    return path
