"""Names, placements and the index of a checkpoint: pure functions, no I/O, no paddle.

A checkpoint directory ``checkpoint-<step>/`` holds

* ``model_state.tp00_pp01.safetensors`` / ``optimizer.tp00_pp01_shard01.safetensors`` — one file per writing
  rank, holding only the tensor pieces that rank was chosen to write (see :func:`assign_writers`);
* ``checkpoint_index.json`` — the only file that says where everything is (:func:`build_index`);
* ``model.safetensors.index.json`` — only when the weights are whole: PaddleNLP's/HF's sharded-weights index
  over the model files, for ``from_pretrained`` (:func:`whole_weight_map`);
* small JSON files (trainer state, args, scheduler, scaler, data position, model config) and one
  ``rng_state.<coords>.json`` per rank (older checkpoints have a pickled ``.pkl`` there, which is never unpickled);
* ``.checkpoint_complete`` — written last; a directory without it is not a checkpoint.

Every tensor has a *global key*: ``model/<state_dict name>`` or ``optim/<param global name>/<state kind>``.
Inside a file a piece is stored under its piece ``key`` (format version 2): the bare state_dict name in model
files — so a checkpoint whose weights are whole is also a PaddleNLP/HF sharded weights directory, see
:func:`whole_weight_map` — and the global key in optimizer files. Version-1 pieces have no ``key``: their
in-file key is the global key (:func:`stored_key`).
A *piece* is the part of the global tensor one file stores: a box (``offsets`` + ``shape``) and, for
flat-sliced storage (sharding stage 3), a ``flat`` range ``[start, stop)`` inside that box's row-major
flattening. Loading in another layout only needs :func:`box_overlap` (and :mod:`.reshard`'s flat-range arithmetic) between
the pieces and the slice the loading rank owns — no collectives.
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Dict, Iterable, List, Optional, Sequence, Set, Tuple

from ..errors import CheckpointError  # noqa: F401 (defined there, free of this package; re-exported here)

# The one home of a checkpoint's names on disk (this module imports neither paddle nor the rest of the package:
# ``checkpoint.discovery`` and ``trainer_utils`` read them without paddle).
PREFIX_CHECKPOINT_DIR = "checkpoint"
# A checkpoint directory is published atomically: the writer creates this empty file last, so a directory
# without it is a save that crashed or is still being written, and must never be resumed from.
CHECKPOINT_COMPLETE_MARKER = ".checkpoint_complete"
CHECKPOINT_INDEX_NAME = "checkpoint_index.json"
_CHECKPOINT_DIR_RE = re.compile(r"^" + PREFIX_CHECKPOINT_DIR + r"-(\d+)$")


def checkpoint_dir_name(step: int) -> str:
    """``checkpoint-<step>``: the one spelling of a checkpoint directory's name."""
    return f"{PREFIX_CHECKPOINT_DIR}-{step}"


def parse_checkpoint_step(dir_name: str) -> Optional[int]:
    """Step of a published ``checkpoint-N`` directory name; None for anything else (tmp dirs too)."""
    match = _CHECKPOINT_DIR_RE.match(dir_name)
    return int(match.group(1)) if match else None


FORMAT_NAME = "paddletrainer-checkpoint"
# 2: pieces record their in-file ``key`` (model tensors under bare names); 1: in-file key = global key
FORMAT_VERSION = 2
INDEX_NAME = CHECKPOINT_INDEX_NAME
# what PaddleNLP's / HF's from_pretrained reads: this index maps state_dict names to our model shard files
HF_WEIGHTS_INDEX_NAME = "model.safetensors.index.json"
TMP_INFIX = ".tmp-"
TRAINER_STATE_NAME = "trainer_state.json"
TRAINING_ARGS_NAME = "training_args.json"
SCHEDULER_NAME = "scheduler.json"
SCALER_NAME = "scaler.json"
DATA_STATE_NAME = "data_state.json"
CONFIG_NAME = "config.json"
HEADER_PART = "__header__"  # key of a safetensors file's header crc32 in its record's ``parts``

_OUR_SMALL_FILES = frozenset({TRAINER_STATE_NAME, TRAINING_ARGS_NAME, SCHEDULER_NAME, SCALER_NAME, DATA_STATE_NAME,
                               CONFIG_NAME, INDEX_NAME, HF_WEIGHTS_INDEX_NAME, CHECKPOINT_COMPLETE_MARKER})

