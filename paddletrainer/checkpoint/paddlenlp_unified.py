"""Resume from a PaddleNLP 3.0.0b4 *unified* checkpoint (``--unified_checkpoint true``), in any layout.

PaddleNLP's unified format stores every tensor whole (tensor-parallel slices merged) in safetensors files named
by an index, whatever layout wrote it:

* ``model.safetensors.index.json`` → ``model-0000x-of-0000y.safetensors``: the model's ``state_dict`` under its
  structured names; for a ``paddlenlp.peft.LoRAModel`` ``peft_model.safetensors.index.json`` →
  ``peft_model-...safetensors`` instead, its trainable adapters only, named inside the base model (here, as in our
  own LoRA checkpoints, under the LoRAModel's names: ``model.`` + name; the optimizer's keys likewise);
* ``optimizer.safetensors.index.json`` → ``optimizer-...safetensors``: keys ``<structured name>/<state>_<n>``
  (``moment1_0``, ``beta1_pow_acc_0``, ...); its ``"master_weights": true`` says that
  ``master_weights.safetensors.index.json`` → ``master_weights-...safetensors`` holds the fp32 master weights
  under the structured names;
* ``trainer_state.json``, ``scheduler.pdparams`` and ``rng_state[_<world>].pth`` as in the non-unified format
  (:mod:`.paddlenlp_interop` reads those; the two ``.pdparams``/``.pth`` are pickles, read only by the allowlist
  unpickler and only for the directory the user named).

The safetensors are described here as a checkpoint index of our own format, each tensor one whole piece, so the
resharding reader (:mod:`.reshard`) gives every rank its slices: a unified checkpoint loads into any layout (one
process, data parallel, tensor parallel, sharding). The tensors' bytes are read straight from the files' data
sections (no pickles; bfloat16 as its bit pattern, as our own files).
"""
from __future__ import annotations

import os
import re
from typing import Dict, List, Optional, Tuple

from . import placement as L
from .load import LoadedCheckpoint
from .local_state import (MASTER_WEIGHT, dtype_name, ensure_accumulators, model_tensors, optimizer_tensors,
                          stepped_parameter_names, topology_info)
from .read import map_safetensors, read_weight_map
from .paddlenlp_interop import load_paddlenlp_extras
from .peft import BASE_PREFIX, checkpoint_tensors
from .reshard import MemoryFile, read_placement

__all__ = ["load_paddlenlp_unified_checkpoint", "unified_checkpoint_index", "UNIFIED_INDEX_NAMES"]

MODEL_INDEX = "model.safetensors.index.json"
PEFT_INDEX = "peft_model.safetensors.index.json"
OPTIMIZER_INDEX = "optimizer.safetensors.index.json"
MASTER_INDEX = "master_weights.safetensors.index.json"
UNIFIED_INDEX_NAMES = (MODEL_INDEX, PEFT_INDEX, OPTIMIZER_INDEX, MASTER_INDEX)

# the safetensors dtype tags read -> our dtype name (the bytes are viewed as read.SAFETENSORS_NP_DTYPES says)
_DTYPES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16", "I64": "int64", "I32": "int32",
           "I16": "int16", "I8": "int8", "U8": "uint8", "BOOL": "bool"}
_STATE_NUMBER = re.compile(r"_\d+$")  # PaddleNLP's "moment1_0": the accumulator's generated-name counter


def _weight_map(ckpt_dir: str, index_name: str) -> Optional[Dict[str, str]]:
    try:
        return read_weight_map(ckpt_dir, index_name)
    except FileNotFoundError:
        return None


def _our_key(index_name: str, name: str, prefix: str) -> str:
    """Our index key of the tensor ``name`` of ``index_name``; ``prefix`` ("model." for a LoRAModel's checkpoint,
    whose names are the base model's) comes before every parameter name."""
    if index_name in (MODEL_INDEX, PEFT_INDEX):
        return L.model_key(prefix + name)
    if index_name == MASTER_INDEX:
        return L.optim_key(prefix + name, MASTER_WEIGHT)
    param, sep, state = name.rpartition("/")
    if not sep:
        raise L.CheckpointError(f"{OPTIMIZER_INDEX}: optimizer key {name!r} is not '<parameter>/<state>'")
    return L.optim_key(prefix + param, _STATE_NUMBER.sub("", state))


def unified_checkpoint_index(ckpt_dir: str) -> Tuple[dict, Dict[str, MemoryFile]]:
    """Our checkpoint index (``{"tensors": {key: {shape, dtype, pieces}}}``) for a PaddleNLP unified checkpoint,
    every tensor one whole piece of the file its index names, and the files (memory-mapped)."""
    tensors: Dict[str, dict] = {}
    files: Dict[str, MemoryFile] = {}
    prefix = BASE_PREFIX if os.path.isfile(os.path.join(ckpt_dir, PEFT_INDEX)) else ""
    for index_name in UNIFIED_INDEX_NAMES:
        for name, file in sorted((_weight_map(ckpt_dir, index_name) or {}).items()):
            if file not in files:
                try:
                    files[file] = map_safetensors(ckpt_dir, file)
                except FileNotFoundError:
                    raise L.CheckpointError(f"{ckpt_dir}: {index_name} names {file}, which is missing") from None
            entry = files[file].header.get(name)
            if entry is None:
                raise L.CheckpointError(f"{ckpt_dir}: {index_name} puts {name} in {file}, which does not hold it")
            if entry.get("dtype") not in _DTYPES:
                raise L.CheckpointError(f"{ckpt_dir}/{file}: {name} has dtype {entry.get('dtype')}, which is not read "
                                        f"(valid: {', '.join(_DTYPES)})")
            shape = list(entry["shape"])
            tensors[_our_key(index_name, name, prefix)] = {
                "shape": shape, "dtype": _DTYPES[entry["dtype"]],
                "pieces": [{"file": file, "key": name, "offsets": [0] * len(shape), "shape": shape}]}
    if not any(k.startswith(L.MODEL_PREFIX) for k in tensors):
        raise L.CheckpointError(f"{ckpt_dir} is a PaddleNLP unified checkpoint without model weights (neither "
                                f"{MODEL_INDEX} nor, for a LoRAModel, {PEFT_INDEX} names any tensor: saved with "
                                "unified_checkpoint_config=skip_save_model_weight?); it cannot be resumed")
    return {"tensors": tensors}, files


