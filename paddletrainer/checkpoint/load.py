"""Load a checkpoint written in any layout into this rank's slices (no collectives)."""

from __future__ import annotations

import dataclasses
import logging
import os
import re
from typing import Dict, List, Optional, Tuple

import numpy as np

from . import placement as L
from . import peft
from . import rng as rng_mod
from . import validate as V
from .read import from_json, read_index, read_json, read_small, read_verified
from .local_state import (LocalTensor, dtype_name, ensure_accumulators, layout_dict, model_tensors,
                          offload_master_weights, optimizer_tensors, stepped_parameter_names, topology_info,
                          writable_host_view)
from .reshard import read_placement


@dataclasses.dataclass
class LoadedCheckpoint:
    """What :func:`load_checkpoint` restored besides tensors."""

    trainer_state: dict
    data_state: Optional[dict]
    rng_restored: bool
    optimizer_restored: bool
    warnings: List[str]


def load_checkpoint(
    ckpt_dir: str,
    *,
    model,
    optimizer=None,
    lr_scheduler=None,
    scaler=None,
    topology=None,
    load_rng: bool = True,
) -> LoadedCheckpoint:
    """Load a checkpoint written in any layout into this rank's model/optimizer slices.

    Needs no collectives: every rank reads the overlapping slices of the files it needs, after checking
    their size and crc32. Only safetensors and JSON are parsed; nothing is ever unpickled (an older
    checkpoint's pickled RNG state is skipped with a warning, a pickle in place of any other file is an
    error). Raises :class:`~.placement.CheckpointMismatchError` listing every name/shape that does not fit, and
    :class:`~.placement.CheckpointCorruptError` naming bad files.

    A corrupt checkpoint is detected while it is read, not before: bytes are read straight into the model's
    and optimizer's tensors and each file's crc32 is compared at its end, so after a
    ``CheckpointCorruptError`` those tensors hold a mix of loaded and previous values. Do not keep training or
    evaluating them (e.g. after ``load_best_model_at_end``): reload another checkpoint or rebuild the model.

    Optimizer states the checkpoint holds for parameters this rank's optimizer updates, but which have no
    local tensor to go to (another optimizer or precision than the checkpoint's), are not restored and are
    listed in a warning (``LoadedCheckpoint.warnings``).
    """
    topo = topology_info(topology)
    index = read_index(ckpt_dir)
    warnings: List[str] = []
    targets, masters, optimizer_restored = _plan_targets(ckpt_dir, index, model, optimizer, topo, warnings)
    _read_tensors(ckpt_dir, index, targets, masters)
    trainer_state, data_state = _restore_small_state(ckpt_dir, index, lr_scheduler, scaler, warnings)
    rng_restored = _restore_rng(ckpt_dir, index, topo, warnings) if load_rng else False
    for w in warnings:
        logging.getLogger(__name__).warning(w)
    return LoadedCheckpoint(trainer_state, data_state, rng_restored, optimizer_restored, warnings)


def _plan_targets(ckpt_dir: str, index: dict, model, optimizer, topo, warnings: List[str]):
    """Plan: this rank's tensors to fill (model, then optimizer states when the checkpoint holds them) checked
    against the index; raises :class:`~.placement.CheckpointMismatchError` listing every misfit. Returns
    ``(targets by key, offload master weights, optimizer_restored)``."""
    peft.check_index_for_model(ckpt_dir, index, model)
    models, by_param = model_tensors(model, topo)
    models = peft.checkpoint_tensors(model, models)  # a PEFT model: its adapters only, its base is the user's
    targets = dict(models)
    problems = L.compare_to_index(
        index, {k: (lt.placement.global_shape, dtype_name(lt.tensor)) for k, lt in models.items()},
        complete_model=topo.pp_degree == 1, elsewhere=other_ranks_expert(models, topo.layout.ep),
    )
    # Sharding offload trains host master weights; one the checkpoint lacks (saved without offload, or
    # without optimizer state) starts from the loaded weight, as Paddle's offload starts from the model.
    masters = offload_master_weights(model, by_param)
    optimizer_restored = False
    if optimizer is not None:
        if any(k.startswith(L.OPTIM_PREFIX) for k in index["tensors"]):
            problems += _optimizer_targets(index, optimizer, by_param, models, masters, targets, warnings)
            optimizer_restored = True
        else:
            warnings.append("checkpoint has no optimizer state; the optimizer starts fresh")
    if problems:
        raise L.CheckpointMismatchError(problems)
    return targets, masters, optimizer_restored


