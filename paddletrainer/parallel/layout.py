"""The process layout as one type addressed by axis name: :data:`AXES` and :class:`Layout`.

Pure (no paddle): ``TrainingArguments`` resolves a :class:`Layout` before any process group exists, the
:class:`~paddletrainer.parallel.topology.Topology` adds this rank's coordinates and groups to it, and the
checkpoint names per-rank files and records the writing layout with it.

Every per-axis fact the library needs lives in the axis's :class:`Axis` entry: the option that sets its
degree, fleet's name for it, the Paddle getters of its group and rank, the label in per-rank file names,
and whether ranks along it read different samples. Code that loops over axes reads them from here (at call
time, never a copy taken at import), so a new axis is one entry plus its degree field on :class:`Layout`; its
option is read, re-checked when a script changes it and no longer refused because it is named here.

Rank layout: fleet orders the axes as ``order`` (outermost first) and numbers ranks in row-major order
over that grid, the last axis ("mp") varying fastest. :meth:`Layout.coordinates` reproduces that
arithmetic without processes.
"""
from __future__ import annotations

import dataclasses
import os
from typing import Dict, Mapping, Optional, Sequence, Tuple

__all__ = ["AXES", "Axis", "Layout", "DEFAULT_TOPO_ORDER", "NUM_EXPERTS_FIELDS", "axis", "coordinates_of", "hybrid_order",
           "launch_world_size", "launch_rank", "launch_local_rank", "option_axes"]


@dataclasses.dataclass(frozen=True)
class Axis:
    """One parallel axis: how the library names it and where Paddle keeps its group."""

    name: str  # our name, the attribute on Layout and the key in coordinates/degrees/groups
    option: str  # the TrainingArguments option whose value becomes the degree (for error messages)
    fleet: str  # fleet's name in hybrid_configs ("<fleet>_degree") and in the axis order
    label: str  # in per-rank file names: "<label><rank:02d>"
    splits_data: bool  # ranks along this axis read different samples
    hcg_group: str  # HybridCommunicateGroup method returning the axis's group
    hcg_rank: str  # HybridCommunicateGroup method returning this rank's coordinate
    # Named in per-rank file names and the checkpoint's recorded layout even at degree 1. The first four axes
    # are; an axis added later is named only when active, so existing checkpoints keep their names.
    named_at_degree_1: bool = True
    # The degree is what the other axes leave of the world size (data parallel): no option of its own.
    remainder: bool = False


AXES: Tuple[Axis, ...] = (
    Axis("dp", "data parallel (what the world size leaves)", "dp", "dp", True,
         "get_data_parallel_group", "get_data_parallel_rank", remainder=True),
    Axis("sharding", "sharding_parallel_degree", "sharding", "shard", True,
         "get_sharding_parallel_group", "get_sharding_parallel_rank"),
    Axis("tp", "tensor_parallel_degree", "mp", "tp", False,
         "get_model_parallel_group", "get_model_parallel_rank"),
    Axis("pp", "pipeline_parallel_degree", "pp", "pp", False,
         "get_pipe_parallel_group", "get_stage_id"),
    # sequence-segment parallel (Ulysses): the ranks of a sep group read the same samples and each keeps one
    # contiguous segment of every sequence (the Trainer cuts it: parallel/segment.py)
    Axis("sep", "sep_parallel_degree", "sep", "sep", False,
         "get_sep_parallel_group", "get_sep_parallel_rank", named_at_degree_1=False),
    # ring context parallel: the ranks read the same samples, each keeps the head/tail chunks r and 2·cp−1−r of
    # every sequence (parallel/context.py). PaddleNLP 3.0.0b4 runs it on fleet's *sep* groups (its
    # TrainingArguments pass sep_degree = context_parallel_degree, and Llama's ring attention, positions and
    # loss read the sep group), so cp shares fleet's "sep" entry; sep and cp are never both > 1.
    Axis("cp", "context_parallel_degree", "sep", "cp", False,
         "get_sep_parallel_group", "get_sep_parallel_rank", named_at_degree_1=False),
)

# Model-config fields that name the number of routed experts (PaddleNLP's MoE models and the MoE example's):
# what ``Layout.ep`` must divide (parallel.expert checks the model; the planner refuses a config it cannot price).
NUM_EXPERTS_FIELDS = ("num_experts", "moe_num_experts", "n_routed_experts", "num_local_experts")

# fleet's axis orders (fleet names, outermost first). cp is always 1 here but stays in the order so the grid
# has the same shape fleet builds by default.
PP_FIRST = ("dp", "pp", "sharding", "sep", "cp", "mp")
SHARDING_FIRST = ("dp", "sharding", "pp", "sep", "cp", "mp")
TOPO_ORDERS = {"pp_first": PP_FIRST, "sharding_first": SHARDING_FIRST}  # hybrid_parallel_topo_order's values
# hybrid_parallel_topo_order when none is given (PaddleNLP's): the Layout's default, and what TrainingArguments
# writes into a None field.
DEFAULT_TOPO_ORDER = "pp_first"


