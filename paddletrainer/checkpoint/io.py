"""Save this rank's shards, publish atomically, load into any layout.

Save (every rank calls it at the same point; it is collective):

1. finish the previous async save (collective publish, see below);
2. rank 0 removes stale ``checkpoint-*.tmp-*`` dirs (crashed saves) and broadcasts a fresh id: all ranks
   write into ``checkpoint-N.tmp-<id>/``;
3. all_gather of each rank's *candidate pieces* (metadata only) → :func:`layout.assign_writers` picks the
   lowest rank for every distinct piece, so replicas (dp, tp-replicated norms, tied weights) are written once;
4. host snapshot (numpy copies) of the assigned tensors, synchronously — training may continue after this;
5. write the files (now, or in the background thread when ``async_save``), recording size + crc32;
6. publish: all_gather of the file records; rank 0 writes ``checkpoint_index.json``, then the marker
   ``.checkpoint_complete`` LAST, fsyncs, renames ``tmp → checkpoint-N`` and rotates; a barrier ends it.

With ``async_save`` step 6 runs in :func:`finish_pending_save`, which the next ``save_checkpoint`` calls
first and which the trainer must call at the end of training. Every rank reaches those two points in the
same order (they are in the training loop, not in the writer thread), so the collectives of step 6 always
pair up; the writer thread itself never communicates.

A crash anywhere before the rename leaves only a tmp dir (ignored by readers: no marker, wrong name) and
the previous ``checkpoint-*`` untouched.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
import time
import uuid
import zlib
from typing import Any, Dict, List, Optional

import numpy as np
import paddle
from safetensors.numpy import save as st_save

from . import layout as L
from . import rng as rng_mod
from .async_writer import AsyncWriter
from .local_state import (
    dtype_name,
    ensure_accumulators,
    layout_dict,
    model_tensors,
    optimizer_tensors,
    topology_info,
    unwrap_model,
)
from .reshard import PieceReader, read_placement, verify_files

_writer = AsyncWriter()
_pending: Optional[dict] = None  # what finish_pending_save needs to publish the in-flight save


# ----------------------------------------------------------------------------------- collectives
def _multi(topo) -> bool:
    return topo.world_size > 1


def _all_gather_object(obj, topo) -> list:
    if not _multi(topo):
        return [obj]
    out: list = []
    paddle.distributed.all_gather_object(out, obj)
    return out


def _broadcast_from_0(obj, topo):
    return _all_gather_object(obj, topo)[0]


def _barrier(topo) -> None:
    if _multi(topo):
        paddle.distributed.barrier()


# ------------------------------------------------------------------------------------ small files
def _jsonable(x):
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, paddle.Tensor):
        x = x.numpy()
    if isinstance(x, np.ndarray):
        return {"__ndarray__": x.tolist(), "dtype": str(x.dtype)}
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, (str, int, float, bool)) or x is None:
        return x
    return str(x)


def _from_json(x):
    if isinstance(x, dict):
        if "__ndarray__" in x:
            return np.asarray(x["__ndarray__"], dtype=x["dtype"])
        return {k: _from_json(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_from_json(v) for v in x]
    return x


def _json_bytes(obj) -> bytes:
    return json.dumps(_jsonable(obj), indent=2, sort_keys=True).encode()


def _args_json(args) -> Optional[bytes]:
    if args is None:
        return None
    if hasattr(args, "to_json_string"):
        return args.to_json_string().encode()
    if dataclasses.is_dataclass(args):
        return _json_bytes(dataclasses.asdict(args))
    return _json_bytes(vars(args))


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


def _write_file(path: str, data: bytes) -> Dict[str, int]:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    return {"size": len(data), "crc32": zlib.crc32(data)}


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# ------------------------------------------------------------------------------------------ save
def save_checkpoint(
    ckpt_dir: str,
    *,
    model,
    optimizer=None,
    lr_scheduler=None,
    scaler=None,
    trainer_state: Optional[dict] = None,
    args=None,
    data_state: Optional[dict] = None,
    topology=None,
    save_rng: bool = True,
    async_save: bool = False,
    save_total_limit: Optional[int] = None,
    best_checkpoint: Optional[str] = None,
) -> str:
    """Save everything needed to resume into ``ckpt_dir`` (``.../checkpoint-N``); collective.

    Returns ``ckpt_dir``. With ``async_save`` it returns once the host snapshot is taken; the directory
    appears at the next :func:`finish_pending_save` (called by the next save, and by the trainer at the end).
    ``save_total_limit``/``best_checkpoint`` rotate the parent directory after publishing.
    ``data_state`` is the layout-free data position, e.g. ``{"consumed_samples": n}``.
    """
    finish_pending_save()
    topo = topology_info(topology)
    ckpt_dir = os.path.abspath(ckpt_dir)
    parent = os.path.dirname(ckpt_dir)
    t0 = time.perf_counter()

    # 2. one tmp dir for all ranks; stale ones (crashed saves) go first, before anyone writes
    uid = None
    if topo.rank == 0:
        os.makedirs(parent, exist_ok=True)
        _remove_stale_tmp_dirs(parent)
        uid = f"{int(time.time())}-{uuid.uuid4().hex[:8]}"
    uid = _broadcast_from_0(uid, topo)
    tmp_dir = ckpt_dir + L.TMP_INFIX + uid

    # 3. candidates -> writers (metadata only crosses the wire)
    models, by_param = model_tensors(model, topo)
    optims = optimizer_tensors(optimizer, by_param) if optimizer is not None else {}
    local = {**models, **optims}
    mine = [
        L.PieceEntry(k, dtype_name(lt.tensor), lt.placement, topo.rank, "optimizer" if k.startswith(L.OPTIM_PREFIX) else "model")
        for k, lt in local.items()
    ]
    coords = (topo.tp_rank, topo.pp_rank, topo.sharding_rank, topo.dp_rank)
    gathered = _all_gather_object((coords, mine), topo)
    assigned = L.assign_writers([g[1] for g in gathered])
    files = L.file_names_for_writers([g[0] for g in gathered], assigned)
    assigned = [[dataclasses.replace(e, file=files[r][e.file]) for e in ents] for r, ents in enumerate(assigned)]

    # 4. host snapshot of what this rank writes
    blobs: Dict[str, Dict[str, np.ndarray]] = {}
    for e in assigned[topo.rank]:
        blobs.setdefault(e.file, {})[e.key] = local[e.key].host_copy()
    small: Dict[str, bytes] = {}
    if save_rng:
        coord_name = L.rank_coords(topo.dp_rank, topo.sharding_rank, topo.tp_rank, topo.pp_rank)
        small[L.rng_file_name(coord_name)] = rng_mod.dumps(rng_mod.capture_rng_state())
    if topo.rank == 0:
        small[L.TRAINER_STATE_NAME] = _json_bytes(trainer_state or {})
        if args is not None:
            small[L.TRAINING_ARGS_NAME] = _args_json(args)
        if lr_scheduler is not None:
            small[L.SCHEDULER_NAME] = _json_bytes(lr_scheduler.state_dict())
        if scaler is not None:
            small[L.SCALER_NAME] = _json_bytes(scaler.state_dict())
        if data_state is not None:
            small[L.DATA_STATE_NAME] = _json_bytes(data_state)
        cfg = model_config_dict(model)
        if cfg is not None:
            small[L.CONFIG_NAME] = _json_bytes(cfg)
    snapshot_s = time.perf_counter() - t0

    # 5. write (this rank's files only; metadata of what everybody wrote is kept for publishing)
    def write() -> Dict[str, Dict[str, int]]:
        os.makedirs(tmp_dir, exist_ok=True)
        records = {}
        for fname in sorted(blobs):
            data = st_save(blobs[fname], metadata={"format": "np"})
            records[fname] = _write_file(os.path.join(tmp_dir, fname), data)
        for fname, data in small.items():
            records[fname] = _write_file(os.path.join(tmp_dir, fname), data)
        return records

    global _pending
    _pending = {
        "topo": topo, "tmp_dir": tmp_dir, "ckpt_dir": ckpt_dir, "pieces": [e for ents in assigned for e in ents],
        "index_extra": {
            "layout": layout_dict(topo),
            "rng_files": save_rng,
            "timing": {"snapshot_s": round(snapshot_s, 4)},
        },
        "save_total_limit": save_total_limit, "best_checkpoint": best_checkpoint, "t0": t0,
    }
    if async_save:
        _writer.submit(write)
    else:
        _writer.submit(write)
        finish_pending_save()
    return ckpt_dir


def finish_pending_save() -> Optional[str]:
    """Wait for the in-flight write and publish it (collective; a no-op when nothing is pending)."""
    global _pending
    if _pending is None:
        return None
    p, _pending = _pending, None
    topo = p["topo"]
    records = _writer.wait()
    all_records = _all_gather_object(records, topo)
    if topo.rank == 0:
        files: Dict[str, Dict[str, int]] = {}
        for r in all_records:
            files.update(r)
        extra = dict(p["index_extra"])
        extra["timing"]["total_s"] = round(time.perf_counter() - p["t0"], 4)
        index = L.build_index(p["pieces"], files, extra.pop("layout"), extra)
        _publish(p["tmp_dir"], p["ckpt_dir"], index)
        if p["save_total_limit"]:
            rotate_checkpoints(os.path.dirname(p["ckpt_dir"]), p["save_total_limit"], p["best_checkpoint"])
    _barrier(topo)  # nobody resumes/loads/rotates before the directory exists under its final name
    return p["ckpt_dir"]


def _publish(tmp_dir: str, ckpt_dir: str, index: dict) -> None:
    """Index, then the marker LAST, then an atomic rename; an old dir of the same step is replaced."""
    _write_file(os.path.join(tmp_dir, L.INDEX_NAME), json.dumps(index, indent=1).encode())
    _write_file(os.path.join(tmp_dir, L.CHECKPOINT_COMPLETE_MARKER), b"")
    _fsync_dir(tmp_dir)
    if os.path.exists(ckpt_dir):  # re-saving a step: move the old one aside first (rename is atomic)
        trash = ckpt_dir + L.TMP_INFIX + "replaced-" + uuid.uuid4().hex[:8]
        os.rename(ckpt_dir, trash)
        os.rename(tmp_dir, ckpt_dir)
        shutil.rmtree(trash, ignore_errors=True)
    else:
        os.rename(tmp_dir, ckpt_dir)
    _fsync_dir(os.path.dirname(ckpt_dir))


def _remove_stale_tmp_dirs(parent: str) -> None:
    for name in os.listdir(parent):
        if L.is_tmp_dir_name(name):
            shutil.rmtree(os.path.join(parent, name), ignore_errors=True)


# ----------------------------------------------------------------------------------- discovery
def is_complete_checkpoint(path: str) -> bool:
    return os.path.isfile(os.path.join(path, L.CHECKPOINT_COMPLETE_MARKER))


def list_complete_checkpoints(output_dir: str) -> List[str]:
    """Published, complete ``checkpoint-N`` dirs, oldest first (tmp dirs and marker-less dirs ignored)."""
    if not os.path.isdir(output_dir):
        return []
    found = []
    for name in os.listdir(output_dir):
        step = L.parse_checkpoint_step(name)
        path = os.path.join(output_dir, name)
        if step is not None and is_complete_checkpoint(path):
            found.append((step, path))
    return [p for _, p in sorted(found)]


def get_last_complete_checkpoint(output_dir: str) -> Optional[str]:
    ckpts = list_complete_checkpoints(output_dir)
    return ckpts[-1] if ckpts else None


def rotate_checkpoints(output_dir: str, save_total_limit: Optional[int], best_checkpoint: Optional[str] = None) -> List[str]:
    """Delete the oldest complete checkpoints beyond the limit; never the best nor the newest. Rank 0 only."""
    ckpts = list_complete_checkpoints(output_dir)
    steps = {L.parse_checkpoint_step(os.path.basename(p)): p for p in ckpts}
    best = L.parse_checkpoint_step(os.path.basename(os.path.normpath(best_checkpoint))) if best_checkpoint else None
    doomed = [steps[s] for s in L.select_checkpoints_to_delete(list(steps), save_total_limit, best)]
    for path in doomed:
        # drop the marker first: a half-deleted dir is then "incomplete", never mistaken for a checkpoint
        try:
            os.remove(os.path.join(path, L.CHECKPOINT_COMPLETE_MARKER))
        except FileNotFoundError:
            pass
        shutil.rmtree(path, ignore_errors=True)
    return doomed


# ------------------------------------------------------------------------------------------ load
@dataclasses.dataclass
class LoadedCheckpoint:
    """What :func:`load_checkpoint` restored besides tensors."""

    trainer_state: dict
    data_state: Optional[dict]
    rng_restored: bool
    optimizer_restored: bool
    warnings: List[str]


def read_index(ckpt_dir: str) -> dict:
    if not is_complete_checkpoint(ckpt_dir):
        raise L.CheckpointError(f"{ckpt_dir} is not a complete checkpoint (no {L.CHECKPOINT_COMPLETE_MARKER})")
    with open(os.path.join(ckpt_dir, L.INDEX_NAME)) as f:
        index = json.load(f)
    L.check_index(index)
    return index


def _read_small(ckpt_dir: str, index: dict, name: str):
    if name not in index["files"]:
        return None
    verify_files(ckpt_dir, index, [name])
    with open(os.path.join(ckpt_dir, name), "rb") as f:
        return f.read()


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
    their size and crc32. Raises :class:`~.layout.CheckpointMismatchError` listing every name/shape that
    does not fit, and :class:`~.layout.CheckpointCorruptError` naming bad files.
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
    optimizer_restored = False
    if optimizer is not None:
        if any(k.startswith(L.OPTIM_PREFIX) for k in index["tensors"]):
            ensure_accumulators(optimizer)
            optims = optimizer_tensors(optimizer, by_param)
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

    if lr_scheduler is not None:
        raw = _read_small(ckpt_dir, index, L.SCHEDULER_NAME)
        if raw is None:
            warnings.append("checkpoint has no LR scheduler state")
        else:
            lr_scheduler.set_state_dict(_from_json(json.loads(raw)))
    if scaler is not None:
        raw = _read_small(ckpt_dir, index, L.SCALER_NAME)
        state = _from_json(json.loads(raw)) if raw else {}
        if state:
            scaler.load_state_dict(state)
    raw = _read_small(ckpt_dir, index, L.TRAINER_STATE_NAME)
    trainer_state = json.loads(raw) if raw else {}
    raw = _read_small(ckpt_dir, index, L.DATA_STATE_NAME)
    data_state = json.loads(raw) if raw else None

    rng_restored = False
    if load_rng and index.get("rng_files"):
        if index.get("topology") == layout_dict(topo):
            name = L.rng_file_name(L.rank_coords(topo.dp_rank, topo.sharding_rank, topo.tp_rank, topo.pp_rank))
            rng_mod.restore_rng_state(rng_mod.loads(_read_small(ckpt_dir, index, name)))
            rng_restored = True
        else:
            warnings.append(
                f"RNG state skipped: saved with layout {index.get('topology')}, loading with {layout_dict(topo)}"
            )
    for w in warnings:
        logging.getLogger(__name__).warning(w)
    return LoadedCheckpoint(trainer_state, data_state, rng_restored, optimizer_restored, warnings)
