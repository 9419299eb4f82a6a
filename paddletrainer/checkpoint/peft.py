"""PEFT models (PaddleNLP's ``paddlenlp.peft``): what their checkpoints and saved models hold.

A LoRA run trains a few adapter tensors on a frozen base the user builds (as in PaddleNLP, the base comes
from the model construction, never from a checkpoint), so:

* a checkpoint holds the trainable tensors (the adapters) and their optimizer states only; its index says
  ``"peft": {"type": "lora", ...}`` so that a load knows the base is not in it, and a model of another kind
  loading it gets a clear error (:func:`check_index_for_model`);
* ``Trainer.save_model`` writes what ``LoRAModel.from_pretrained(base, dir)`` reads (:func:`export_adapters`):
  ``lora_config.json``, the model's ``config.json`` and the adapters, merged over tensor-parallel ranks, as
  safetensors under PaddleNLP's PEFT index ``peft_model.safetensors.index.json`` (the loader's no-pickle path;
  it splits the merged tensors again for a tensor-parallel model);
* ``paddletrainer-merge-checkpoint --base-model DIR`` turns a LoRA checkpoint into a plain ``from_pretrained``
  directory: the base weights with ``W + scaling · A @ B`` (:func:`export_merged_lora`).

The other PEFT types PaddleNLP's Trainer special-cases (prefix tuning, VeRA, LoKr, ReFT) and LoRA variants whose
adapters are not ``A @ B`` on a fixed base (LoRA-GA, PiSSA, MoRA, the mixer) are refused by name
(:func:`peft_type`), before any process group exists. paddlenlp is never imported here: a model is told by
its class's module and name.
"""

from __future__ import annotations

import json
import math
import os
from typing import Dict, Optional

import numpy as np
from safetensors.numpy import save_file
from paddle.distributed.fleet.meta_parallel import PipelineLayer

from ..parallel.wrappers import unwrap_model
from . import placement as L
from .export import PADDLE_WEIGHTS_NAME, merged_model_state
from .read import MAX_SMALL_FILE_BYTES, map_safetensors, read_index, read_member, read_weight_map
from .restricted_pickle import load_pickle

__all__ = ["UnsupportedPeftModelError", "peft_type", "checkpoint_tensors", "index_entry", "check_index_for_model",
           "export_adapters", "export_merged_lora", "LORA_CONFIG_NAME", "SAFE_PEFT_WEIGHTS_INDEX_NAME"]

LORA_CONFIG_NAME = "lora_config.json"
SAFE_PEFT_WEIGHTS_INDEX_NAME = "peft_model.safetensors.index.json"  # PaddleNLP's name; its loader reads it
SAFE_PEFT_WEIGHTS_FILE = "peft_model-00001-of-00001.safetensors"  # PaddleNLP's single-file shard name
INDEX_KEY = "peft"
BASE_PREFIX = "model."  # LoRAModel keeps the base in ``.model``: its state_dict names start with this

# the safetensors dtypes of a base model that are read (no bfloat16: numpy cannot compute the merge in it)
_MERGED_DTYPES = ("F64", "F32", "F16", "I64", "I32", "I16", "I8", "U8", "BOOL")
_PEFT_MODULE = "paddlenlp.peft"
_REFUSED_TYPES = ("PrefixModelForCausalLM", "VeRAModel", "LoKrModel", "ReFTModel")
_REFUSED_LORA_OPTIONS = {  # LoRAConfig field: why its adapters are not A @ B trained on the user's base
    "loraga": "LoRA-GA re-initialises the base weights from gradients",
    "pissa": "PiSSA replaces the base weights by their residual",
    "use_mora": "MoRA's adapter is not A @ B",
    "lora_use_mixer": "the LoRA mixer adds a third matrix",
}


class UnsupportedPeftModelError(ValueError):
    """A ``paddlenlp.peft`` model type or LoRA option whose checkpoints paddletrainer cannot save correctly."""


def _peft_class_name(inner) -> Optional[str]:
    for cls in type(inner).__mro__:
        if cls.__module__.startswith(_PEFT_MODULE):
            return cls.__name__
    return None