def axis(name: str) -> Axis:
    """The :class:`Axis` called ``name`` (ours, or fleet's: "mp" is "tp")."""
    found = next((a for a in AXES if a.name == name), None) or next((a for a in AXES if a.fleet == name), None)
    if found is None:
        raise KeyError(f"no parallel axis {name!r}; axes: {', '.join(a.name for a in AXES)}")
    return found


def option_axes() -> Tuple[Axis, ...]:
    """The axes whose degree a ``TrainingArguments`` option sets (every axis but the remainder, dp), in
    :data:`AXES` order: the options ``TrainingArguments`` reads, re-checks when changed and does not refuse."""
    return tuple(a for a in AXES if not a.remainder)


def hybrid_order(topo_order: str) -> tuple:
    """fleet's axis order for ``hybrid_parallel_topo_order`` ("pp_first" or "sharding_first")."""
    if topo_order not in TOPO_ORDERS:
        raise ValueError(f"hybrid_parallel_topo_order must be 'pp_first' or 'sharding_first', got {topo_order!r}")
    return TOPO_ORDERS[topo_order]


def coordinates_of(rank: int, degrees: Mapping[str, int], order: Sequence[str]) -> dict:
    """The coordinate of ``rank`` on every axis of a row-major grid ordered by ``order`` (fleet names).

    ``degrees`` maps axis names to sizes (missing axes have size 1; our names are accepted for fleet's, e.g.
    "tp" for "mp"). Example, order (dp, pp, sharding, mp) with degrees dp2·pp2·sharding2·mp2: strides are 8,
    4, 2, 1, so rank 13 = 1·8 + 1·4 + 0·2 + 1·1 is dp 1, pp 1, sharding 0, mp 1. Keys are ``order``'s names.
    """
    fleet_of = {a.name: a.fleet for a in AXES}
    sizes_by_name = {}
    for k, v in degrees.items():  # sep and cp share fleet's "sep" (at most one of them > 1): their product
        fleet_name = fleet_of.get(k, k)
        sizes_by_name[fleet_name] = sizes_by_name.get(fleet_name, 1) * int(v)
    sizes = [sizes_by_name.get(name, 1) for name in order]
    world = 1
    for size in sizes:
        world *= size
    if not 0 <= rank < world:
        raise ValueError(f"rank {rank} is outside a world of {world} processes ({dict(zip(order, sizes))})")
    coords = {}
    for name, size in reversed(list(zip(order, sizes))):
        coords[name] = rank % size
        rank //= size
    return {name: coords[name] for name in order}


