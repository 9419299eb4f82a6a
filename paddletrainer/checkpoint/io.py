"""Save this rank's shards and publish them atomically (loading: :mod:`.load`).

Save (every rank calls it at the same point; it is collective):

1. finish the previous async save (collective publish, see below);
2. rank 0 removes stale ``checkpoint-*.tmp-*`` dirs (crashed saves) and broadcasts a fresh id: all ranks
   write into ``checkpoint-N.tmp-<id>/``;
3. all_gather of each rank's *candidate pieces* (metadata only) → :func:`layout.assign_writers` picks the
   lowest rank for every distinct piece, so replicas (dp, tp-replicated norms, tied weights) are written once;
4. host snapshot (numpy copies) of the assigned tensors, synchronously — training may continue after this;
5. write the files (now, or in the background thread when ``async_save``), recording size + crc32;
6. publish: all_gather of the file records; rank 0 writes ``model.safetensors.index.json`` when the weights
   are whole (:func:`layout.whole_weight_map`), ``checkpoint_index.json``, then the marker
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
import os
import shutil
import time
import uuid
from typing import Dict, Optional

import numpy as np
import paddle

from . import layout as L
from . import rng as rng_mod
from .async_writer import AsyncWriter
from .files import (
    args_json,
    fsync_dir,
    json_bytes,
    model_config_dict,
    remove_stale_tmp_dirs,
    rotate_checkpoints,
    write_file,
    write_safetensors,
)
from .local_state import (dtype_name, layout_dict, model_tensors, offload_master_weights, optimizer_tensors,
                          topology_info)

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
        remove_stale_tmp_dirs(parent)
        uid = f"{int(time.time())}-{uuid.uuid4().hex[:8]}"
    uid = _broadcast_from_0(uid, topo)
    tmp_dir = ckpt_dir + L.TMP_INFIX + uid

    # 3. candidates -> writers (metadata only crosses the wire)
    try:
        models, by_param = model_tensors(model, topo)
        optims = optimizer_tensors(optimizer, by_param) if optimizer is not None else {}
        if optimizer is not None:
            optims.update({k: master for k, (master, _) in offload_master_weights(model, by_param).items()})
        local = {**models, **optims}
        mine = [
            L.PieceEntry(k, dtype_name(lt.tensor), lt.placement, topo.rank,
                         "optimizer" if k.startswith(L.OPTIM_PREFIX) else "model")
            for k, lt in local.items()
        ]
    except Exception as e:  # still join the gather below, so the other ranks fail too instead of hanging
        mine, error = None, e
    else:
        error = None
    coords = (topo.tp_rank, topo.pp_rank, topo.sharding_rank, topo.dp_rank)
    gathered = _all_gather_object((coords, mine if error is None else f"{type(error).__name__}: {error}"), topo)
    _raise_if_any_failed(gathered, "describing its tensors", error)
    assigned = L.assign_writers([g[1] for g in gathered])
    files = L.file_names_for_writers([g[0] for g in gathered], assigned)
    assigned = [[dataclasses.replace(e, file=files[r][e.file]) for e in ents] for r, ents in enumerate(assigned)]

    # 4. host snapshot of what this rank writes
    blobs: Dict[str, Dict[str, np.ndarray]] = {}
    for e in assigned[topo.rank]:
        blobs.setdefault(e.file, {})[L.file_key(e.key)] = local[e.key].host_array(copy=async_save)
    small: Dict[str, bytes] = {}
    if save_rng:
        coord_name = L.rank_coords(topo.dp_rank, topo.sharding_rank, topo.tp_rank, topo.pp_rank)
        small[L.rng_file_name(coord_name)] = rng_mod.dumps(rng_mod.capture_rng_state())
    if topo.rank == 0:
        small[L.TRAINER_STATE_NAME] = json_bytes(trainer_state or {})
        if args is not None:
            small[L.TRAINING_ARGS_NAME] = args_json(args)
        if lr_scheduler is not None:
            small[L.SCHEDULER_NAME] = json_bytes(lr_scheduler.state_dict())
        if scaler is not None:
            small[L.SCALER_NAME] = json_bytes(scaler.state_dict())
        if data_state is not None:
            small[L.DATA_STATE_NAME] = json_bytes(data_state)
        cfg = model_config_dict(model)
        if cfg is not None:
            small[L.CONFIG_NAME] = json_bytes(cfg)
    snapshot_s = time.perf_counter() - t0

    # 5. write (this rank's files only; metadata of what everybody wrote is kept for publishing)
    def write() -> Dict[str, Dict[str, int]]:
        os.makedirs(tmp_dir, exist_ok=True)
        records = {}
        for fname in sorted(blobs):
            records[fname] = write_safetensors(os.path.join(tmp_dir, fname), blobs[fname])
        for fname, data in small.items():
            records[fname] = write_file(os.path.join(tmp_dir, fname), data)
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
    try:
        records, error = _writer.wait(), None
    except Exception as e:  # e.g. disk full on one rank: every rank must learn it at the same gather
        records, error = f"{type(e).__name__}: {e}", e
    all_records = _all_gather_object(records, topo)
    _raise_if_any_failed(list(zip(range(len(all_records)), all_records)), "writing its files", error)
    if topo.rank == 0:
        files: Dict[str, Dict[str, int]] = {}
        for r in all_records:
            files.update(r)
        extra = dict(p["index_extra"])
        extra["timing"]["total_s"] = round(time.perf_counter() - p["t0"], 4)
        index = L.build_index(p["pieces"], files, extra.pop("layout"), extra)
        _add_hf_weights_index(p["tmp_dir"], index)
        _publish(p["tmp_dir"], p["ckpt_dir"], index)
        if p["save_total_limit"]:
            rotate_checkpoints(os.path.dirname(p["ckpt_dir"]), p["save_total_limit"], p["best_checkpoint"])
    _barrier(topo)  # nobody resumes/loads/rotates before the directory exists under its final name
    return p["ckpt_dir"]


def _raise_if_any_failed(gathered, what: str, own_error) -> None:
    """Raise on every rank if any rank failed (its gathered payload is an error string)."""
    failed = [(r, g[1]) for r, g in enumerate(gathered) if isinstance(g[1], str)]
    if failed:
        msg = "; ".join(f"rank {r} failed {what}: {m}" for r, m in failed)
        raise L.CheckpointError(f"checkpoint save aborted, the previous checkpoint is intact ({msg})") from own_error


def _add_hf_weights_index(tmp_dir: str, index: dict) -> None:
    """Make a checkpoint with whole weights a PaddleNLP/HF sharded weights directory (rank 0, before publish).

    The model shard files already store the weights under their state_dict names, so the HF index only
    points ``from_pretrained`` at them (no second copy); it is checksummed like every other file.
    Otherwise (tensor parallel, stage-3 slices, bfloat16) there is none and the index says why.
    """
    weight_map, why_not = L.whole_weight_map(index)
    if weight_map is None:
        index["hf_weights_index"] = {"written": False, "reason": why_not}
        return
    data = json.dumps(L.hf_weights_index(index, weight_map), indent=2).encode()
    index["files"][L.HF_WEIGHTS_INDEX_NAME] = write_file(os.path.join(tmp_dir, L.HF_WEIGHTS_INDEX_NAME), data)
    index["hf_weights_index"] = {"written": True}


def _publish(tmp_dir: str, ckpt_dir: str, index: dict) -> None:
    """Index, then the marker LAST, then an atomic rename; an old dir of the same step is replaced."""
    write_file(os.path.join(tmp_dir, L.INDEX_NAME), json.dumps(index, indent=1).encode())
    write_file(os.path.join(tmp_dir, L.CHECKPOINT_COMPLETE_MARKER), b"")
    fsync_dir(tmp_dir)
    if os.path.exists(ckpt_dir):  # re-saving a step: move the old one aside first (rename is atomic)
        trash = ckpt_dir + L.TMP_INFIX + "replaced-" + uuid.uuid4().hex[:8]
        os.rename(ckpt_dir, trash)
        os.rename(tmp_dir, ckpt_dir)
        shutil.rmtree(trash, ignore_errors=True)
    else:
        os.rename(tmp_dir, ckpt_dir)
    fsync_dir(os.path.dirname(ckpt_dir))