def _number_kind(dtype: str) -> str:
    return "float" if "float" in dtype else ("bool" if dtype == "bool" else "integer")


def _kind_problems(index: dict, expected: Dict[str, Tuple[tuple, str]]) -> List[str]:
    """Tensors whose file dtype is another kind of number than the model's (loading casts float32 to bfloat16,
    but integer bits read as floats, or the reverse, would be nonsense loaded without a word)."""
    stored = index["tensors"]
    return [f"dtype mismatch: {key} is {stored[key]['dtype']} in the checkpoint but {dtype} in the model"
            for key, (_, dtype) in sorted(expected.items())
            if key in stored and _number_kind(stored[key]["dtype"]) != _number_kind(dtype)]


def _optimizer_targets(ckpt_dir, index, optimizer, models, by_param, warnings: List[str]):
    """This rank's optimizer tensors to fill, and the mismatches against the checkpoint."""
    if not any(k.startswith(L.OPTIM_PREFIX) for k in index["tensors"]):
        warnings.append(f"{ckpt_dir} holds no optimizer state ({OPTIMIZER_INDEX} missing)")
        return {}, []
    ensure_accumulators(optimizer)
    optims = optimizer_tensors(optimizer, by_param)
    # This run keeps fp32 master weights (fp16/bf16 O2) that the checkpoint lacks (an fp32 run): they start from
    # the loaded weights, as a fresh multi-precision optimizer starts from the model, never from the weights the
    # model had before the load (ensure_accumulators made them from those).
    for key in [k for k in optims if k.endswith("/" + MASTER_WEIGHT) and k not in index["tensors"]]:
        weight = L.model_key(L.split_optim_key(key)[0])
        if weight in index["tensors"]:
            index["tensors"][key] = index["tensors"][weight]
    expected = {k: (lt.placement.global_shape, dtype_name(lt.tensor)) for k, lt in optims.items()}
    problems = L.compare_to_index(index, expected, complete_model=False, prefix=L.OPTIM_PREFIX)
    problems += _kind_problems(index, expected)
    unplaced = L.unplaced_optimizer_states(index, stepped_parameter_names(optimizer, by_param, models), optims)
    if unplaced:
        shown = ", ".join(unplaced[:8]) + (" ..." if len(unplaced) > 8 else "")
        warnings.append(f"{len(unplaced)} optimizer state(s) of the PaddleNLP checkpoint have no tensor to go to on "
                        f"this rank and are not restored: {shown}")
    return optims, problems


def load_paddlenlp_unified_checkpoint(ckpt_dir: str, *, model, optimizer=None, lr_scheduler=None, scaler=None,
                                      topology=None, load_rng: bool = True) -> LoadedCheckpoint:
    """Load a PaddleNLP unified checkpoint into this rank's slices of ``model`` (and ``optimizer``, then
    ``lr_scheduler``, ``scaler``, trainer state, RNG as :func:`.paddlenlp_interop.load_paddlenlp_checkpoint`);
    the same keywords and result as :func:`paddletrainer.checkpoint.load_checkpoint`, in any layout.

    Raises :class:`~.placement.CheckpointMismatchError` listing every name/shape that does not fit the model.
    """
    topo = topology_info(topology)
    index, files = unified_checkpoint_index(ckpt_dir)
    warnings: List[str] = []
    models, by_param = model_tensors(model, topo)
    saved = checkpoint_tensors(model, models)  # a LoRAModel: its adapters only (the base is the user's)
    targets = dict(saved)
    expected = {k: (lt.placement.global_shape, dtype_name(lt.tensor)) for k, lt in saved.items()}
    problems = L.compare_to_index(index, expected, complete_model=topo.pp_degree == 1)
    problems += _kind_problems(index, expected)
    optimizer_restored = False
    if optimizer is not None:
        optims, optim_problems = _optimizer_targets(ckpt_dir, index, optimizer, models, by_param, warnings)
        problems += optim_problems
        targets.update(optims)
        optimizer_restored = bool(optims)
    if problems:
        raise L.CheckpointMismatchError([f"{ckpt_dir} (PaddleNLP unified): {p}" for p in problems])
    for key, lt in targets.items():
        lt.assign(read_placement(index, key, lt.placement, files.__getitem__), index["tensors"][key]["dtype"])
    trainer_state, rng_restored = load_paddlenlp_extras(ckpt_dir, lr_scheduler=lr_scheduler, scaler=scaler,
                                                        topology=topology, load_rng=load_rng)
    return LoadedCheckpoint(trainer_state=trainer_state, data_state=None, rng_restored=rng_restored,
                            optimizer_restored=optimizer_restored, warnings=warnings)