MODEL_PREFIX = "model/"
OPTIM_PREFIX = "optim/"
MASTER_WEIGHT = "master_weight"  # the state kind of a parameter's fp32 master weight
POW_ACC_SUFFIX = "_pow_acc"  # Adam/AdamW/Lamb state kinds beta1_pow_acc, beta2_pow_acc: one value per parameter

_TMP_RE = re.compile(rf"^{PREFIX_CHECKPOINT_DIR}-(\d+){re.escape(TMP_INFIX)}.+$")


class CheckpointMismatchError(CheckpointError):
    """The checkpoint does not fit the model/optimizer (names or shapes); carries the list."""

    def __init__(self, mismatches: List[str]):
        self.mismatches = list(mismatches)
        shown = "\n  ".join(self.mismatches[:50])
        more = f"\n  ... and {len(self.mismatches) - 50} more" if len(self.mismatches) > 50 else ""
        super().__init__(f"checkpoint does not match the model ({len(self.mismatches)} problems):\n  {shown}{more}")


class CheckpointCorruptError(CheckpointError):
    """A file's size or checksum differs from the index; ``files`` names them."""

    def __init__(self, ckpt_dir: str, files: List[str], details: List[str]):
        self.files = list(files)
        super().__init__(f"corrupt checkpoint {ckpt_dir}: " + "; ".join(details))


# ----------------------------------------------------------------------------------------- names
def rank_suffix(tp_rank: int, pp_rank: int, sharding_rank: Optional[int] = None) -> str:
    """``tp00_pp01`` or ``tp00_pp01_shard01`` — the suffixes PaddleNLP users know."""
    s = f"tp{tp_rank:02d}_pp{pp_rank:02d}"
    return s if sharding_rank is None else f"{s}_shard{sharding_rank:02d}"


def model_file_name(tp_rank: int, pp_rank: int, sharding_rank: Optional[int] = None) -> str:
    """Model weights of one (tp, pp) cell; sharding rank only when weights are sharded (stage 3)."""
    return f"model_state.{rank_suffix(tp_rank, pp_rank, sharding_rank)}.safetensors"


def optimizer_file_name(tp_rank: int, pp_rank: int, sharding_rank: int) -> str:
    return f"optimizer.{rank_suffix(tp_rank, pp_rank, sharding_rank)}.safetensors"


def rng_file_name(coords: str) -> str:
    return f"rng_state.{coords}.json"


def legacy_rng_file_name(coords: str) -> str:
    """Where older checkpoints kept the RNG state as a pickle; the loader only detects it (never unpickles)."""
    return f"rng_state.{coords}.pkl"


def model_key(name: str) -> str:
    return MODEL_PREFIX + name


def file_key(key: str) -> str:
    """The key a tensor is stored under inside its safetensors file.

    Model tensors drop the ``model/`` prefix, because ``from_pretrained`` loads every tensor of a weights
    file under its in-file key; optimizer tensors keep their global key (their files are ours alone).
    """
    return key[len(MODEL_PREFIX):] if key.startswith(MODEL_PREFIX) else key


def stored_key(piece: dict, key: str) -> str:
    """In-file key of ``piece`` of tensor ``key`` (version-1 indexes record none: it is the global key)."""
    return piece.get("key", key)


def optim_key(param_name: str, kind: str) -> str:
    """Optimizer state keyed by the parameter's global name so it reshards exactly like the parameter."""
    return f"{OPTIM_PREFIX}{param_name}/{kind}"


def split_optim_key(key: str) -> Tuple[str, str]:
    """Inverse of :func:`optim_key` (param names contain dots, never a slash-separated kind)."""
    assert key.startswith(OPTIM_PREFIX), key
    name, kind = key[len(OPTIM_PREFIX):].rsplit("/", 1)
    return name, kind


def tmp_dir_name(ckpt_dir: str, unique_id: str) -> str:
    """Where a save into ``ckpt_dir`` writes before it is published (``checkpoint-N.tmp-<id>`` beside it)."""
    return f"{ckpt_dir}{TMP_INFIX}{unique_id}"


def is_tmp_dir_name(dir_name: str) -> bool:
    return _TMP_RE.match(dir_name) is not None