@dataclasses.dataclass(frozen=True)
class Layout:
    """The resolved process layout: one degree per axis of :data:`AXES`, ``world_size`` their product, and
    fleet's axis order (``topo_order``: "pp_first" or "sharding_first")."""

    world_size: int
    dp: int = 1
    sharding: int = 1
    tp: int = 1
    pp: int = 1
    sep: int = 1
    cp: int = 1
    # expert parallel: not a grid axis (it multiplies nothing) but carved from the data ranks: groups of ``ep``
    # consecutive data ranks (data_rank // ep the replica, data_rank % ep the ep rank) split the experts
    ep: int = 1
    # Not part of equality: two layouts with the same degrees compare equal; init_topology compares it itself.
    topo_order: str = dataclasses.field(default=DEFAULT_TOPO_ORDER, compare=False)

    def __post_init__(self):
        product = 1
        for a in AXES:
            degree = self.degree(a.name)
            if isinstance(degree, bool) or not isinstance(degree, int) or degree < 1:
                raise ValueError(f"{a.option}: degree {degree!r} is invalid, must be an integer >= 1")
            product *= degree
        if product != self.world_size:
            raise ValueError(f"parallel degrees {self.describe()} = {product} do not match the world size "
                             f"{self.world_size}")
        if self.sep > 1 and self.cp > 1:  # one fleet axis serves both
            raise ValueError(f"sep_parallel_degree={self.sep} and context_parallel_degree={self.cp} cannot both be > 1 "
                             "(both run on fleet's sep axis): pick one")
        hybrid_order(self.topo_order)  # raises for an unknown order
        if isinstance(self.ep, bool) or not isinstance(self.ep, int) or self.ep < 1:
            raise ValueError(f"expert_parallel_degree: degree {self.ep!r} is invalid, must be an integer >= 1")
        if self.data_world_size % self.ep:
            raise ValueError(f"expert_parallel_degree={self.ep} does not divide the data ranks (data parallel × "
                             f"sharding = {self.data_world_size} in {self.describe()}): expert parallel is carved "
                             f"from the data ranks; use a divisor of {self.data_world_size}")

    def degree(self, name: str) -> int:
        """The degree of axis ``name`` (ours or fleet's)."""
        return getattr(self, axis(name).name)

    @property
    def degrees(self) -> Dict[str, int]:
        """``{axis name: degree}`` in :data:`AXES` order."""
        return {a.name: self.degree(a.name) for a in AXES}

    @property
    def use_hybrid(self) -> bool:
        """True when any axis other than plain data parallel is active (fleet hybrid groups are needed)."""
        return any(d > 1 for name, d in self.degrees.items() if name != "dp")

    @property
    def data_world_size(self) -> int:
        """Distinct data streams: the product of the data-splitting axes (dp × sharding)."""
        size = 1
        for a in AXES:
            if a.splits_data:
                size *= self.degree(a.name)
        return size

    @property
    def fleet_order(self) -> tuple:
        return hybrid_order(self.topo_order)

    def coordinates(self, rank: int) -> Dict[str, int]:
        """``rank``'s coordinate on every axis (our names), as fleet places it."""
        by_fleet = coordinates_of(rank, self.degrees, self.fleet_order)
        # an axis at degree 1 is at 0 (sep and cp share fleet's "sep" coordinate: only the active one holds it)
        return {a.name: by_fleet[a.fleet] if self.degree(a.name) > 1 else 0 for a in AXES}

    def data_rank(self, coords: Mapping[str, int]) -> int:
        """Which data stream a rank at ``coords`` reads: mixed radix over the data-splitting axes (dp major),
        PaddleNLP's ``dataset_rank = dp_rank · sharding_degree + sharding_rank``."""
        index = 0
        for a in AXES:
            if a.splits_data:
                index = index * self.degree(a.name) + int(coords[a.name])
        return index

    def _named_axes(self):
        return [a for a in AXES if a.named_at_degree_1 or self.degree(a.name) > 1]

    def as_dict(self) -> Dict[str, int]:
        """``{"world_size", "<axis>_degree" ...}``: the writing layout a checkpoint index records."""
        named = {"world_size": self.world_size, **{f"{a.name}_degree": self.degree(a.name) for a in self._named_axes()}}
        if self.ep > 1:  # named only when active, so checkpoints without experts keep their recorded layout
            named["ep_degree"] = self.ep
        return named

    def ep_coordinates(self, coords: Mapping[str, int]) -> Tuple[int, int]:
        """``(ep rank, expert-data-parallel replica)`` of a rank at ``coords``: its data rank modulo ``ep`` and
        divided by ``ep`` (the ep group is ``ep`` consecutive data ranks of one cell of the other axes)."""
        data_rank = self.data_rank(coords)
        return data_rank % self.ep, data_rank // self.ep

    def fleet_degrees(self) -> Dict[str, int]:
        """``{"<fleet name>_degree": degree}`` for fleet's ``hybrid_configs``."""
        return {f"{a.fleet}_degree": self.degree(a.name) for a in self._named_axes()}  # fleet's default is 1

    def cell_name(self, coords: Mapping[str, int]) -> str:
        """A rank's full coordinates as a file-name part, e.g. ``dp00_shard00_tp01_pp00``."""
        return "_".join(f"{a.label}{int(coords.get(a.name, 0)):02d}" for a in self._named_axes())

    def describe(self) -> str:
        """``dp2·sharding1·tp2·pp2`` (for messages; a later axis only when active, ``...·sep2``)."""
        text = "·".join(f"{a.name}{self.degree(a.name)}" for a in self._named_axes())
        return text + (f"·ep{self.ep}" if self.ep > 1 else "")


def _env_int(name: str, default: Optional[int]) -> Optional[int]:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"environment variable {name}={raw!r} is not an integer") from None


def launch_world_size() -> int:
    """Processes started by the launcher (``PADDLE_TRAINERS_NUM``, default 1)."""
    world = _env_int("PADDLE_TRAINERS_NUM", 1)
    if world < 1:
        raise ValueError(f"environment variable PADDLE_TRAINERS_NUM={world} is invalid: must be >= 1")
    return world


def launch_rank() -> int:
    """This process's global rank (``PADDLE_TRAINER_ID``, default 0)."""
    return _env_int("PADDLE_TRAINER_ID", 0)


def launch_local_rank() -> Optional[int]:
    """This process's rank on its node: ``PADDLE_RANK_IN_NODE`` (what ``paddle.distributed.launch`` sets),
    else ``PADDLE_LOCAL_RANK``; None when neither is set."""
    local = _env_int("PADDLE_RANK_IN_NODE", None)
    return local if local is not None else _env_int("PADDLE_LOCAL_RANK", None)