def peft_type(model) -> Optional[str]:
    """``"lora"`` for a ``paddlenlp.peft.LoRAModel`` (inside Paddle's wrappers), None for a model that is no
    PEFT model. Raises :class:`UnsupportedPeftModelError` naming the type or option for the PEFT models whose
    saves would be wrong (see the module docstring)."""
    inner = unwrap_model(model)
    name = _peft_class_name(inner)
    if name is None:
        return None
    if name in _REFUSED_TYPES:
        raise UnsupportedPeftModelError(
            f"{name} (paddlenlp.peft) is not supported by paddletrainer: its checkpoints would carry the frozen base "
            "and save_model would not write what its from_pretrained reads; use LoRAModel or PaddleNLP's Trainer")
    if name != "LoRAModel":
        raise UnsupportedPeftModelError(f"{name} (paddlenlp.peft) is not supported by paddletrainer; use LoRAModel")
    if isinstance(getattr(inner, "model", None), PipelineLayer):
        raise UnsupportedPeftModelError(
            f"LoRAModel over the pipeline model {type(inner.model).__name__} is not supported by paddletrainer: its "
            "state_dict names are the pipeline stage's, not the plain model's, so its checkpoints and save_model "
            "would not load into another layout nor into LoRAModel.from_pretrained; use pipeline_parallel_degree=1 "
            "(tensor parallel is supported)")
    cfg = inner.lora_config
    for option, why in _REFUSED_LORA_OPTIONS.items():
        if getattr(cfg, option, False):
            raise UnsupportedPeftModelError(
                f"LoRAConfig({option}=True) is not supported by paddletrainer: {why}, which a checkpoint of the "
                f"adapters alone cannot restore; train with {option}=False")
    return "lora"


def checkpoint_tensors(model, models: Dict[str, object]) -> Dict[str, object]:
    """The model tensors a checkpoint holds (``models``: ``{model key: LocalTensor}`` of
    ``local_state.model_tensors``): for a PEFT model only its trainable ones, else all of them."""
    if peft_type(model) is None:
        return models
    trainable = {L.model_key(n) for n, t in unwrap_model(model).state_dict().items() if not t.stop_gradient}
    return {k: lt for k, lt in models.items() if k in trainable}


def index_entry(model) -> dict:
    """What the checkpoint index records about a PEFT model (``{}`` for any other): its type, its LoRA config
    and the base model's class (the ``architectures`` of an export)."""
    kind = peft_type(model)
    if kind is None:
        return {}
    inner = unwrap_model(model)
    return {INDEX_KEY: {"type": kind, "config": _lora_config_dict(inner.lora_config),
                        "base_architecture": type(inner.model).__name__}}


def _lora_config_dict(cfg) -> dict:
    """The LoRA config as PaddleNLP's ``LoRAConfig.save_pretrained`` writes ``lora_config.json`` (its fields and
    ``scaling``); a tensor-parallel run's adapters are saved merged, so its degree is reset to -1 as PaddleNLP's
    ``merge_tensor_parallel`` does."""
    d = dict(cfg.to_dict())
    d["scaling"] = cfg.scaling
    if (d.get("tensor_parallel_degree") or 1) > 1:
        d["tensor_parallel_degree"] = -1
    return d


def check_index_for_model(ckpt_dir: str, index: dict, model) -> None:
    """A PEFT checkpoint loads only into a PEFT model of its type, and a PEFT model only from one: else
    :class:`~.placement.CheckpointError` naming both."""
    saved = (index.get(INDEX_KEY) or {}).get("type")
    kind = peft_type(model)
    if saved == kind:
        return
    if saved is None:
        raise L.CheckpointError(
            f"{ckpt_dir} holds a whole model (not a {kind} checkpoint), and the {kind} model being loaded expects its "
            "adapters only: load it into the model it was saved from")
    raise L.CheckpointError(
        f"{ckpt_dir} is a {saved} checkpoint: it holds the {saved} adapters only, not the frozen base; load it into "
        f"the {saved} model of the same base (paddlenlp.peft), or merge it into a plain model with "
        "paddletrainer-merge-checkpoint --base-model <base dir>")


def _peft_state(ckpt_dir: str) -> Dict[str, tuple]:
    """``{LoRAModel.get_trainable_state_dict name: (array, dtype)}`` of a PEFT checkpoint (tp pieces merged)."""
    state = merged_model_state(ckpt_dir)
    return {name[len(BASE_PREFIX):] if name.startswith(BASE_PREFIX) else name: v for name, v in state.items()}


def _write_json(path: str, obj: dict) -> None:
    with open(path, "w") as f:
        json.dump(obj, f, indent=2, sort_keys=True)


