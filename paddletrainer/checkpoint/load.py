"""Load a checkpoint written in any layout into this rank's slices (no collectives)."""

from __future__ import annotations

import dataclasses
import logging
from typing import List, Optional

from . import layout as L
from . import rng as rng_mod
from .files import from_json, read_index, read_json, read_small
from .local_state import (dtype_name, ensure_accumulators, layout_dict, model_tensors, offload_master_weights,
                          optimizer_tensors, topology_info)
from .reshard import PieceReader, read_placement, verify_files


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
    error). Raises :class:`~.layout.CheckpointMismatchError` listing every name/shape that does not fit, and
    :class:`~.layout.CheckpointCorruptError` naming bad files.
    """
    topo = topology_info(topology)
    index = read_index(ckpt_dir)
    warnings: List[str] = []

    models, by_param = model_tensors(model, topo)
    targets = dict(models)
    problems = L.compare_to_index(
        index, {k: (lt.placement.global_shape, dtype_name(lt.tensor)) for k, lt in models.items()},
        complete_model=topo.pp_degree == 1,
    )
    # Sharding offload trains host master weights; one the checkpoint lacks (saved without offload, or
    # without optimizer state) starts from the loaded weight, as Paddle's offload starts from the model.
    masters = offload_master_weights(model, by_param)
    optimizer_restored = False
    if optimizer is not None:
        if any(k.startswith(L.OPTIM_PREFIX) for k in index["tensors"]):
            ensure_accumulators(optimizer)
            optims = optimizer_tensors(optimizer, by_param)
            optims.update({k: m for k, (m, _) in masters.items() if k in index["tensors"]})
            problems += L.compare_to_index(
                index, {k: (lt.placement.global_shape, dtype_name(lt.tensor)) for k, lt in optims.items()},
                complete_model=False, prefix=L.OPTIM_PREFIX,
            )
            targets.update(optims)
            optimizer_restored = True
        else:
            warnings.append("checkpoint has no optimizer state; the optimizer starts fresh")
    if problems:
        raise L.CheckpointMismatchError(problems)

    wanted = {k: lt.placement for k, lt in targets.items()}
    verify_files(ckpt_dir, index, L.files_for_reads(index, wanted))
    reader = PieceReader(ckpt_dir)
    try:
        for key, lt in targets.items():
            lt.assign(read_placement(index, key, lt.placement, reader), index["tensors"][key]["dtype"])
    finally:
        reader.close()
    for key, (master, mastered) in masters.items():
        if key not in targets:
            master.assign(mastered.host_array(copy=False), dtype_name(mastered.tensor))  # on the master's place

    if lr_scheduler is not None:
        raw = read_json(ckpt_dir, index, L.SCHEDULER_NAME)
        if raw is None:
            warnings.append("checkpoint has no LR scheduler state")
        else:
            lr_scheduler.set_state_dict(from_json(raw))
    if scaler is not None:
        raw = read_json(ckpt_dir, index, L.SCALER_NAME)
        state = from_json(raw) if raw else {}
        if state:
            scaler.load_state_dict(state)
    trainer_state = read_json(ckpt_dir, index, L.TRAINER_STATE_NAME) or {}
    data_state = read_json(ckpt_dir, index, L.DATA_STATE_NAME)

    rng_restored = False
    if load_rng and index.get("rng_files"):
        coords = L.rank_coords(topo.dp_rank, topo.sharding_rank, topo.tp_rank, topo.pp_rank)
        name = L.rng_file_name(coords)
        if index.get("topology") != layout_dict(topo):
            warnings.append(
                f"RNG state skipped: saved with layout {index.get('topology')}, loading with {layout_dict(topo)}"
            )
        elif name not in index["files"] and L.legacy_rng_file_name(coords) in index["files"]:
            # an older checkpoint of ours: its RNG state is a pickle, which is never loaded (it could run code)
            warnings.append(
                f"RNG state skipped: {L.legacy_rng_file_name(coords)} is a pickle (written by an older paddletrainer) "
                "and pickles are never loaded; training resumes with fresh random streams (dropout and other random "
                "ops differ from an uninterrupted run; weights, optimizer, schedule and data order are restored)"
            )
        else:
            raw = read_small(ckpt_dir, index, name)
            if raw is None:
                raise L.CheckpointError(f"{ckpt_dir}: the index lists RNG files but not {name}")
            rng_mod.restore_rng_state(rng_mod.loads(raw, source=f"{ckpt_dir}/{name}"))
            rng_restored = True
    for w in warnings:
        logging.getLogger(__name__).warning(w)
    return LoadedCheckpoint(trainer_state, data_state, rng_restored, optimizer_restored, warnings)
