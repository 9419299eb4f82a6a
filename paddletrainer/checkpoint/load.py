"""Load a checkpoint written in any layout into this rank's slices (no collectives)."""

from __future__ import annotations

import dataclasses
import logging
import re
from typing import Dict, List, Optional

from . import placement as L
from . import peft
from . import rng as rng_mod
from .read import from_json, read_index, read_small, read_valid_json, read_verified
from .local_state import LocalTensor, RankTensors, direct_views, dtype_name, rank_tensors
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
    index = read_index(ckpt_dir)
    warnings: List[str] = []
    rank, plan, optimizer_restored = _plan_targets(ckpt_dir, index, model, optimizer, topology, warnings)
    rng_file, rng_skipped = _rng_file_to_restore(index, rank, plan) if load_rng else (None, None)
    documents = [name for name, wanted in ((L.SCHEDULER_NAME, lr_scheduler is not None),
                                           (L.SCALER_NAME, scaler is not None), (L.TRAINER_STATE_NAME, True),
                                           (L.DATA_STATE_NAME, True)) if wanted]
    docs, rng_raw = _read_into_targets(ckpt_dir, index, plan, rank, documents, rng_file)
    trainer_state, data_state = _restore_small_state(docs, lr_scheduler, scaler, warnings)
    warnings += [rng_skipped] if rng_skipped else []
    rng_restored = _restore_rng(ckpt_dir, rng_file, rng_raw) if rng_file else False
    for w in warnings:
        logging.getLogger(__name__).warning(w)
    return LoadedCheckpoint(trainer_state, data_state, rng_restored, optimizer_restored, warnings)


def _plan_targets(ckpt_dir: str, index: dict, model, optimizer, topology, warnings: List[str]):
    """Plan: this rank's tensors to fill (model, then optimizer states when the checkpoint holds them), gathered
    by :func:`~.local_state.rank_tensors` and checked against the index; raises
    :class:`~.placement.CheckpointMismatchError` listing every misfit. Returns ``(RankTensors, the
    placement.LoadPlan of what to read, optimizer_restored)``.
    Optimizer states the checkpoint holds for parameters this optimizer updates but which have no local tensor
    to go to are listed in a warning."""
    peft.check_index_for_model(ckpt_dir, index, model)
    restore_optimizer = optimizer is not None and any(k.startswith(L.OPTIM_PREFIX) for k in index["tensors"])
    if optimizer is not None and not restore_optimizer:
        warnings.append("checkpoint has no optimizer state; the optimizer starts fresh")
    # a PEFT model: its adapters only, its base is the user's
    rank = rank_tensors(model, optimizer if restore_optimizer else None, topology, index["tensors"],
                        peft.checkpoint_tensors)
    plan = L.plan_load(index, rank.model_targets, rank.optim_targets, complete_model=rank.topo.pp_degree == 1,
                       elsewhere=other_ranks_expert(rank.models, rank.topo.layout.ep),
                       stepped=rank.stepped if restore_optimizer else None,
                       rng_cell=rank.topo.layout.cell_name(rank.topo.coords))
    if plan.unplaced:
        warnings.append(
            f"{len(plan.unplaced)} optimizer state(s) in the checkpoint have no tensor to go to on this rank "
            f"although its optimizer updates their parameters, and are not restored: "
            f"{', '.join(plan.unplaced[:8])}{' ...' if len(plan.unplaced) > 8 else ''} (a different optimizer "
            "or precision than the checkpoint's, or states this optimizer has not created)"
        )
    if plan.problems:
        raise L.CheckpointMismatchError(plan.problems)
    return rank, plan, restore_optimizer


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