def _read_config(model_dir: str) -> dict:
    """``model_dir``'s ``config.json`` as a dict: a regular file inside it, bounded, a JSON object."""
    path = os.path.join(model_dir, L.CONFIG_NAME)
    try:
        cfg = json.loads(read_member(model_dir, L.CONFIG_NAME, MAX_SMALL_FILE_BYTES, L.CONFIG_NAME))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise L.CheckpointError(f"{path}: not JSON ({str(e)[:200]})") from None
    if not isinstance(cfg, dict):
        raise L.CheckpointError(f"{path}: not a JSON object (a model config)")
    return cfg


def _config_json(ckpt_dir: str, out_dir: str, peft: dict) -> None:
    """The checkpoint's model config with the base model's class as its architecture (a LoRAModel forwards
    ``config`` to its base, but ``architectures`` must name the base class ``from_pretrained`` builds)."""
    src = os.path.join(ckpt_dir, L.CONFIG_NAME)
    if not os.path.isfile(src):
        return
    cfg = _read_config(ckpt_dir)
    if cfg.get("architectures") == ["LoRAModel"]:
        cfg["architectures"] = [peft["base_architecture"]]
    _write_json(os.path.join(out_dir, L.CONFIG_NAME), cfg)


def export_adapters(ckpt_dir: str, out_dir: str) -> str:
    """Write a LoRA checkpoint's adapters as ``LoRAModel.from_pretrained`` reads them; returns the weights path.

    ``out_dir`` gets ``lora_config.json``, ``config.json``, ``peft_model-00001-of-00001.safetensors`` (names as
    ``LoRAModel.get_trainable_state_dict``, full tensors) and ``peft_model.safetensors.index.json`` (PaddleNLP's
    single-card layout, ``"type": "lora"``). bfloat16 adapters are stored as their uint16 bits, as PaddleNLP's
    numpy safetensors are.
    """
    index = read_index(ckpt_dir)
    peft = index.get(INDEX_KEY)
    if not peft:
        raise L.CheckpointError(f"{ckpt_dir} is not a PEFT checkpoint (its index records no {INDEX_KEY!r})")
    state = _peft_state(ckpt_dir)
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, SAFE_PEFT_WEIGHTS_FILE)
    save_file({n: np.ascontiguousarray(a) for n, (a, _) in state.items()}, path, metadata={"format": "np"})
    total = sum(a.nbytes for a, _ in state.values())  # bfloat16 as uint16: 2 bytes, its size
    _write_json(os.path.join(out_dir, SAFE_PEFT_WEIGHTS_INDEX_NAME),
                {"metadata": {"total_size": total}, "weight_map": {n: SAFE_PEFT_WEIGHTS_FILE for n in sorted(state)},
                 "type": peft["type"]})
    _write_json(os.path.join(out_dir, LORA_CONFIG_NAME), peft["config"])
    _config_json(ckpt_dir, out_dir, peft)
    return path


def lora_scaling(cfg: dict) -> float:
    """``LoRALinear.scaling`` of a ``lora_config.json``: lora_alpha / r, or lora_alpha / sqrt(r) with rslora."""
    r, alpha = int(cfg["r"]), float(cfg["lora_alpha"])
    return alpha / math.sqrt(r) if cfg.get("rslora") else alpha / r


def merged_lora_weights(base: Dict[str, np.ndarray], adapters: Dict[str, np.ndarray], scaling: float,
                        ckpt_dir: str = "the checkpoint") -> Dict[str, np.ndarray]:
    """The base weights with LoRA merged: ``<m>.weight + scaling · <m>.lora_A @ <m>.lora_B`` for every adapted
    module ``m`` (PaddleNLP's ``LoRALinear.merge``, in the weight's dtype); any other trainable tensor of the
    checkpoint (``trainable_modules``, ``trainable_bias``) replaces the base tensor of its name."""
    out = dict(base)
    for name, value in adapters.items():
        if name.endswith(".lora_B"):
            continue
        if name.endswith(".lora_A"):
            module = name[: -len(".lora_A")]
            weight, b_name = module + ".weight", module + ".lora_B"
            if weight not in base or b_name not in adapters:
                raise L.CheckpointError(f"{ckpt_dir}: adapter {name} has no {b_name if weight in base else weight} "
                                        "in the checkpoint and base model")
            w = base[weight]
            out[weight] = (w + (value.astype(w.dtype) @ adapters[b_name].astype(w.dtype)) * w.dtype.type(scaling))
        elif ".lora_" in name:
            raise L.CheckpointError(f"{ckpt_dir}: {name} is not a LoRA A/B matrix; it cannot be merged")
        elif name not in base:
            raise L.CheckpointError(f"{ckpt_dir}: trainable tensor {name} is not a weight of the base model")
        else:
            out[name] = value
    return out


