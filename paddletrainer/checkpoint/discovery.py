"""Finding checkpoints: which ``checkpoint-N`` directories of ``output_dir`` are complete, ours, sound (loadable
as far as can be told without reading tensors) or PaddleNLP's; the newest; which checkpoint a
``resume_from_checkpoint`` value names (``auto`` included); rotation (``save_total_limit``), stale tmp dirs of crashed
saves and damaged checkpoints set aside. Names come from :mod:`.placement`.

Paddle-free (``training_args`` and ``trainer_utils`` import it; a test imports it in a fresh interpreter and finds
no paddle): directories are listed and files stat-ed; only :func:`checkpoint_problem` reads a file, the index,
through :mod:`.read`. Only marked ``checkpoint-N`` dirs count: a half-written ``checkpoint-N.tmp-*`` never does.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import re
import shutil
import stat
import time
import uuid
from typing import Any, List, Optional, Sequence, Tuple, Union

from ..errors import CheckpointError
from . import placement as L
from .output_lock import describe, live_holder
from .placement import CHECKPOINT_COMPLETE_MARKER, CHECKPOINT_INDEX_NAME, parse_checkpoint_step
from .read import CheckpointPathError, member_path, read_index, read_valid_json
from .validate import BATCH_ARGS_SCHEMA

logger = logging.getLogger(__name__)


# ----------------------------------------------------------------------------------- naming and listing
def sorted_checkpoints(folder: str) -> List[str]:
    """The completed ``checkpoint-N`` directories in ``folder``, oldest (lowest N) first.

    Directories without the :data:`CHECKPOINT_COMPLETE_MARKER` file are skipped: they are interrupted or
    in-flight saves, and resuming from one would load partial state. Temporary ``checkpoint-N.tmp-*``
    directories never match the name pattern.
    """
    if not os.path.isdir(folder):
        return []
    found = []
    for name in os.listdir(folder):
        step = parse_checkpoint_step(name)
        path = os.path.join(folder, name)
        if step is not None and os.path.isfile(os.path.join(path, CHECKPOINT_COMPLETE_MARKER)):
            found.append((step, path))
    return [path for _, path in sorted(found)]


# the shard names of placement (model_state.tp00_pp00.safetensors, optimizer.tp00_pp00_shard00.safetensors)
_OUR_SHARD = re.compile(r"^(model_state|optimizer)\.tp\d+_pp\d+.*\.safetensors$")
# the index files of PaddleNLP's unified checkpoint (``--unified_checkpoint true``): safetensors, no pickles
PADDLENLP_UNIFIED_INDEXES = ("model.safetensors.index.json", "peft_model.safetensors.index.json",
                             "optimizer.safetensors.index.json", "master_weights.safetensors.index.json")
# the weights of PaddleNLP's non-unified checkpoint: a model's, or a LoRAModel's adapters (``lora_model_state``)
_PADDLENLP_WEIGHTS = re.compile(r"^(lora_)?model_state(\..+)?\.pdparams$")


def _foreign_names(path: str) -> Optional[list]:
    """The file names of ``path`` when it is a directory carrying neither our index nor our marker, else None."""
    if not os.path.isdir(path):
        return None
    names = os.listdir(path)
    return None if L.INDEX_NAME in names or CHECKPOINT_COMPLETE_MARKER in names else names


def is_paddlenlp_unified_checkpoint(path: str) -> bool:
    """Whether ``path`` is a checkpoint PaddleNLP's Trainer wrote with ``unified_checkpoint``: its
    ``optimizer.safetensors.index.json`` or ``model.safetensors.index.json`` and its ``trainer_state.json``
    (written last), and neither our ``checkpoint_index.json`` nor our completion marker (ours write a
    ``model.safetensors.index.json`` too, for ``from_pretrained``)."""
    names = _foreign_names(path)
    return names is not None and "trainer_state.json" in names and any(n in names for n in PADDLENLP_UNIFIED_INDEXES)


def is_paddlenlp_checkpoint(path: str) -> bool:
    """Whether ``path`` is a checkpoint PaddleNLP's Trainer wrote, in its non-unified format (a
    ``model_state*.pdparams``, or a LoRAModel's ``lora_model_state*.pdparams``) or its unified one (:func:`is_paddlenlp_unified_checkpoint`), with its
    ``trainer_state.json`` (written after the weights), and neither our ``checkpoint_index.json`` nor our
    completion marker. A directory carrying our marker is always read as ours (whose loader refuses pickles), so
    planting ``.pdparams`` files in one of our checkpoints never routes it to the pickle-reading interop loader."""
    names = _foreign_names(path)
    return names is not None and "trainer_state.json" in names and (
        any(_PADDLENLP_WEIGHTS.match(n) for n in names) or any(n in names for n in PADDLENLP_UNIFIED_INDEXES))


def _not_a_checkpoint(value: str, resume: str) -> str:
    """Why the directory ``resume`` named by ``resume_from_checkpoint`` cannot be resumed (it has no marker)."""
    names = sorted(os.listdir(resume))
    paddlenlp = [n for n in names if n in PADDLENLP_UNIFIED_INDEXES or _PADDLENLP_WEIGHTS.match(n)]
    if paddlenlp:  # PaddleNLP writes trainer_state.json after the weights and optimizer
        return (f"resume_from_checkpoint={value!r} is a PaddleNLP checkpoint whose save did not finish (it has "
                f"{paddlenlp[0]} but no trainer_state.json, which PaddleNLP writes last)")
    ours = [n for n in names if n == L.INDEX_NAME or _OUR_SHARD.match(n)]
    if ours or not names or L.TMP_INFIX in os.path.basename(os.path.normpath(resume)):  # empty: a save just begun
        found = sorted_checkpoints(os.path.dirname(os.path.abspath(resume)))
        return (f"resume_from_checkpoint={value!r} is incomplete (no completion marker: its save did not finish); "
                f"complete checkpoints beside it: {[os.path.basename(c) for c in found] or 'none'}")
    shown = names[:8] + (["..."] if len(names) > 8 else [])
    return (f"resume_from_checkpoint={value!r} is not a paddletrainer checkpoint (found: {shown}); "
            f"valid: a checkpoint-N directory paddletrainer wrote (with {CHECKPOINT_COMPLETE_MARKER}), or one "
            f"PaddleNLP's Trainer wrote ([lora_]model_state*.pdparams or unified *.safetensors.index.json, with "
            f"trainer_state.json)")


def is_our_checkpoint(path: str) -> bool:
    """Whether ``path`` is a checkpoint paddletrainer published: a real directory (not a symlink) holding both our
    completion marker and our ``checkpoint_index.json``. Only these are ever replaced or rotated away; anything
    else named ``checkpoint-*`` (a PaddleNLP checkpoint, a user's directory or file) is never deleted or renamed."""
    return (os.path.isdir(path) and not os.path.islink(path)
            and os.path.isfile(os.path.join(path, CHECKPOINT_COMPLETE_MARKER))
            and os.path.isfile(os.path.join(path, CHECKPOINT_INDEX_NAME)))


def is_empty_dir(path: str) -> bool:
    """A real (not symlinked) directory with nothing in it."""
    if os.path.islink(path) or not os.path.isdir(path):
        return False
    with os.scandir(path) as entries:
        return next(entries, None) is None


def foreign_checkpoint_entries(folder: str) -> List[Tuple[int, str]]:
    """``(step, name)`` of the entries of ``folder`` named ``checkpoint-<step>`` that are not checkpoints of ours
    (:func:`is_our_checkpoint`) and hold something (an empty directory holds nothing to lose: a save of its step
    takes its place): a save of that step would collide with them. Sorted by step."""
    if not folder or not os.path.isdir(folder):
        return []
    found = [(parse_checkpoint_step(name), os.path.join(folder, name)) for name in os.listdir(folder)]
    return sorted((step, os.path.basename(path)) for step, path in found
                  if step is not None and not is_our_checkpoint(path) and not is_empty_dir(path))


def get_last_checkpoint(folder: str) -> Optional[str]:
    """The newest checkpoint in ``folder``, or None: the ``checkpoint-N`` of ours with the highest N that is
    complete (has its completion marker); only when ``folder`` holds none of ours, the newest PaddleNLP-written one
    (:func:`is_paddlenlp_checkpoint`), as PaddleNLP's own ``get_last_checkpoint`` would find it.

    Ours always win so that a PaddleNLP directory (whose loading unpickles files) is never preferred to a
    checkpoint of ours, whatever its step number. A script passing a PaddleNLP path found here as
    ``resume_from_checkpoint`` names it (it is read, with the allowlist unpickler); ``true`` does not resume one."""
    ours = sorted_checkpoints(folder)
    if ours:
        return ours[-1]
    names = os.listdir(folder) if os.path.isdir(folder) else []
    theirs = [(step, os.path.join(folder, name)) for name in names
              for step in [parse_checkpoint_step(name)] if step is not None]
    theirs = [(step, path) for step, path in theirs if is_paddlenlp_checkpoint(path)]
    return max(theirs)[1] if theirs else None


def requested_resume(value: Any) -> Union[None, bool, str]:
    """Normalise a ``resume_from_checkpoint`` value: None (no resume), True (the newest checkpoint) or a path.

    Config files and command lines carry booleans as strings, so "True"/"true" and "False"/"false"/"" count too.
    """
    if value in (None, False, "", "False", "false"):
        return None
    if value is True or value in ("True", "true"):
        return True
    return str(value)


RESUME_AUTO = "auto"


def resolve_resume_checkpoint(value: Any, output_dir: Optional[str]) -> Optional[str]:
    """The checkpoint directory a ``resume_from_checkpoint`` value asks for, or None (start fresh).

    * None / False / "false" / "": no resume;
    * True / "true": the newest checkpoint of ours in ``output_dir`` (``get_last_checkpoint``); none is an error,
      and so is a PaddleNLP checkpoint found there (reading one unpickles its files: only a path the user names
      is read);
    * ``"auto"``: the newest complete checkpoint *of ours* in ``output_dir`` if there is one, else start fresh —
      what a job restarted by ``python -m paddletrainer.launch --max_restart`` needs to pick up where its previous
      attempt stopped (half-written ``checkpoint-N.tmp-*`` dirs never count). A PaddleNLP checkpoint is never
      picked here. (The Trainer goes further back past a damaged one: ``TrainerCheckpoints._resolve_resume``);
    * a path: must exist and be a complete checkpoint (its save finished), or a PaddleNLP checkpoint.

    Raises ``ValueError`` naming ``resume_from_checkpoint``, so a bad value is a usage error before training.
    """
    resume = requested_resume(value)
    if resume is None:
        return None
    if resume == RESUME_AUTO:
        ours = sorted_checkpoints(output_dir) if output_dir else []
        return ours[-1] if ours else None
    if resume is True:
        path = get_last_checkpoint(output_dir) if output_dir else None
        if path is None:
            # PaddleNLP's sentence first: scripts and tests match on it
            raise ValueError(f"No valid checkpoint found in output directory ({output_dir}): "
                             f"resume_from_checkpoint=True but it holds no complete checkpoint; use "
                             f"resume_from_checkpoint=auto to start fresh when there is none")
        if is_paddlenlp_checkpoint(path):  # its files are pickles: read only from a path the user names
            raise ValueError(f"resume_from_checkpoint=True: output_dir={output_dir!r} holds no complete checkpoint of "
                             f"paddletrainer, only PaddleNLP's {os.path.basename(path)}, whose files are pickles and "
                             f"are read only from a path you name: pass --resume_from_checkpoint {path}")
        return path
    if not os.path.isdir(resume):
        raise ValueError(f"Can't find a valid checkpoint at {resume}: resume_from_checkpoint={resume!r} does not "
                         f"exist; give a checkpoint-N directory, true (the newest in output_dir) or auto (the newest "
                         f"if any)")
    if not os.path.isfile(os.path.join(resume, CHECKPOINT_COMPLETE_MARKER)) and not is_paddlenlp_checkpoint(resume):
        raise ValueError(_not_a_checkpoint(value, resume))
    return resume


def check_resume_value(value: Any, output_dir: Optional[str]) -> None:
    """Raise at arguments time the ``ValueError`` :func:`resolve_resume` would raise at train() for ``value`` (a
    path that is no checkpoint, ``true`` with none in ``output_dir``), so a bad value is a usage error before the
    model is built. ``auto`` and no resume cannot be wrong: nothing is looked at for them (train() resolves them)."""
    if requested_resume(value) not in (None, RESUME_AUTO):
        resolve_resume_checkpoint(value, output_dir)


@dataclasses.dataclass(frozen=True)
class ResumeChoice:
    """What a ``resume_from_checkpoint`` value resolved to (:func:`resolve_resume`)."""

    path: Optional[str]  # the checkpoint to load; None: start fresh
    requested: Union[None, bool, str]  # the value, normalised by requested_resume
    skipped: Tuple[Tuple[str, str], ...] = ()  # (damaged newer checkpoint, its problem), passed over by auto

    @property
    def auto(self) -> bool:
        return self.requested == RESUME_AUTO

    @property
    def named(self) -> Optional[str]:
        """The path when the user named one: the one checkpoint whose pickles (a PaddleNLP one) may be read."""
        return self.path if isinstance(self.requested, str) and not self.auto else None


def resolve_resume(value: Any, output_dir: Optional[str]) -> ResumeChoice:
    """The one resolution of a ``resume_from_checkpoint`` value for a run (the Trainer calls it once at train()).

    As :func:`resolve_resume_checkpoint`, except that ``auto`` takes the newest *sound* checkpoint
    (:func:`newest_sound_checkpoint`) and reports the damaged newer ones it passed over (``skipped``), so that an
    automatic restart is not stuck on one; when every checkpoint there is damaged it is an error, not a fresh
    start. Raises ``ValueError`` (a bad value) or :class:`CheckpointError` (all damaged)."""
    requested = requested_resume(value)
    if requested != RESUME_AUTO:
        return ResumeChoice(resolve_resume_checkpoint(value, output_dir), requested)
    path, skipped = newest_sound_checkpoint(output_dir) if output_dir else (None, [])
    if path is None and skipped:
        raise CheckpointError(
            f"resume_from_checkpoint=auto: every checkpoint in output_dir={output_dir!r} is damaged ("
            + "; ".join(f"{os.path.basename(bad)}: {problem}" for bad, problem in skipped)
            + "): repair or move them, or resume from a path you name")
    return ResumeChoice(path, requested, tuple(skipped))


# ----------------------------------------------------------------------------------- sound, newest
def is_complete_checkpoint(path: str) -> bool:
    return os.path.isfile(os.path.join(path, L.CHECKPOINT_COMPLETE_MARKER))


list_complete_checkpoints = sorted_checkpoints  # the name checkpoint's public API has for it


def get_last_complete_checkpoint(folder: str) -> Optional[str]:
    """The newest complete checkpoint *of ours* in ``folder`` (never a PaddleNLP directory), or None."""
    found = sorted_checkpoints(folder)
    return found[-1] if found else None


def checkpoint_problem(ckpt_dir: str) -> Optional[str]:
    """Why ``ckpt_dir`` (a complete checkpoint of ours) cannot be loaded, found without reading its tensors, or
    None: its index must parse and every file it lists must be a regular file inside the directory (no symlink
    out of it: loading refuses those) with the listed size. (Checksums are compared
    while a load reads the files; this check is what every rank can run alike before choosing one.)"""
    try:
        index, _ = _read_ours(ckpt_dir)
        records = index["files"].items()
        expected = {name: int(record["size"]) for name, record in records}
    except (OSError, ValueError, TypeError, KeyError, AttributeError, L.CheckpointError) as e:
        return f"its {L.INDEX_NAME} is unreadable ({type(e).__name__}: {e})"
    for name, size in sorted(expected.items()):
        try:
            st = os.stat(member_path(ckpt_dir, name))  # a symlink out of the directory is refused by every load
        except CheckpointPathError as e:
            return e.problem
        except OSError:
            return f"{name} is missing"
        if not stat.S_ISREG(st.st_mode):
            return f"{name} is not a regular file"
        if st.st_size != size:
            return f"{name} has {st.st_size} bytes, its index says {size}"
    return None


def _read_ours(ckpt_dir: str, document: Optional[str] = None):
    """``(index, document)``: a checkpoint of ours' index and, when named, one of its JSON documents (checked by its
    schema, :func:`~.read.read_valid_json`; None when the index lacks it) -- what finding checkpoints reads."""
    index = read_index(ckpt_dir)
    return index, (read_valid_json(ckpt_dir, index, document) if document else None)


def saved_global_batch(ckpt_dir: str) -> Optional[int]:
    """The global batch a checkpoint of ours was trained with: recorded in its data state, or (written before
    it was) per-device batch × accumulation from its training arguments × the data ranks (dp × sharding) of the
    layout its index records. Every value read is checked (``checkpoint.validate``: integers >= 1), so a
    damaged file is an error naming it and its field, never an accumulation of 0 steps."""
    index, data_state = _read_ours(ckpt_dir, L.DATA_STATE_NAME)  # the index's ``topology`` degrees are checked there
    if data_state is not None and "global_batch_size" in data_state:
        return data_state["global_batch_size"]
    saved_args = read_valid_json(ckpt_dir, index, L.TRAINING_ARGS_NAME)  # the index already read and checked
    if saved_args is None:
        return None  # saved without args: no record of it, nothing to keep
    if len(saved_args.keys() & BATCH_ARGS_SCHEMA.fields.keys()) < 2:
        return None
    layout = index.get("topology") or {}
    return (saved_args["per_device_train_batch_size"] * saved_args["gradient_accumulation_steps"]
            * layout.get("dp_degree", 1) * layout.get("sharding_degree", 1))


def newest_sound_checkpoint(folder: str, before: Optional[int] = None) -> Tuple[Optional[str], List[Tuple[str, str]]]:
    """The newest complete checkpoint of ours in ``folder`` that passes :func:`checkpoint_problem` (or None), and
    the newer ones passed over, each with its problem. ``before``: only checkpoints of lower steps count."""
    skipped: List[Tuple[str, str]] = []
    for path in reversed(sorted_checkpoints(folder)):
        if before is not None and L.parse_checkpoint_step(os.path.basename(path)) >= before:
            continue
        problem = checkpoint_problem(path)
        if problem is None:
            return path, skipped
        skipped.append((path, problem))
    return None, skipped


DAMAGED_INFIX = ".damaged-"


def set_aside_damaged(ckpt_dir: str) -> Optional[str]:
    """Rename damaged checkpoint ``ckpt_dir`` of ours to ``checkpoint-N.damaged-<unix time>`` (nothing reads,
    rotates or removes that name) and return the new path; None when the rename failed (logged). Rank 0 only.

    Left under its name, a damaged newest checkpoint would be passed over by every restart and collide with the
    save of its step; it is kept, not deleted: it may be repaired. Left under its name (None) when it is not
    wholly ours: not a checkpoint of ours (marker and index), or holding an entry our writer never makes."""
    target = f"{ckpt_dir}{DAMAGED_INFIX}{int(time.time())}"
    try:
        if not is_our_checkpoint(ckpt_dir) or foreign_entries(ckpt_dir):
            return None  # not ours to rename
        os.rename(ckpt_dir, target)
    except OSError as e:
        logger.warning("could not move the damaged checkpoint %s aside to %s (%s)", ckpt_dir, target, e)
        return None
    return target


def rotate_checkpoints(output_dir: str, save_total_limit: Optional[int], best_checkpoint: Optional[str] = None,
                       keep: Sequence[str] = ()) -> List[str]:
    """Delete the oldest checkpoints beyond the limit; never the best, the newest sound one, nor those in ``keep``
    (a save keeps the one it just published). Rank 0 only. Returns the deleted paths.

    Counted are the *sound* checkpoints of ours (:func:`is_our_checkpoint`: marker and
    index; and no :func:`checkpoint_problem`) and the *empty* ``checkpoint-N`` directories (PaddleNLP/HF count
    every directory of that name; an empty one holds nothing that is not ours, and ``os.rmdir`` removes it only
    while it is still empty). A damaged checkpoint is neither counted nor deleted: counted, a damaged newest one
    would be protected while the sound ones it outnumbers were deleted. A PaddleNLP checkpoint or a user's
    non-empty ``checkpoint-*`` entry is neither counted nor touched, and a checkpoint of ours holding an entry our
    writer never makes (:func:`foreign_entries`) is left with a warning naming them."""
    sound = [p for p in list_complete_checkpoints(output_dir) if is_our_checkpoint(p) and checkpoint_problem(p) is None]
    empty = _empty_checkpoint_dirs(output_dir)
    steps = {L.parse_checkpoint_step(os.path.basename(p)): p for p in sound + empty}
    protected = [L.parse_checkpoint_step(os.path.basename(os.path.normpath(p))) for p in keep if p]
    if sound:
        protected.append(L.parse_checkpoint_step(os.path.basename(sound[-1])))
    best = L.parse_checkpoint_step(os.path.basename(os.path.normpath(best_checkpoint))) if best_checkpoint else None
    doomed = [steps[s] for s in L.select_checkpoints_to_delete(list(steps), save_total_limit, best, keep=protected)]
    deleted = []
    for path in doomed:
        if path in empty:
            with contextlib.suppress(OSError):  # gone, or no longer empty: then it is not ours to delete
                os.rmdir(path)
                deleted.append(path)
            continue
        if _delete_checkpoint_of_ours(path):
            deleted.append(path)
    return deleted


def _delete_checkpoint_of_ours(path: str) -> bool:
    """Delete checkpoint ``path`` of ours unless it holds an entry our writer never makes (then warn, keep it)."""
    try:
        extra = foreign_entries(path)
    except FileNotFoundError:
        return False
    if extra:
        logger.warning("save_total_limit: not deleting %s: it holds entries paddletrainer does not write (%s); "
                       "paddletrainer never deletes what it did not write: move them out, then delete it yourself",
                       path, ", ".join(extra))
        return False
    # rename to a tmp name first (atomic): a kill mid-delete leaves a tmp dir, which no reader takes for a
    # checkpoint and the next save or train() start removes, never a half-deleted ``checkpoint-N``
    trash = path + L.TMP_INFIX + "deleted-" + uuid.uuid4().hex[:8]
    try:
        os.rename(path, trash)
    except FileNotFoundError:
        return False
    if is_our_staging_dir(trash):  # nothing was added between the check and the rename
        shutil.rmtree(trash, ignore_errors=True)
    return True


def _empty_checkpoint_dirs(output_dir: str) -> List[str]:
    if not os.path.isdir(output_dir):
        return []
    paths = (os.path.join(output_dir, n) for n in os.listdir(output_dir) if L.parse_checkpoint_step(n) is not None)
    return [p for p in paths if is_empty_dir(p)]


# ----------------------------------------------------------------------------------- stale tmp dirs
def foreign_entries(path: str) -> List[str]:
    """The entries of directory ``path`` that our writer never puts in a checkpoint: names that are not ours
    (:func:`~.placement.is_our_file_name`), subdirectories, symlinks, anything but a regular file; sorted."""
    with os.scandir(path) as entries:
        return sorted(e.name for e in entries if not (e.is_file(follow_symlinks=False) and L.is_our_file_name(e.name)))


def is_our_staging_dir(path: str) -> bool:
    """Whether ``path`` (named ``checkpoint-N.tmp-*``) holds only what our writer leaves there: a real directory
    whose entries are all regular files with our file names (an unfinished save: no marker yet, or a checkpoint
    of ours moved aside to be replaced or rotated away). A user's file in it, a subdirectory or a symlink makes it
    not ours: it is then never removed."""
    if os.path.islink(path) or not os.path.isdir(path):
        return False
    return not foreign_entries(path)


def remove_stale_tmp_dirs(parent: str) -> List[str]:
    """Remove the ``checkpoint-N.tmp-*`` dirs of crashed saves in ``parent``; returns the removed paths.

    Only staging dirs of ours (:func:`is_our_staging_dir`) go; anything else with such a name is left alone with
    a warning. Nothing is removed while another live run holds ``parent``'s lock (:mod:`paddletrainer.checkpoint.output_lock`):
    its tmp dir is the save it is writing."""
    holder = live_holder(parent)
    if holder is not None:
        logger.warning("not removing stale checkpoint tmp dirs in %s: another run holds its lock (%s)", parent,
                       holder.get("unreadable") or describe(holder))
        return []
    removed = []
    for name in sorted(os.listdir(parent)):
        if not L.is_tmp_dir_name(name):
            continue
        path = os.path.join(parent, name)
        if is_our_staging_dir(path):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
        else:
            logger.warning("left %s in place: it is named like a checkpoint tmp dir but holds files paddletrainer "
                           "does not write (or is not a directory); paddletrainer never deletes what it did not write",
                           path)
    return removed