# every name our writer puts in a checkpoint directory (shards, per-rank RNG, small files, indexes, the marker)
_OUR_FILE_RE = re.compile(r"^(?:(?:model_state|optimizer)\.tp\d+_pp\d+(?:_shard\d+)?(?:_dp\d+)?\.safetensors"
                          r"|rng_state\.[A-Za-z0-9_]+\.(?:json|pkl))$")


def is_our_file_name(name: str) -> bool:
    """Whether ``name`` is a file name our checkpoint writer uses (what a staging dir of ours may hold)."""
    return name in _OUR_SMALL_FILES or _OUR_FILE_RE.match(name) is not None


# ------------------------------------------------------------------------------------ placements
@dataclasses.dataclass(frozen=True)
class Placement:
    """Where a local tensor sits in its global tensor.

    ``offsets``/``shape`` give the box; ``flat`` (optional) says the local data is only
    ``box.reshape(-1)[start:stop]`` (stage-3 style flat slicing of a possibly TP-split box).
    """

    global_shape: Tuple[int, ...]
    offsets: Tuple[int, ...]
    shape: Tuple[int, ...]
    flat: Optional[Tuple[int, int]] = None

    @property
    def local_numel(self) -> int:
        return (self.flat[1] - self.flat[0]) if self.flat else math.prod(self.shape)


def replicated(shape: Sequence[int]) -> Placement:
    shape = tuple(int(s) for s in shape)
    return Placement(shape, (0,) * len(shape), shape)


def tp_placement(local_shape: Sequence[int], split_axis: int, tp_rank: int, tp_degree: int) -> Placement:
    """A tensor-parallel slice: even split of ``split_axis`` (Paddle's mp layers require divisibility)."""
    local_shape = tuple(int(s) for s in local_shape)
    if not 0 <= split_axis < len(local_shape):
        raise ValueError(f"split_axis {split_axis} out of range for shape {local_shape}")
    gshape = list(local_shape)
    gshape[split_axis] *= tp_degree
    offsets = [0] * len(local_shape)
    offsets[split_axis] = tp_rank * local_shape[split_axis]
    return Placement(tuple(gshape), tuple(offsets), local_shape)


def flat_placement(box: Placement, start: int, stop: int) -> Placement:
    """Flat range ``[start, stop)`` of ``box`` (clipped to the box: stage 3 pads the last slice)."""
    n = math.prod(box.shape)
    start, stop = max(0, min(start, n)), max(0, min(stop, n))
    return dataclasses.replace(box, flat=(start, stop))


# ------------------------------------------------------------------------ a rank's tensors, named and placed
@dataclasses.dataclass(frozen=True)
class HeldTensor:
    """A model tensor this rank holds, as Paddle describes it (:mod:`.local_state` finds it)."""
    name: str  # its state_dict name
    shape: Tuple[int, ...]  # the parameter's local shape
    owners: Tuple[str, ...]  # the names its optimizer states are kept under: the parameter's, a stage-3 slice's
    storage_numel: int  # the elements of what is saved and loaded (a stage-3 slice: padded)
    split_axis: Optional[int] = None  # tensor parallel: the axis split evenly over the tp ranks
    declared: Optional[Placement] = None  # a placement the tensor declares (``ckpt_placement``)
    flat: Optional[Tuple[int, int]] = None  # sharding stage 3: the flat range of its box this rank's slice holds


@dataclasses.dataclass(frozen=True)
class HeldState:
    """An optimizer state this rank holds: of the parameter the optimizer knows as ``owner``, its kind and shape."""
    owner: str
    kind: str
    shape: Tuple[int, ...]


@dataclasses.dataclass
class Holdings:
    """Everything a rank holds, in Paddle's terms, for :func:`place_rank` to name and place."""
    tensors: List[HeldTensor]
    states: List[HeldState] = dataclasses.field(default_factory=list)
    # split_param: the flat range of its parameter that each slice parameter (by name) covers
    flat_ranges: Dict[str, Tuple[int, int]] = dataclasses.field(default_factory=dict)
    # the parameters this rank's optimizer updates (by name), each with its split_param flat range or None
    stepped: List[Tuple[str, Optional[Tuple[int, int]]]] = dataclasses.field(default_factory=list)
    offloaded: List[str] = dataclasses.field(default_factory=list)  # parameters with an offload master weight
    tp_rank: int = 0
    tp_degree: int = 1