def read_base_weights(base_dir: str) -> Dict[str, np.ndarray]:
    """The weights of a ``from_pretrained`` directory: ``model.safetensors``, a sharded
    ``model.safetensors.index.json``, or ``model_state.pdparams`` (PaddleNLP's default; a pickle, read only
    because the user named this directory, through the allowlist unpickler of :mod:`.restricted_pickle`).
    Every file is read as a checkpoint's (:mod:`.read`): plain names inside ``base_dir``, regular files,
    headers and indexes checked before anything is sized from them."""
    try:
        files = sorted(set(read_weight_map(base_dir, L.HF_WEIGHTS_INDEX_NAME).values()))
    except FileNotFoundError:
        files = None
    if files is None and os.path.lexists(os.path.join(base_dir, "model.safetensors")):
        files = ["model.safetensors"]
    elif files is None and os.path.lexists(os.path.join(base_dir, PADDLE_WEIGHTS_NAME)):
        weights = load_pickle(os.path.join(base_dir, PADDLE_WEIGHTS_NAME), return_numpy=True)
        if not isinstance(weights, dict) or not all(isinstance(a, np.ndarray) for a in weights.values()):
            raise L.CheckpointError(f"{os.path.join(base_dir, PADDLE_WEIGHTS_NAME)}: not a state dict of arrays")
        return dict(weights)
    elif files is None:
        raise L.CheckpointError(f"--base-model {base_dir} has no model.safetensors, {L.HF_WEIGHTS_INDEX_NAME} or "
                                f"{PADDLE_WEIGHTS_NAME}: name the directory the base model was saved to")
    out: Dict[str, np.ndarray] = {}
    for name in files:
        try:
            mapped = map_safetensors(base_dir, name)
        except FileNotFoundError:
            raise L.CheckpointError(f"--base-model {base_dir}: {name} is missing (its index names it)") from None
        for key, meta in mapped.header.items():
            if meta["dtype"] not in _MERGED_DTYPES:
                raise L.CheckpointError(f"{os.path.join(base_dir, name)}: {key} has dtype {meta['dtype']}, which is not "
                                        f"read (valid: {', '.join(_MERGED_DTYPES)})")
            out[key] = mapped.get_tensor(key).copy()
    return out


def export_merged_lora(ckpt_dir: str, out_dir: str, base_dir: str, config_from: Optional[str] = None) -> str:
    """A LoRA checkpoint + its base model directory → a plain ``from_pretrained`` directory with LoRA merged
    (``model.safetensors`` and ``config.json``: from ``config_from``, else the base's, else the checkpoint's).
    Returns the weights path. bfloat16 weights are refused (numpy cannot compute in bfloat16)."""
    index = read_index(ckpt_dir)
    peft = index.get(INDEX_KEY)
    if not peft or peft.get("type") != "lora":
        raise L.CheckpointError(f"{ckpt_dir} is not a LoRA checkpoint: --base-model applies to LoRA checkpoints only")
    state = _peft_state(ckpt_dir)
    if any(dt == "bfloat16" for _, dt in state.values()):
        raise L.CheckpointError(f"{ckpt_dir}: bfloat16 adapters cannot be merged here (numpy has no bfloat16); "
                                "merge with PaddleNLP's LoRAModel.merge() on the model saved by save_model")
    merged = merged_lora_weights(read_base_weights(base_dir), {n: a for n, (a, _) in state.items()},
                                 lora_scaling(peft["config"]), ckpt_dir)
    if config_from and not os.path.isfile(os.path.join(config_from, L.CONFIG_NAME)):
        raise L.CheckpointError(f"--config-from {config_from} has no {L.CONFIG_NAME}")
    src = config_from or base_dir
    config = _read_config(src) if os.path.lexists(os.path.join(src, L.CONFIG_NAME)) else None
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "model.safetensors")
    save_file({n: np.ascontiguousarray(a) for n, a in merged.items()}, path, metadata={"format": "np"})
    if config is not None:
        _write_json(os.path.join(out_dir, L.CONFIG_NAME), config)
    else:
        _config_json(ckpt_dir, out_dir, peft)
    return path