def _read(ckpt_dir: str, index: dict, plan: L.LoadPlan, direct: dict, documents: List[str],
          rng_file: Optional[str]):
    """Everything the load reads besides the index, in one place: the stored pieces overlapping the targets
    (``plan.needed``) from files whose size and crc32 are verified, bytes read straight into the tensors of
    ``direct``; the JSON ``documents`` (each checked by its schema, :func:`~.read.read_valid_json`; the schedule's
    and the scaler's arrays decoded); the RNG file's verified bytes. Returns ``(files, {name: document or None},
    rng bytes or None)``."""
    files = read_verified(ckpt_dir, index, sorted(plan.needed), direct, plan.needed)
    docs = {}
    for name in documents:
        doc = read_valid_json(ckpt_dir, index, name)
        # the schedule's and the scaler's arrays are stored as JSON objects: decoded here
        docs[name] = from_json(doc) if doc and name in (L.SCHEDULER_NAME, L.SCALER_NAME) else doc
    return files, docs, (read_small(ckpt_dir, index, rng_file) if rng_file else None)


def _read_into_targets(ckpt_dir: str, index: dict, plan: L.LoadPlan, rank: RankTensors, documents: List[str],
                       rng_file: Optional[str]):
    """Fill this rank's targets from the checkpoint (:func:`_read`): bytes straight into the tensors a stored piece
    fills exactly (``plan.whole``), the rest slices of the verified file buffers, assembled or converted. Offload
    master weights the checkpoint lacks start from their loaded weight, as Paddle's offload starts from the model.
    Returns ``(the documents read, the RNG bytes or None)``."""
    targets = {**rank.models, **rank.optims}
    direct, keep_alive = direct_views(plan.whole, targets)
    files, docs, rng_raw = _read(ckpt_dir, index, plan, direct, documents, rng_file)
    for key, lt in targets.items():
        if key not in keep_alive:
            lt.assign(read_placement(index, key, lt.placement, files.__getitem__), index["tensors"][key]["dtype"])
    del keep_alive
    for key, (master, mastered) in rank.masters.items():
        if key not in targets:
            master.assign(mastered.host_array(copy=False), dtype_name(mastered.tensor))  # on the master's place
    return docs, rng_raw


def _restore_small_state(docs: dict, lr_scheduler, scaler, warnings: List[str]):
    """The schedule and the loss scaler restored in place from their read documents; returns ``(trainer_state,
    data_state)``."""
    if lr_scheduler is not None:
        if docs[L.SCHEDULER_NAME] is None:
            warnings.append("checkpoint has no LR scheduler state")
        else:
            lr_scheduler.set_state_dict(docs[L.SCHEDULER_NAME])
    if scaler is not None:
        state = docs[L.SCALER_NAME] or {}
        if state:
            scaler.load_state_dict(state)
    return docs[L.TRAINER_STATE_NAME] or {}, docs[L.DATA_STATE_NAME]


def _rng_file_to_restore(index: dict, rank: RankTensors, plan: L.LoadPlan):
    """``(this rank's RNG file to restore or None, the warning why it is skipped or None)``: only when the
    checkpoint has one for this layout (a layout change or an older checkpoint's pickled RNG state: skipped)."""
    if not index.get("rng_files"):
        return None, None
    name, legacy = plan.rng_files
    if index.get("topology") != rank.layout:
        return None, f"RNG state skipped: saved with layout {index.get('topology')}, loading with {rank.layout}"
    if name not in index["files"] and legacy in index["files"]:
        # an older checkpoint of ours: its RNG state is a pickle, which is never loaded (it could run code)
        return None, (
            f"RNG state skipped: {legacy} is a pickle (written by an older paddletrainer) "
            "and pickles are never loaded; training resumes with fresh random streams (dropout and other random "
            "ops differ from an uninterrupted run; weights, optimizer, schedule and data order are restored)"
        )
    return name, None


def _restore_rng(ckpt_dir: str, name: str, raw: Optional[bytes]) -> bool:
    """This rank's RNG state restored from its file's verified bytes (``raw``, None when the index lacks it)."""
    if raw is None:
        raise L.CheckpointError(f"{ckpt_dir}: the index lists RNG files but not {name}")
    rng_mod.restore_rng_state(rng_mod.loads(raw, source=f"{ckpt_dir}/{name}"))
    return True