@dataclasses.dataclass
class RankPlacements:
    """The global keys and placements of a rank's :class:`Holdings`, each list in the order held."""
    tensors: List[Tuple[str, Placement]]  # (model key, placement)
    states: List[Optional[Tuple[str, Placement]]]  # None: a split_param slice of padding only, nothing to keep
    offloaded: List[Optional[Tuple[str, int]]]  # (optim key, index of the tensor it masters); None: not held
    stepped: Set[str]  # global names of the parameters whose optimizer states belong to this rank


def place_rank(held: Holdings) -> RankPlacements:
    """Name and place what a rank holds. A model tensor's box: the placement it declares, else its tp slice, else
    the whole tensor; a stage-3 slice is a flat range of it. Optimizer states are keyed by their parameter's global
    name (tied weights: its first name) to reshard like it: beta powers replicated (one value per parameter, even
    a one-element one), a split_param slice's state its flat range, a state of the parameter's element count its
    placement, others replicated; an offload master weight its parameter's placement. Stepped: the parameters the
    optimizer updates (not a split_param slice of padding only) and every non-empty stage-3 slice this rank holds
    (told from the model: a slice whose states were never created counts)."""
    tensors = [(model_key(h.name), _box(h, held.tp_rank, held.tp_degree)) for h in held.tensors]
    owner: Dict[str, int] = {}
    for i, h in enumerate(held.tensors):
        for name in h.owners:
            owner.setdefault(name, i)

    def place_state(s: HeldState) -> Optional[Tuple[str, Placement]]:
        if s.owner not in owner:
            raise CheckpointError(f"optimizer state {s.kind} of {s.owner} belongs to no parameter of the model")
        i = owner[s.owner]
        key, box, numel = optim_key(held.tensors[i].name, s.kind), tensors[i][1], math.prod(s.shape)
        per_param = s.kind.endswith(POW_ACC_SUFFIX)
        flat = None if per_param else held.flat_ranges.get(s.owner)
        if flat is not None and numel == flat[1] - flat[0]:
            placement = flat_placement(box, *flat)
            return (key, placement) if placement.local_numel else None
        same = not per_param and numel == held.tensors[i].storage_numel
        return key, box if same else replicated(s.shape)

    stepped = {h.name for h, (_, p) in zip(held.tensors, tensors) if p.flat is not None and p.local_numel}
    for name, flat in held.stepped:
        if name in owner and (flat is None or flat_placement(tensors[owner[name]][1], *flat).local_numel):
            stepped.add(held.tensors[owner[name]].name)
    offloaded = [(optim_key(held.tensors[owner[n]].name, MASTER_WEIGHT), owner[n]) if n in owner else None
                 for n in held.offloaded]
    return RankPlacements(tensors, [place_state(s) for s in held.states], offloaded, stepped)


def _box(h: HeldTensor, tp_rank: int, tp_degree: int) -> Placement:
    box = h.declared if h.declared is not None else (
        tp_placement(h.shape, h.split_axis, tp_rank, tp_degree) if h.split_axis is not None else replicated(h.shape))
    return box if h.flat is None else flat_placement(box, *h.flat)


# ------------------------------------------------------------------------------------- overlaps
def box_overlap(
    a_off: Sequence[int], a_shape: Sequence[int], b_off: Sequence[int], b_shape: Sequence[int]
) -> Optional[Tuple[Tuple[int, ...], Tuple[int, ...]]]:
    """Intersection of two boxes in global coordinates: ``(offsets, shape)`` or None if empty.

    0-d boxes (scalars) always overlap with shape ``()``.
    """
    offs, shape = [], []
    for ao, asz, bo, bsz in zip(a_off, a_shape, b_off, b_shape):
        lo, hi = max(ao, bo), min(ao + asz, bo + bsz)
        if hi <= lo:
            return None
        offs.append(lo)
        shape.append(hi - lo)
    return tuple(offs), tuple(shape)


# ---------------------------------------------------------------------------------------- pieces
@dataclasses.dataclass(frozen=True)
class PieceEntry:
    """One rank's candidate piece of one tensor, before writers are chosen (all_gather'd metadata)."""

    key: str
    dtype: str
    placement: Placement
    rank: int
    file: str


def _piece_identity(e: PieceEntry) -> tuple:
    p = e.placement
    return (e.key, p.global_shape, p.offsets, p.shape, p.flat)


