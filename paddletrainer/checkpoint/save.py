"""Save this rank's shards and publish them atomically (loading: :mod:`.load`).

Save (every rank calls it at the same point; it is collective):

1. finish the previous async save (collective publish, see below);
2. rank 0 removes stale ``checkpoint-*.tmp-*`` dirs (crashed saves) and picks a fresh id: all ranks
   write into ``checkpoint-N.tmp-<id>-<n>/``;
3. all_gather of each rank's *candidate pieces* (metadata only; rank 0's id travels with them) → :func:`placement.assign_writers` picks the
   lowest rank for every distinct piece, so replicas (dp, tp-replicated norms, tied weights) are written once.
   A repeat save whose candidates are unchanged on every rank (they are fixed for a run) reuses that
   assignment: one all-reduce of an "unchanged" flag replaces the gather;
4. the small state (RNG, schedule, scaler, trainer state, data position, config) is serialised now, and
   the tensors this rank writes are referenced (sync save: written from their own memory) or, with
   ``async_save``, copied to host memory in the writer thread while training goes on (:mod:`.snapshot`);
5. the writer thread writes the files, recording size + crc32;
6. publish: all_gather of the file records; rank 0 writes ``model.safetensors.index.json`` when the weights
   are whole (:func:`placement.whole_weight_map`), ``checkpoint_index.json``, then the marker
   ``.checkpoint_complete`` LAST, fsyncs, renames ``tmp → checkpoint-N`` and rotates; a gather of its
   outcome ends it (a barrier that fails every rank with rank 0's error when anything of this failed there:
   a full disk, a refused rename, a rotation that could not delete).

A :class:`Checkpointer` (one per training run; the Trainer owns it) holds the save in flight. With
``async_save``, :meth:`Checkpointer.wait_for_snapshot` (before the next optimizer step) waits for the host
copy, and step 6 runs in :meth:`Checkpointer.finish`, which the next save, a load and the end of training
call. Every rank reaches those points in the same order (they are in the training loop, not in the writer
thread), so the collectives of step 6 always pair up; the writer thread itself never communicates.

A crash anywhere before the rename leaves only a tmp dir (ignored by readers: no marker, wrong name) and
the previous ``checkpoint-*`` untouched.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import functools
import json
import logging
import os
import shutil
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Dict, Optional

import paddle

from .output_lock import check_still_held
from ..parallel.collectives import all_gather_object
from ..parallel.topology import Topology
from . import peft
from . import placement as L
from . import rng as rng_mod
from .async_writer import AsyncWriter
from .discovery import (foreign_entries, is_empty_dir, is_our_checkpoint, is_our_staging_dir, remove_stale_tmp_dirs,
                        rotate_checkpoints)
from .local_state import dtype_name, layout_dict, rank_state, topology_info
from .snapshot import HostSnapshot
from .write import args_json, fsync_dir, json_bytes, model_config_dict, write_file, write_safetensors

logger = logging.getLogger(__name__)

# ----------------------------------------------------------------------------------- collectives
def _gather(obj, topo) -> list:
    return all_gather_object(obj) if topo.world_size > 1 else [obj]


def _true_on_every_rank(value: bool, topo) -> bool:
    if topo.world_size == 1:
        return value
    flag = paddle.full([1], int(value), dtype="int32")  # on the communication device (NCCL: the GPU)
    paddle.distributed.all_reduce(flag, op=paddle.distributed.ReduceOp.MIN)
    return bool(flag.numpy()[0])


# ------------------------------------------------------------------------------------------ save
@dataclasses.dataclass
class _PendingSave:
    """What :meth:`Checkpointer.finish` needs to publish the save in flight."""

    topo: Topology
    tmp_dir: str
    ckpt_dir: str
    pieces: list
    index_extra: dict
    save_total_limit: Optional[int]
    best_checkpoint: Optional[str]
    t0: float
    snapshot: HostSnapshot


@dataclasses.dataclass
class _WriterPlan:
    """The outcome of a metadata gather: every rank's pieces with their writer and file (``assigned``), for
    this rank's candidate list ``mine`` in ``coords``. A repeat save with the same list reuses it (see
    :meth:`Checkpointer._reusable_plan`); its tmp dirs are ``<run_id>-<n>``, ``run_id`` being rank 0's
    unique id from the gather and ``n`` counting the saves made with the plan (the same on every rank)."""

    rank: int
    world_size: int
    coords: tuple
    mine: list
    assigned: list
    run_id: str
    saves: int = 0

    def matches(self, topo, coords, mine) -> bool:
        return (self.rank, self.world_size, self.coords) == (topo.rank, topo.world_size, coords) and self.mine == mine


@dataclasses.dataclass
class CheckpointStates:
    """What a checkpoint holds, bound to a :class:`Checkpointer` when it is made.

    ``model`` (its weights; a PEFT model's adapters), ``optimizer`` (its states and master weights),
    ``lr_scheduler``/``scaler`` (their ``state_dict()``), ``trainer_state`` (a dict), ``args`` (written as
    ``training_args.json``), ``data_state`` (the layout-free data position, e.g. ``{"consumed_samples": n}``),
    ``topology`` (None: one process), ``save_rng`` (each rank's RNG states), and the rotation after publishing:
    ``save_total_limit`` and ``best_checkpoint`` (never deleted, nor the saved one nor the newest sound one:
    :func:`~.discovery.rotate_checkpoints`)."""

    model: Any
    optimizer: Any = None
    lr_scheduler: Any = None
    scaler: Any = None
    trainer_state: Optional[dict] = None
    args: Any = None
    data_state: Optional[dict] = None
    topology: Any = None
    save_rng: bool = True
    save_total_limit: Optional[int] = None
    best_checkpoint: Optional[str] = None


class Checkpointer:
    """Saves checkpoints of one training run: owns the background writer, the save in flight and the host
    buffers async saves reuse. The Trainer holds one; every call is collective (all ranks, same order).

    What is saved is bound once, here: the :class:`CheckpointStates` fields as keywords
    (``Checkpointer(model=m, optimizer=o, ...)``), or ``states``, a function returning the current
    :class:`CheckpointStates` at each save (the Trainer's: its model and optimizer are replaced while it wraps them,
    and its step and data position advance).

    * :meth:`save` — write ``checkpoint-N``; with ``async_save`` return before the tensors are copied;
    * :meth:`wait_for_snapshot` — call right before the next optimizer step: returns once the async save's
      host copy is taken (parameters and optimizer states may change from then on);
    * :meth:`finish` — wait for the write and publish it (the next save, a load and the end of training
      call it).
    """

    def __init__(self, states: Optional[Callable[[], CheckpointStates]] = None, **bound) -> None:
        if states is not None and bound:
            raise TypeError("Checkpointer takes either states (a function returning CheckpointStates) or the "
                            f"CheckpointStates fields as keywords, not both (got {sorted(bound)})")
        if states is None:
            fixed = CheckpointStates(**bound)
            states = lambda: fixed  # noqa: E731 - the same objects at every save
        self._states = states
        self._writer = AsyncWriter()
        self._pending: Optional[_PendingSave] = None
        self._buffers: dict = {}  # host buffers of the last async snapshot, reused by the next one
        self._plan: Optional[_WriterPlan] = None  # who writes what, reused while no rank's tensors change

    def save(self, ckpt_dir: str, *, async_save: bool = False) -> str:
        """Save the bound states into ``ckpt_dir`` (``.../checkpoint-N``); collective. Returns ``ckpt_dir``.

        With ``async_save`` it returns once the small state (RNG, schedule, scaler, trainer state, model buffers)
        is serialised; parameters and optimizer states are copied in the background until
        :meth:`wait_for_snapshot`, and the directory appears at the next :meth:`finish`."""
        self.finish()  # publish the previous async save (collective)
        s = self._states()
        topo = topology_info(s.topology)
        ckpt_dir = os.path.abspath(ckpt_dir)
        t0 = time.perf_counter()
        local, mine, uid, error = _plan_pieces(ckpt_dir, topo, s.model, s.optimizer)  # plan: no collective
        plan = self._gather_writers(topo, mine, uid, error)  # gather: one all_gather, or one all-reduce on a repeat
        plan.saves += 1
        tmp_dir = L.tmp_dir_name(ckpt_dir, f"{plan.run_id}-{plan.saves}")
        # 4. what this rank writes: tensors (copied later when async, see snapshot), small state as bytes now
        mine_by_file: Dict[str, dict] = {}
        for e in plan.assigned[topo.rank]:
            mine_by_file.setdefault(e.file, {})[L.file_key(e.key)] = local[e.key]
        snapshot = HostSnapshot(mine_by_file, deferred=async_save, buffers=self._buffers if async_save else None)
        small = _small_files(topo, s)
        call_s = time.perf_counter() - t0
        self._pending = _PendingSave(
            topo=topo, tmp_dir=tmp_dir, ckpt_dir=ckpt_dir, pieces=[e for ents in plan.assigned for e in ents],
            index_extra={"layout": layout_dict(topo), "rng_files": s.save_rng, **peft.index_entry(s.model),
                         "timing": {"save_call_s": round(call_s, 4)}},
            save_total_limit=s.save_total_limit, best_checkpoint=s.best_checkpoint, t0=t0, snapshot=snapshot,
        )
        self._writer.submit(functools.partial(self._write, tmp_dir, snapshot, small, async_save))  # write: no collective
        if not async_save:
            self.finish()  # publish (collective)
        return ckpt_dir

    def _gather_writers(self, topo, mine, uid, error) -> "_WriterPlan":
        """3. Gather (collective): every rank's candidate pieces (metadata only; rank 0's tmp-dir id travels with
        them) -> the lowest rank writes each distinct piece (:func:`placement.assign_writers`), in files named per
        writer. A repeat save whose candidates are unchanged on every rank reuses the last plan
        (:meth:`_reusable_plan`). Raises on every rank when any rank failed to plan (``error``)."""
        coords = (topo.tp_rank, topo.pp_rank, topo.sharding_rank, topo.dp_rank)
        plan = self._reusable_plan(topo, coords, mine)
        if plan is None:
            gathered = _gather((coords, mine if error is None else f"{type(error).__name__}: {error}", uid), topo)
            _raise_if_any_failed(gathered, "preparing the save", error)
            assigned = L.assign_writers([g[1] for g in gathered])
            files = L.file_names_for_writers([g[0] for g in gathered], assigned)
            assigned = [[dataclasses.replace(e, file=files[r][e.file]) for e in ents]
                        for r, ents in enumerate(assigned)]
            plan = self._plan = _WriterPlan(topo.rank, topo.world_size, coords, mine, assigned, gathered[0][2])
        return plan

    def _write(self, tmp_dir: str, snapshot: HostSnapshot, small: Dict[str, bytes],
               async_save: bool) -> Dict[str, Dict[str, int]]:
        """5. Write (the writer thread; no collective): this rank's files only, each recorded with size + crc32
        for publishing. An async save takes its host copy here first."""
        if async_save:
            self._buffers = snapshot.take()
        os.makedirs(tmp_dir, exist_ok=True)
        names = sorted(snapshot.arrays)
        # this rank's shard files and its small files side by side: their writes and fsyncs overlap
        with ThreadPoolExecutor(max_workers=len(names) + 1) as pool:
            smalls = pool.submit(lambda: {f: write_file(os.path.join(tmp_dir, f), b) for f, b in small.items()})
            shards = pool.map(lambda f: write_safetensors(os.path.join(tmp_dir, f), snapshot.arrays[f]), names)
            records = dict(zip(names, shards))
            records.update(smalls.result())
        return records

    def _reusable_plan(self, topo, coords, mine) -> Optional["_WriterPlan"]:
        """The last save's writer assignment when no rank's tensors changed since (one small all-reduce
        instead of gathering every rank's metadata), else None: gather again.

        Shapes, dtypes and placements are fixed for a run; what can change is rare (the optimizer creates its
        states at its first step, a script adds a parameter), but one rank cannot see another's change, so
        every rank says whether its own list is unchanged and the plan is reused only when all say so. Every
        rank has a plan or none: plans are made by the collective gather, which succeeds or fails everywhere.
        """
        plan = self._plan
        if plan is None:
            return None
        if not _true_on_every_rank(mine is not None and plan.matches(topo, coords, mine), topo):
            self._plan = None
        return self._plan

    def wait_for_snapshot(self) -> None:
        """Return once the save in flight no longer needs the live tensors (a no-op without one).

        Call it before anything writes parameters, optimizer states or master weights in place (the
        optimizer step); the forward/backward before it run alongside the copy.
        """
        if self._pending is not None:
            self._pending.snapshot.wait_until_taken()

    def finish(self) -> Optional[str]:
        """Wait for the write in flight and publish it (collective; a no-op when nothing is pending).

        Returns the published directory, or None."""
        if self._pending is None:
            return None
        p, self._pending = self._pending, None
        topo = p.topo
        try:
            records, error = self._writer.wait(), None
        except Exception as e:  # e.g. disk full on one rank: every rank must learn it at the same gather
            records, error = f"{type(e).__name__}: {e}", e
        all_records = _gather(records, topo)
        _raise_if_any_failed(list(zip(range(len(all_records)), all_records)), "writing its files", error)
        failure = _publish_and_rotate(p, all_records) if topo.rank == 0 else None
        # doubles as the barrier: nobody resumes/loads/rotates before the directory exists under its final name,
        # and whatever failed on rank 0 (disk full, a rename refused, rotation) fails every rank alike, with rank 0's
        # message, instead of leaving them waiting
        if topo.world_size > 1:
            message = _gather(None if failure is None else str(failure), topo)[0]
            if failure is None and message is not None:
                raise L.CheckpointError(message)
        if failure is not None:
            raise failure
        return p.ckpt_dir

    def finish_after_error(self, same_on_every_rank: bool) -> Optional[str]:
        """Publish the save in flight when training stopped with an error, if that is safe; never raises.

        The files of a save made before the error are good (the snapshot was taken before the next optimizer
        step), and unpublished they would be removed as stale by the next run. Publishing is collective, so
        it runs only when every rank stops with the same error (``same_on_every_rank``, e.g. a non-finite
        global gradient norm) or there is one process: an error on one rank must not leave it waiting at a
        gather the others never reach. Otherwise the tmp dir is left as a crashed save. A failure to publish
        is logged, not raised: the training error is the one the caller reports.
        """
        if self._pending is None or not (same_on_every_rank or self._pending.topo.world_size == 1):
            return None
        try:
            return self.finish()
        except Exception as e:  # noqa: BLE001 - must not mask the error that stopped training
            logger.warning("the checkpoint saved before the error could not be published: %s: %s",
                           type(e).__name__, e)
            return None


def _plan_pieces(ckpt_dir: str, topo, model, optimizer):
    """2. Plan (no collective): rank 0 removes stale tmp dirs (crashed saves) and picks the save's id before anyone
    can write (every rank waits at the gather that follows before it writes), and refuses a foreign target or a
    lost ``output_dir`` lock; every rank lists the pieces it could write. Returns ``(local tensors, candidate
    pieces, rank 0's id, error)``: a failure is returned, not raised, so this rank still joins the gather and the
    other ranks fail with it instead of hanging."""
    uid = None
    try:  # rank 0's failures too (an unreadable lock file, a foreign target) reach every rank at the gather
        if topo.rank == 0:
            parent = os.path.dirname(ckpt_dir)
            os.makedirs(parent, exist_ok=True)
            remove_stale_tmp_dirs(parent)
            uid = f"{int(time.time())}-{uuid.uuid4().hex[:8]}"
            refuse_foreign_target(ckpt_dir)  # before anything is written; every rank learns it at the gather
            check_still_held(parent)  # output_dir's lock taken over by another run: save no more
        held = rank_state(model, optimizer, topo)
        models = peft.checkpoint_tensors(model, held.models)  # a PEFT model: its adapters only, not the frozen base
        optims = dict(held.optims)
        if optimizer is not None:
            optims.update({k: master for k, (master, _) in held.masters.items()})
        local = {**models, **optims}
        mine = [
            L.PieceEntry(k, dtype_name(lt.tensor), lt.placement, topo.rank,
                         "optimizer" if k.startswith(L.OPTIM_PREFIX) else "model")
            for k, lt in local.items()
        ]
    except Exception as e:  # still join the gather, so the other ranks fail too instead of hanging
        return None, None, uid, e
    return local, mine, uid, None


def save_checkpoint(ckpt_dir: str, **states) -> str:
    """One synchronous save of ``states`` (the :class:`CheckpointStates` fields) into ``ckpt_dir``; collective.

    For a one-off save (``Trainer.save_model``, scripts); a training run keeps one :class:`Checkpointer`,
    which is what saves asynchronously. ``async_save`` is refused: the throwaway Checkpointer would never
    publish the save (only :meth:`Checkpointer.finish` does)."""
    if "async_save" in states:
        raise TypeError("save_checkpoint() is synchronous and takes no async_save; for an async save keep a "
                        "Checkpointer and call Checkpointer.save(..., async_save=True), then Checkpointer.finish()")
    return Checkpointer(**states).save(ckpt_dir)


def _small_files(topo, s: CheckpointStates) -> Dict[str, bytes]:
    """The small files, serialised now: the step's RNG, schedule and scaler change right after the save."""
    small: Dict[str, bytes] = {}
    if s.save_rng:
        coord_name = topo.layout.cell_name(topo.coords)
        small[L.rng_file_name(coord_name)] = rng_mod.dumps(rng_mod.capture_rng_state())
    if topo.rank == 0:
        small[L.TRAINER_STATE_NAME] = json_bytes(s.trainer_state or {})
        if s.args is not None:
            small[L.TRAINING_ARGS_NAME] = args_json(s.args)
        if s.lr_scheduler is not None:
            small[L.SCHEDULER_NAME] = json_bytes(s.lr_scheduler.state_dict())
        if s.scaler is not None:
            small[L.SCALER_NAME] = json_bytes(s.scaler.state_dict())
        if s.data_state is not None:
            small[L.DATA_STATE_NAME] = json_bytes(s.data_state)
        cfg = model_config_dict(s.model)
        if cfg is not None:
            small[L.CONFIG_NAME] = json_bytes(cfg)
    return small


def _publish_and_rotate(p: _PendingSave, all_records: list) -> Optional[L.CheckpointError]:
    """Rank 0's part of :meth:`Checkpointer.finish`: index, marker, rename, rotation. Never raises: a failure
    comes back as a :class:`~.placement.CheckpointError` naming the file, for every rank to raise."""
    try:
        files: Dict[str, Dict[str, int]] = {}
        for r in all_records:
            files.update(r)
        extra = dict(p.index_extra)
        extra["timing"]["total_s"] = round(time.perf_counter() - p.t0, 4)
        index = L.build_index(p.pieces, files, extra.pop("layout"), extra)
    except Exception as e:  # noqa: BLE001 - every rank must learn it
        return L.CheckpointError(f"checkpoint {p.ckpt_dir} was not published: its index could not be built "
                                 f"({type(e).__name__}: {e}); the previous checkpoint is intact")
    error = _publish_or_error(p.tmp_dir, p.ckpt_dir, index)
    if error is None and p.save_total_limit:
        parent = os.path.dirname(p.ckpt_dir)
        try:
            rotate_checkpoints(parent, p.save_total_limit, p.best_checkpoint, keep=(p.ckpt_dir,))
        except Exception as e:  # noqa: BLE001 - e.g. PermissionError on an old checkpoint
            where = getattr(e, "filename", None) or parent
            error = L.CheckpointError(f"{where}: deleting old checkpoints (save_total_limit={p.save_total_limit}) "
                                      f"failed ({type(e).__name__}: {getattr(e, 'strerror', None) or e}); checkpoint "
                                      f"{p.ckpt_dir} was published and is intact")
    return error


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
    if index.get(peft.INDEX_KEY):  # the adapters alone: from_pretrained would build a model without its base
        weight_map, why_not = None, f"a {index[peft.INDEX_KEY]['type']} checkpoint holds the adapters only"
    if weight_map is None:
        index["hf_weights_index"] = {"written": False, "reason": why_not}
        return
    data = json.dumps(L.hf_weights_index(index, weight_map), indent=2).encode()
    index["files"][L.HF_WEIGHTS_INDEX_NAME] = write_file(os.path.join(tmp_dir, L.HF_WEIGHTS_INDEX_NAME), data)
    index["hf_weights_index"] = {"written": True}


def refuse_foreign_target(ckpt_dir: str) -> None:
    """Raise :class:`~.placement.CheckpointError` when ``ckpt_dir`` exists and is not a checkpoint of ours (marker and
    index): a PaddleNLP checkpoint, a user's directory or file there is never replaced, moved or deleted. A checkpoint
    of ours is refused too when it holds an entry our writer never makes (:func:`.discovery.foreign_entries`). An empty
    directory holds nothing to lose: the save takes its place."""
    if os.path.lexists(ckpt_dir) and is_our_checkpoint(ckpt_dir):
        extra = foreign_entries(ckpt_dir)
        if extra:
            raise L.CheckpointError(
                f"cannot save {ckpt_dir}: a checkpoint of that step exists that holds entries paddletrainer does not "
                f"write ({', '.join(extra)}); replacing it would delete them and paddletrainer never deletes what it "
                f"did not write: move them out of {ckpt_dir} or choose another output_dir")
        return
    if os.path.lexists(ckpt_dir) and not is_empty_dir(ckpt_dir):
        kind = "directory" if os.path.isdir(ckpt_dir) and not os.path.islink(ckpt_dir) else "file"
        raise L.CheckpointError(
            f"cannot save {ckpt_dir}: a {kind} of that name exists that paddletrainer did not write (no "
            f"{L.CHECKPOINT_COMPLETE_MARKER} and {L.INDEX_NAME}); paddletrainer never replaces, renames or deletes "
            f"it, even with --overwrite_output_dir: move it out of {os.path.dirname(ckpt_dir)} or choose another "
            f"output_dir")


def _publish_or_error(tmp_dir: str, ckpt_dir: str, index: dict) -> Optional[L.CheckpointError]:
    """Index, then the marker LAST, then an atomic rename (:func:`_rename_into_place`). Any failure comes back as
    a :class:`~.placement.CheckpointError` naming the file, for the caller to raise once every rank knows; earlier
    checkpoints are untouched. When writing the index or marker failed (disk full, quota, read-only filesystem)
    the unpublished tmp dir is removed (it is ours, and the space may be what is missing); when the rename
    failed it is kept: it holds the complete save (the next save removes it as stale)."""
    try:
        _add_hf_weights_index(tmp_dir, index)
        _write_index_and_marker(tmp_dir, index)
    except OSError as e:
        shutil.rmtree(tmp_dir, ignore_errors=True)
        where = e.filename or tmp_dir
        return L.CheckpointError(f"{where}: could not be written ({e.strerror or e}): checkpoint {ckpt_dir} was not "
                                 "published; the previous checkpoint is intact")
    except Exception as e:  # noqa: BLE001 - every rank must learn it
        return L.CheckpointError(f"{tmp_dir}: its index could not be written ({type(e).__name__}: {e}): checkpoint "
                                 f"{ckpt_dir} was not published; the previous checkpoint is intact")
    try:
        _rename_into_place(tmp_dir, ckpt_dir)
    except L.CheckpointError as e:
        return L.CheckpointError(f"{e} (the complete save is left in {tmp_dir})")
    except OSError as e:
        where = e.filename or ckpt_dir
        return L.CheckpointError(f"{where}: renaming {tmp_dir} to {ckpt_dir} failed ({e.strerror or e}): checkpoint "
                                 f"{ckpt_dir} was not published; the complete save is left in {tmp_dir}")
    try:
        fsync_dir(os.path.dirname(ckpt_dir))
    except OSError as e:
        return L.CheckpointError(f"{os.path.dirname(ckpt_dir)}: syncing the directory failed ({e.strerror or e}) after "
                                 f"{ckpt_dir} was renamed into place: it may not survive a power loss")
    return None


def _write_index_and_marker(tmp_dir: str, index: dict) -> None:
    for name, data in ((L.INDEX_NAME, json.dumps(index, indent=1).encode()), (L.CHECKPOINT_COMPLETE_MARKER, b"")):
        path = os.path.join(tmp_dir, name)
        try:
            write_file(path, data)
        except OSError as e:  # ENOSPC/EDQUOT raised by write or fsync carry no file name: name it
            e.filename = e.filename or path
            raise
    fsync_dir(tmp_dir)


def _rename_into_place(tmp_dir: str, ckpt_dir: str) -> None:
    """``tmp_dir`` becomes ``ckpt_dir`` atomically; an old checkpoint of ours of the same step is replaced,
    anything else there is refused (the save stays in ``tmp_dir``)."""
    refuse_foreign_target(ckpt_dir)  # appeared since the save began (checked there on rank 0 already)
    if is_our_checkpoint(ckpt_dir):  # re-saving a step: move the old one aside first (rename is atomic)
        trash = ckpt_dir + L.TMP_INFIX + "replaced-" + uuid.uuid4().hex[:8]
        os.rename(ckpt_dir, trash)
        try:
            os.rename(tmp_dir, ckpt_dir)
        except OSError:
            with contextlib.suppress(OSError):  # put the old checkpoint back: it may be the only good one
                os.rename(trash, ckpt_dir)
            raise
        if is_our_staging_dir(trash):  # nothing was added to it since the check above
            shutil.rmtree(trash, ignore_errors=True)
    else:
        try:  # onto nothing, or an empty directory: rename(2) replaces that atomically, a non-empty one it refuses
            os.rename(tmp_dir, ckpt_dir)
        except OSError as e:
            if e.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                raise
            refuse_foreign_target(ckpt_dir)  # filled meanwhile: refused with the message naming it
            raise