_EXPERT_KEY = re.compile(r"^(.*\.experts\.)(\d+)(\..*)$")


def other_ranks_expert(models: Dict[str, LocalTensor], ep: int):
    """A predicate: is a checkpoint key an expert another ep rank holds, in one of this rank's expert layers
    (expert parallel: each rank holds ``num_experts / ep`` experts, named by their global index;
    ``...experts.<g>.<rest>``)? Only global indices below ``num_experts`` count: a checkpoint of a model with
    more experts is a mismatch, never silently cut. None without expert parallel or expert parameters."""
    if ep == 1:
        return None
    held: Dict[tuple, set] = {}
    for key, lt in models.items():
        match = _EXPERT_KEY.match(key)
        if match and getattr(lt.tensor, "is_expert", False):
            held.setdefault((match.group(1), match.group(3)), set()).add(int(match.group(2)))
    if not held:
        return None

    def elsewhere(key: str) -> bool:
        match = _EXPERT_KEY.match(key)
        if not match or (match.group(1), match.group(3)) not in held:
            return False
        mine = held[(match.group(1), match.group(3))]
        return int(match.group(2)) < len(mine) * ep and int(match.group(2)) not in mine

    return elsewhere


def _optimizer_targets(index: dict, optimizer, by_param, models, masters, targets, warnings: List[str]) -> list:
    """Add the optimizer's states (and offload master weights the checkpoint holds) to ``targets``; returns the
    misfits against the index. States the checkpoint holds for parameters this optimizer updates but which have
    no local tensor to go to are listed in a warning."""
    ensure_accumulators(optimizer)
    optims = optimizer_tensors(optimizer, by_param)
    optims.update({k: m for k, (m, _) in masters.items() if k in index["tensors"]})
    problems = L.compare_to_index(
        index, {k: (lt.placement.global_shape, dtype_name(lt.tensor)) for k, lt in optims.items()},
        complete_model=False, prefix=L.OPTIM_PREFIX,
    )
    targets.update(optims)
    unplaced = L.unplaced_optimizer_states(index, stepped_parameter_names(optimizer, by_param, models), targets)
    if unplaced:
        warnings.append(
            f"{len(unplaced)} optimizer state(s) in the checkpoint have no tensor to go to on this rank "
            f"although its optimizer updates their parameters, and are not restored: "
            f"{', '.join(unplaced[:8])}{' ...' if len(unplaced) > 8 else ''} (a different optimizer or "
            "precision than the checkpoint's, or states this optimizer has not created)"
        )
    return problems


def _read_tensors(ckpt_dir: str, index: dict, targets: Dict[str, LocalTensor], masters: dict) -> None:
    """Read: the stored pieces overlapping each target, from files whose size and crc32 are verified; bytes go
    straight into the tensors a stored piece fills exactly, the rest is assembled or converted from the buffers.
    Offload master weights the checkpoint lacks start from their loaded weight."""
    wanted = {k: lt.placement for k, lt in targets.items()}
    direct, keep_alive = _direct_targets(index, targets)
    needed: Dict[str, set] = {}
    for key, target in wanted.items():
        for piece in L.pieces_for(index, key, target) if key in index["tensors"] else ():
            needed.setdefault(piece["file"], set()).add(L.stored_key(piece, key))
    files = read_verified(ckpt_dir, index, sorted(needed), direct, needed)
    for key, lt in targets.items():
        if key not in keep_alive:  # the rest: slices of the verified file buffers, assembled or converted
            lt.assign(read_placement(index, key, lt.placement, files.__getitem__), index["tensors"][key]["dtype"])
    del keep_alive
    for key, (master, mastered) in masters.items():
        if key not in targets:
            master.assign(mastered.host_array(copy=False), dtype_name(mastered.tensor))  # on the master's place