def assign_writers(entries_per_rank: Sequence[Sequence[PieceEntry]]) -> List[List[PieceEntry]]:
    """Each distinct piece is written once, by the lowest rank holding it (replicas across dp/tp/...).

    Pure: given everybody's candidates (same list on every rank), every rank computes the same answer,
    so no topology-specific "who writes" rules are needed (tied weights and TP-replicated norms included).
    Raises if two ranks disagree about a tensor's global shape or dtype — that is a bug upstream.
    """
    seen: Dict[tuple, int] = {}
    meta: Dict[str, Tuple[Tuple[int, ...], str]] = {}
    out: List[List[PieceEntry]] = [[] for _ in entries_per_rank]
    for rank, entries in enumerate(entries_per_rank):
        for e in entries:
            m = (e.placement.global_shape, e.dtype)
            if meta.setdefault(e.key, m) != m:
                raise CheckpointError(f"ranks disagree on {e.key}: {meta[e.key]} vs {m} (rank {rank})")
            ident = _piece_identity(e)
            if ident not in seen:
                seen[ident] = rank
                out[rank].append(e)
    return out


def coverage_problems(tensors: Dict[str, dict]) -> List[str]:
    """Tensors whose pieces do not add up to the full tensor (a layout description bug or lost rank)."""
    problems = []
    for key, t in tensors.items():
        total = math.prod(t["shape"])
        covered = sum(
            (p["flat"][1] - p["flat"][0]) if p.get("flat") else math.prod(p["shape"]) for p in t["pieces"]
        )
        # pieces never overlap (assign_writers dedups identical ones; layouts partition), so a sum suffices
        if covered != total:
            problems.append(f"{key}: pieces cover {covered} of {total} elements")
    return problems


def build_index(
    pieces: Iterable[PieceEntry],
    files: Dict[str, Dict[str, object]],
    topology: Dict[str, int],
    extra: Optional[Dict[str, object]] = None,
) -> dict:
    """The index JSON: format, writing topology, per-file size/crc32, per-tensor shape/dtype/pieces."""
    tensors: Dict[str, dict] = {}
    for e in sorted(pieces, key=lambda e: (e.key, e.placement.offsets, e.placement.flat or (0, 0))):
        t = tensors.setdefault(e.key, {"shape": list(e.placement.global_shape), "dtype": e.dtype, "pieces": []})
        p = {"file": e.file, "key": file_key(e.key), "offsets": list(e.placement.offsets),
             "shape": list(e.placement.shape)}
        if e.placement.flat is not None:
            p["flat"] = list(e.placement.flat)
        t["pieces"].append(p)
    problems = coverage_problems(tensors)
    if problems:
        raise CheckpointError("incomplete checkpoint description: " + "; ".join(problems[:20]))
    index = {
        "format": FORMAT_NAME,
        "version": FORMAT_VERSION,
        "topology": dict(topology),
        "files": {f: dict(files[f]) for f in sorted(files)},
        "tensors": tensors,
    }
    if extra:
        index.update(extra)
    return index


def whole_weight_map(index: dict) -> Tuple[Optional[Dict[str, str]], str]:
    """``({state_dict name: file}, "")`` when every model tensor is stored whole, else ``(None, why not)``.

    "Whole" means one piece per tensor holding all of it under its bare name: no tensor-parallel split and
    no stage-3 flat slices (pipeline stages and sharding stages 1/2 keep weights whole). bfloat16 weights do
    not qualify: numpy has no bfloat16, so their files label them ``U16`` and another reader would take the
    bits for integers (``paddletrainer-merge-checkpoint`` exports them as ``model_state.pdparams``).
    The map is what ``model.safetensors.index.json`` needs to make the checkpoint loadable by ``from_pretrained``.
    """
    weight_map: Dict[str, str] = {}
    for key in sorted(index["tensors"]):
        if not key.startswith(MODEL_PREFIX):
            continue
        t = index["tensors"][key]
        piece = t["pieces"][0]
        if len(t["pieces"]) != 1 or piece.get("flat") or list(piece["shape"]) != list(t["shape"]):
            return None, f"{key} is stored in {len(t['pieces'])} slices (tensor parallel or sharding stage 3)"
        if t["dtype"] == "bfloat16":
            return None, f"{key} is bfloat16, which safetensors files written from numpy cannot label"
        name = stored_key(piece, key)
        if name != file_key(key):
            return None, f"{key} is stored under {name!r} (a checkpoint written before format version 2)"
        weight_map[name] = piece["file"]
    if not weight_map:
        return None, "the checkpoint has no model weights"
    return weight_map, ""