def _restore_small_state(ckpt_dir: str, index: dict, lr_scheduler, scaler, warnings: List[str]):
    """The schedule and the loss scaler restored in place; returns ``(trainer_state, data_state)`` (each JSON file
    checked by its schema)."""
    if lr_scheduler is not None:
        raw = _read_valid(ckpt_dir, index, L.SCHEDULER_NAME)
        if raw is None:
            warnings.append("checkpoint has no LR scheduler state")
        else:
            lr_scheduler.set_state_dict(from_json(raw))
    if scaler is not None:
        raw = _read_valid(ckpt_dir, index, L.SCALER_NAME)
        state = from_json(raw) if raw else {}
        if state:
            scaler.load_state_dict(state)
    return _read_valid(ckpt_dir, index, L.TRAINER_STATE_NAME) or {}, _read_valid(ckpt_dir, index, L.DATA_STATE_NAME)


def _restore_rng(ckpt_dir: str, index: dict, topo, warnings: List[str]) -> bool:
    """This rank's RNG state when the checkpoint has one for this layout; whether it was restored (a layout change
    or an older checkpoint's pickled RNG state: skipped with a warning)."""
    if not index.get("rng_files"):
        return False
    coords = topo.layout.cell_name(topo.coords)
    name = L.rng_file_name(coords)
    if index.get("topology") != layout_dict(topo):
        warnings.append(
            f"RNG state skipped: saved with layout {index.get('topology')}, loading with {layout_dict(topo)}"
        )
        return False
    if name not in index["files"] and L.legacy_rng_file_name(coords) in index["files"]:
        # an older checkpoint of ours: its RNG state is a pickle, which is never loaded (it could run code)
        warnings.append(
            f"RNG state skipped: {L.legacy_rng_file_name(coords)} is a pickle (written by an older paddletrainer) "
            "and pickles are never loaded; training resumes with fresh random streams (dropout and other random "
            "ops differ from an uninterrupted run; weights, optimizer, schedule and data order are restored)"
        )
        return False
    raw = read_small(ckpt_dir, index, name)
    if raw is None:
        raise L.CheckpointError(f"{ckpt_dir}: the index lists RNG files but not {name}")
    rng_mod.restore_rng_state(rng_mod.loads(raw, source=f"{ckpt_dir}/{name}"))
    return True


_VALIDATORS = {L.SCHEDULER_NAME: V.validate_scheduler_state, L.SCALER_NAME: V.validate_scaler_state,
               L.TRAINER_STATE_NAME: V.validate_trainer_state, L.DATA_STATE_NAME: V.validate_data_state}


def _read_valid(ckpt_dir: str, index: dict, name: str):
    """JSON file ``name`` (None when the index lacks it), every field checked by its kind's schema
    (:mod:`.validate`) before anything uses it."""
    doc = read_json(ckpt_dir, index, name)
    return None if doc is None else _VALIDATORS[name](doc, os.path.join(ckpt_dir, name))


def _direct_targets(index: dict, targets: Dict[str, LocalTensor]) -> Tuple[Dict[str, Dict[str, np.ndarray]], dict]:
    """``{file: {in-file key: the tensor's own memory}}`` for every target that one stored piece fills exactly
    (same box, same dtype, a dense host tensor without padding): those bytes are read straight into the
    tensor. Also returns the tensors by key, to keep them alive while their memory is written."""
    direct: Dict[str, Dict[str, np.ndarray]] = {}
    alive = {}
    for key, lt in targets.items():
        info, target = index["tensors"][key], lt.placement
        if target.flat is not None or info["dtype"] != dtype_name(lt.tensor) or lt.storage_numel != target.local_numel:
            continue
        whole = [p for p in info["pieces"] if not p.get("flat") and tuple(p["offsets"]) == tuple(target.offsets)
                 and tuple(p["shape"]) == tuple(target.shape)]
        view = writable_host_view(lt.tensor) if whole else None
        if view is None:
            continue
        direct.setdefault(whole[0]["file"], {})[L.stored_key(whole[0], key)] = view
        alive[key] = lt.tensor
    return direct, alive