def hf_weights_index(index: dict, weight_map: Dict[str, str]) -> dict:
    """The ``model.safetensors.index.json`` content: total byte size of the weights and the weight map."""
    total = 0
    for name in weight_map:
        t = index["tensors"][MODEL_PREFIX + name]
        total += math.prod(t["shape"]) * _DTYPE_BYTES.get(t["dtype"], 4)
    return {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}


_DTYPE_BYTES = {"float64": 8, "int64": 8, "uint64": 8, "float32": 4, "int32": 4, "uint32": 4, "float16": 2,
                "bfloat16": 2, "int16": 2, "uint16": 2, "int8": 1, "uint8": 1, "bool": 1}


def pieces_for(index: dict, key: str, target: Placement) -> List[dict]:
    """Pieces of ``key`` whose box overlaps the target's box (flat pieces are filtered by rows later)."""
    t = index["tensors"][key]
    return [
        p
        for p in t["pieces"]
        if box_overlap(p["offsets"], p["shape"], target.offsets, target.shape) is not None
    ]


def compare_to_index(
    index: dict, expected: Dict[str, Tuple[Tuple[int, ...], str]], complete_model: bool, prefix: str = MODEL_PREFIX,
    elsewhere=None,
) -> List[str]:
    """Mismatches between what the local model expects (global key -> (global shape, dtype)) and the index.

    ``complete_model``: the local model holds every tensor (no pipeline split), so keys in the checkpoint
    that the model lacks are reported too, except those ``elsewhere(key)`` says another rank holds (expert
    parallel: the other ranks' experts). Dtype differences are not mismatches (loading casts).
    """
    stored = index["tensors"]
    problems = []
    for key, (shape, _dtype) in sorted(expected.items()):
        if key not in stored:
            problems.append(f"missing in checkpoint: {key} {list(shape)}")
        elif list(stored[key]["shape"]) != list(shape):
            problems.append(f"shape mismatch: {key} checkpoint {stored[key]['shape']} vs model {list(shape)}")
    if complete_model:
        for key in sorted(stored):
            if key.startswith(prefix) and key not in expected and not (elsewhere and elsewhere(key)):
                problems.append(f"unexpected in checkpoint: {key} {stored[key]['shape']}")
    return problems


def unplaced_optimizer_states(index: dict, stepped: Iterable[str], placed: Iterable[str]) -> List[str]:
    """Optimizer states in the checkpoint of parameters this rank's optimizer updates (``stepped``: global
    parameter names) that have no local tensor to go to (``placed``: the keys being loaded): they would
    silently not be restored (e.g. AdamW moments into an optimizer without them, or a layout whose states
    were never created). States of parameters another rank updates (sharding) are not listed."""
    stepped, placed = set(stepped), set(placed)
    return [key for key in sorted(index["tensors"]) if key.startswith(OPTIM_PREFIX) and key not in placed
            and split_optim_key(key)[0] in stepped]


@dataclasses.dataclass
class LoadPlan:
    """What one rank's load needs from a checkpoint, planned once from its index (:func:`plan_load`)."""

    problems: List[str]  # every target that does not fit the index: the load refuses them all at once
    unplaced: List[str]  # :func:`unplaced_optimizer_states`
    needed: Dict[str, set]  # file -> in-file keys of the stored pieces overlapping a target (empty on problems)
    whole: Dict[str, Tuple[str, str]]  # target key -> (file, in-file key) of the one stored piece it equals
    # this rank's RNG file and where an older checkpoint kept it as a pickle (None, None: no cell given)
    rng_files: Tuple[Optional[str], Optional[str]] = (None, None)


# a load target as the plan sees it: (where it sits, its dtype name, its storage's element count)
LoadTarget = Tuple[Placement, str, int]


def plan_load(index: dict, models: Dict[str, LoadTarget], optims: Dict[str, LoadTarget], *, complete_model: bool,
              elsewhere=None, stepped: Optional[Iterable[str]] = None, rng_cell: Optional[str] = None) -> LoadPlan:
    """Plan a load of ``models`` and, when ``stepped`` (the global names of the parameters this rank's optimizer
    updates) is given, of ``optims`` from a checkpoint with ``index``: their misfits (:func:`compare_to_index`;
    ``complete_model``, ``elsewhere`` as there), the unplaced optimizer states, and, when everything fits, the
    stored pieces to read per file and the targets one stored piece fills exactly (same box, same dtype, no
    flat slice or padding: their bytes can be read straight into the tensor). ``rng_cell``: this rank's cell
    name (:meth:`~..parallel.layout.Layout.cell_name`), whose RNG file names the plan carries."""
    rng_files = (rng_file_name(rng_cell), legacy_rng_file_name(rng_cell)) if rng_cell is not None else (None, None)

    def shapes(targets):
        return {k: (placement.global_shape, dtype) for k, (placement, dtype, _) in targets.items()}

    problems = compare_to_index(index, shapes(models), complete_model=complete_model, elsewhere=elsewhere)
    unplaced: List[str] = []
    if stepped is not None:
        problems += compare_to_index(index, shapes(optims), complete_model=False, prefix=OPTIM_PREFIX)
        unplaced = unplaced_optimizer_states(index, stepped, [*models, *optims])
    if problems:
        return LoadPlan(problems, unplaced, {}, {}, rng_files)
    needed: Dict[str, set] = {}
    whole: Dict[str, Tuple[str, str]] = {}
    for key, (target, dtype, storage_numel) in {**models, **optims}.items():
        info = index["tensors"][key]
        for piece in pieces_for(index, key, target):
            needed.setdefault(piece["file"], set()).add(stored_key(piece, key))
        if target.flat is not None or info["dtype"] != dtype or storage_numel != target.local_numel:
            continue
        same = [p for p in info["pieces"] if not p.get("flat") and tuple(p["offsets"]) == tuple(target.offsets)
                and tuple(p["shape"]) == tuple(target.shape)]
        if same:
            whole[key] = (same[0]["file"], stored_key(same[0], key))
    return LoadPlan(problems, unplaced, needed, whole, rng_files)


# ------------------------------------------------------------------------------------- rotation
def select_checkpoints_to_delete(
    steps: Sequence[int], save_total_limit: Optional[int], best_step: Optional[int] = None, keep: Iterable[int] = ()
) -> List[int]:
    """Oldest complete checkpoints beyond ``save_total_limit``; never the newest, the best nor those in ``keep``.

    So ``save_total_limit=1`` with a best that is not the newest keeps two (like HF/PaddleNLP).
    """
    if not save_total_limit or save_total_limit <= 0:
        return []
    ordered = sorted(set(steps))
    if not ordered:
        return []
    protected = {ordered[-1], *keep} | ({best_step} if best_step is not None else set())
    keep = len(ordered)
    doomed = []
    for s in ordered:
        if keep <= save_total_limit:
            break
        if s in protected:
            continue
        doomed.append(s)
        keep -= 1
    return doomed


def _writer_file_name(kind: str, coords: Tuple[int, int, int, int], level: int) -> str:
    tp, pp, shard, dp = coords
    if kind == "model":
        name = model_file_name(tp, pp, shard if level >= 1 else None)
    else:
        name = optimizer_file_name(tp, pp, shard)
    if level >= 2:
        name = name.replace(".safetensors", f"_dp{dp:02d}.safetensors")
    return name


def file_names_for_writers(
    coords_per_rank: Sequence[Tuple[int, int, int, int]], assigned: Sequence[Sequence[PieceEntry]]
) -> List[Dict[str, str]]:
    """``[{kind: file name}]`` per rank for the kinds ("model"/"optimizer") it writes.

    The familiar name (``model_state.tp00_pp01``) is used when the writers of a kind have distinct
    (tp, pp); sharding (stage 3: every sharding rank writes weight slices) and then dp coordinates are
    added only when needed to keep one file per writer. ``coords`` = (tp, pp, sharding, dp).
    """
    out: List[Dict[str, str]] = [{} for _ in coords_per_rank]
    for kind in ("model", "optimizer"):
        writers = [r for r, ents in enumerate(assigned) if any(e.file == kind for e in ents)]
        for level in (0, 1, 2):
            names = [_writer_file_name(kind, tuple(coords_per_rank[r]), level) for r in writers]
            if len(set(names)) == len(names):
                break
        else:
            raise CheckpointError(f"two ranks share coordinates {coords_per_rank}")
        for r, n in zip(writers, names):
            out[r][kind] = n
    return out
