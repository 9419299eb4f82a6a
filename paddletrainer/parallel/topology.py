"""Process topology: ``ParallelConfig`` → ``fleet.DistributedStrategy`` → ``fleet.init`` → :class:`Topology`.

This module holds the library's only ``fleet.init`` call. The layout comes resolved and checked from
``TrainingArguments.parallel_config`` (PaddleNLP's rules, :mod:`.config`), so nothing here decides a layout;
it only builds the process groups for it.

Layouts:

* world size 1: no process group at all.
* plain data parallel (dp > 1, every other degree 1): ``paddle.distributed.init_parallel_env()`` and
  later :func:`~.data_parallel.apply_data_parallel` (PaddleNLP's choice of groups, ``paddle.DataParallel``'s
  job without its second copy of the gradients); there is no hybrid group (``hcg`` None).
* anything else: ``fleet.init(is_collective=True, strategy=...)`` with hybrid_configs.

Per-axis facts (fleet's names, the group getters) come from :data:`~.layout.AXES`; the rank arithmetic is
:meth:`~.layout.Layout.coordinates`, checked against fleet's placement here.
"""
from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any, Mapping, Optional

import paddle.distributed as dist
from paddle.distributed import fleet

from .. import paddle_contract
from ..device import has_accelerator
from . import cpu as cpu_backend
from .config import ParallelConfig, expect_config
from .layout import (AXES, DEFAULT_TOPO_ORDER, Layout, axis, coordinates_of, hybrid_order, launch_local_rank,
                     launch_rank, launch_world_size)
from . import host_allocator, tcp_store
from .tcp_store import prime_launcher_store

__all__ = [
    "Topology",
    "init_topology",
    "get_topology",
    "coordinates_of",
    "hybrid_order",
    "build_strategy",
    "check_cpu_options",
    "needs_cpu_backend",
    "expert_group_ranks",
    "reset_for_tests",
]

_TOPOLOGY = None
logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Topology:
    """Where this process sits in the layout, and the process groups, addressed by axis name.

    ``degree(axis)``, ``coord(axis)`` and ``group(axis)`` take an axis name of :data:`~.layout.AXES` ("dp",
    "sharding", "tp", "pp"); ``<axis>_degree``, ``<axis>_rank`` and ``<axis>_group`` are the same as
    attributes. ``data_rank`` / ``data_world_size`` index the data split: data is split over the
    data-splitting axes only (dp × sharding; tensor- and pipeline-parallel ranks of one data rank read the
    same samples). Groups are a ``paddle.distributed`` Group, or None when the axis has size 1.
    """

    layout: Layout
    rank: int = 0
    local_rank: int = 0
    coords: Mapping[str, int] = dataclasses.field(default_factory=dict, hash=False)  # axis → this rank's coordinate
    hcg: Any = dataclasses.field(default=None, repr=False, compare=False)
    groups: Mapping[str, Any] = dataclasses.field(default_factory=dict, repr=False, compare=False)
    build_seconds: float = dataclasses.field(default=0.0, repr=False, compare=False)  # init_topology's wall time

    def __post_init__(self):
        if not self.coords:  # default: where fleet places ``rank``
            object.__setattr__(self, "coords", self.layout.coordinates(self.rank))

    @classmethod
    def of(cls, rank: int = 0, local_rank: int = 0, groups: Optional[Mapping[str, Any]] = None, hcg=None,
           topo_order: str = DEFAULT_TOPO_ORDER, **axes: int) -> "Topology":
        """A Topology from keyword degrees and ranks: ``Topology.of(dp_degree=2, tp_degree=2, tp_rank=1)``
        (missing degrees are 1; missing ranks follow from ``rank``). For tests and tools."""
        degrees = {a.name: int(axes.pop(f"{a.name}_degree", 1)) for a in AXES}
        world = int(axes.pop("world_size", 0)) or _product(degrees.values())
        layout = Layout(world_size=world, topo_order=topo_order, **degrees)
        coords = layout.coordinates(rank) if rank < world else {a.name: 0 for a in AXES}
        coords.update({a.name: int(axes.pop(f"{a.name}_rank")) for a in AXES if f"{a.name}_rank" in axes})
        if axes:
            raise TypeError(f"Topology.of: unknown argument(s) {sorted(axes)}")
        return cls(layout=layout, rank=rank, local_rank=local_rank, coords=coords, hcg=hcg, groups=groups or {})

    # ------------------------------------------------------------------ by axis name
    def degree(self, name: str) -> int:
        return self.layout.degree(name)

    def coord(self, name: str) -> int:
        return int(self.coords[axis(name).name])

    def group(self, name: str):
        """The group of an axis, or "data" (dp × sharding), "ep" / "edp" (expert parallel and expert data
        parallel, see :func:`expert_group_ranks`); None when it has one rank."""
        return self.groups.get(name if name in ("data", "ep", "edp") else axis(name).name)

    # ------------------------------------------------------------------ derived
    @property
    def world_size(self) -> int:
        return self.layout.world_size

    @property
    def order(self) -> tuple:
        """fleet's axis order (fleet names, outermost first)."""
        return self.layout.fleet_order

    @property
    def data_rank(self) -> int:
        """dp_rank · sharding_degree + sharding_rank (PaddleNLP's dataset_rank)."""
        return self.layout.data_rank(self.coords)

    @property
    def data_world_size(self) -> int:
        """dp_degree · sharding_degree (PaddleNLP's dataset_world_size)."""
        return self.layout.data_world_size

    @property
    def is_first_stage(self) -> bool:
        return self.coord("pp") == 0

    @property
    def is_last_stage(self) -> bool:
        return self.coord("pp") == self.degree("pp") - 1

    @property
    def use_hybrid(self) -> bool:
        """True when fleet's hybrid groups exist (any axis but dp > 1 in a multi-process run)."""
        return self.hcg is not None

    @property
    def data_group(self):
        """The group spanning the data-splitting axes (dp × sharding) of this rank's cell, for loss averaging."""
        return self.groups.get("data")


def _axis_attributes(name: str):
    return (property(lambda self: self.degree(name), doc=f"degree of the {name} axis"),
            property(lambda self: self.coord(name), doc=f"this rank's coordinate on the {name} axis"),
            property(lambda self: self.groups.get(name), doc=f"the {name} group (None when its degree is 1)"))


# ``topology.tp_degree`` / ``tp_rank`` / ``tp_group`` ... for every axis, so a new axis needs no edit here.
for _axis in AXES:
    for _suffix, _prop in zip(("degree", "rank", "group"), _axis_attributes(_axis.name)):
        setattr(Topology, f"{_axis.name}_{_suffix}", _prop)


def _product(values) -> int:
    out = 1
    for v in values:
        out *= int(v)
    return out


def get_topology() -> Optional[Topology]:
    """The topology built by :func:`init_topology` in this process, or None."""
    return _TOPOLOGY


def reset_for_tests() -> None:
    """Forget this process's parallel state, so the next :func:`init_topology` is a first call again: the
    Topology, the launcher store's disconnect priming (``tcp_store``) and the CPU backend's per-group stores.

    The process-global state is right for a run (a process has one fleet), and the library never calls this.
    It is for tests that build several single-process topologies in one process (``tests/unit``), instead of
    patching private names. It undoes neither ``fleet.init`` nor the CPU backend's patches of Paddle (they stay
    installed and ``cpu_backend.is_installed()`` stays True: installing again would wrap Paddle's functions
    twice), so another multi-process layout still needs its own processes.
    """
    global _TOPOLOGY
    _TOPOLOGY = None
    tcp_store._reset_for_tests()
    cpu_backend._reset_for_tests()


def build_strategy(config: ParallelConfig, on_cpu: bool):
    """The ``fleet.DistributedStrategy`` for a :class:`ParallelConfig`, PaddleNLP's construction:

    * hybrid_configs: the degrees, the axis order and pp_configs, set in one assignment (the setter
      works once per key group), then ``sharding_configs`` and ``mp_configs`` fields by attribute mutation:
      assigning them as a dict raises "Assignment not allowed to message field".
    * pipeline_configs: accumulate_steps = gradient_accumulation_steps, micro_batch_size =
      per_device_train_batch_size; partial send/recv off on CPU (gloo has no all_gather_partial).
    * tensor_parallel_configs: tensor_init_seed = seed, so tp ranks draw the same init streams.
    """
    layout = expect_config(config, "build_strategy").layout
    pp_options, sharding_options, tp_options = config.pipeline_options, config.sharding_options, config.tensor_options
    strategy = fleet.DistributedStrategy()
    if layout.pp > 1:
        partial = not on_cpu and "disable_partial_send_recv" not in pp_options
        strategy.pipeline_configs = {
            "accumulate_steps": int(config.accumulate_steps),
            "micro_batch_size": int(config.micro_batch_size),
            "enable_partial_send_recv": partial,
            "p2p_cache_shape": "disable_p2p_cache_shape" not in pp_options,
        }
    if layout.tp > 1:
        strategy.tensor_parallel_configs = {"tensor_init_seed": int(config.seed)}
    strategy.hybrid_configs = {
        **layout.fleet_degrees(),
        "pp_configs": {
            "delay_scale_loss": "enable_delay_scale_loss" in pp_options,  # the Trainer divides the grads
            "clear_every_step_cache": "enable_clear_every_step_cache" in pp_options,
            "use_batch_p2p_comm": "disable_batch_p2p_comm" not in pp_options,
            "enable_timer": "enable_timer" in pp_options,
        },
        "order": list(layout.fleet_order),
    }
    sharding_configs = strategy.hybrid_configs["sharding_configs"]
    # tensor fusion and comm overlap are refused by the arguments' builder (REFUSED_PARALLEL_OPTIONS).
    sharding_configs.split_param = "split_param" in sharding_options  # stage1 V2 (parallel/sharding.py)
    sharding_configs.accumulate_steps = int(config.accumulate_steps)
    # Off on CPU anyway (gloo has no avg reduce), so the CPU tests run the sum-then-scale path this selects.
    sharding_configs.use_reduce_avg = "disable_stage1_reduce_avg" not in sharding_options
    # HybridParallelOptimizer._step broadcasts tp rank 0's replicated params / grads / moments. Paddle's
    # defaults (sync_param on for names containing "embedding", "layer_norm", ".b_") stay unless an option is
    # given; then, as PaddleNLP, every replicated parameter is synced ("" matches any name) and only the named
    # syncs are switched on — none is ever switched off.
    sync = [name for name in ("sync_param", "sync_grad", "sync_moment") if name in tp_options]
    if sync:
        strategy.sync_param_name = [""]
        mp_configs = strategy.hybrid_configs["mp_configs"]
        for name in sync:
            setattr(mp_configs, name, True)
    return strategy


def check_cpu_options(config: ParallelConfig) -> None:
    """Raise for options Paddle's CPU build cannot run (``ParallelConfig.check_device``; before any group)."""
    expect_config(config, "check_cpu_options").check_device(on_cpu=True)


def needs_cpu_backend() -> bool:
    """True on a CPU-only Paddle build (:func:`paddletrainer.device.has_accelerator`): the gloo fills of
    :mod:`paddletrainer.parallel.cpu` apply."""
    return not has_accelerator()


def _check_paddle_contract(on_cpu: bool) -> None:
    """``paddle_contract.check()`` before the first process group: every broken fact ends a CPU-only build's run
    (its fills patch Paddle); an accelerator build, which installs none of the CPU fills, logs them (the stage-2/3
    digests and the accessors still refuse there, at construction and on use)."""
    problems = paddle_contract.check()
    if problems and on_cpu:
        raise RuntimeError("paddletrainer no longer matches this Paddle/PaddleNLP (each line names the file to "
                           "edit):\n  - " + "\n  - ".join(problems))
    for problem in problems:
        logger.warning("paddle contract: %s", problem)


def _build_topology(config: ParallelConfig) -> Topology:
    layout = config.layout
    env_world = launch_world_size()
    if env_world != layout.world_size:
        raise ValueError(f"the layout {layout.describe()} has world size {layout.world_size} but the launcher "
                         f"started {env_world} processes")
    rank, local_rank = launch_rank(), launch_local_rank() or 0
    if layout.world_size == 1:
        return Topology(layout=layout, rank=rank, local_rank=local_rank)

    on_cpu = needs_cpu_backend()
    config.check_device(on_cpu)
    _check_paddle_contract(on_cpu)
    if on_cpu:
        cpu_backend.install()
        if config.sharding_stage == 3:  # before the model is built: see host_allocator
            host_allocator.hold_mmap_threshold()

    if not layout.use_hybrid:
        dist.init_parallel_env()
        group = dist.collective._get_default_group()
        groups = {"dp": group, "data": group, **_expert_groups(rank, layout)}
        return Topology(layout=layout, rank=rank, local_rank=local_rank, groups=groups)

    fleet.init(is_collective=True, strategy=build_strategy(config, on_cpu))
    hcg = fleet.get_hybrid_communicate_group()
    if on_cpu:
        cpu_backend.pipeline_p2p.install_pipeline_pair_groups(hcg)  # pp > 2 only
    groups = {a.name: getattr(hcg, a.hcg_group)() if layout.degree(a.name) > 1 else None for a in AXES}
    coords = layout.coordinates(rank)
    groups["data"] = _data_group(rank, layout, groups)
    groups.update(_expert_groups(rank, layout))
    placed = {a.name: getattr(hcg, a.hcg_rank)() if layout.degree(a.name) > 1 else 0 for a in AXES}
    if placed != coords:
        raise RuntimeError(f"fleet placed rank {rank} at {placed}, Layout.coordinates says {coords}: the rank "
                           f"layout assumption is wrong")
    return Topology(layout=layout, rank=rank, local_rank=local_rank, coords=coords, hcg=hcg, groups=groups)


def _data_group(rank: int, layout: Layout, groups):
    """The group over the data-splitting axes of this rank's cell (the ranks that differ only on dp/sharding);
    every rank creates every cell's group in the same order."""
    splitting = [a.name for a in AXES if a.splits_data and layout.degree(a.name) > 1]
    if len(splitting) <= 1:
        return groups[splitting[0]] if splitting else None
    cells = {}
    for other in range(layout.world_size):
        c = layout.coordinates(other)
        cells.setdefault(tuple(c[a.name] for a in AXES if not a.splits_data), []).append(other)
    mine = None
    for key in sorted(cells):  # the same order on every rank: new_group is collective
        group = dist.new_group(cells[key])
        if rank in cells[key]:
            mine = group
    return mine


def expert_group_ranks(layout: Layout) -> dict:
    """``{"ep": [[rank, ...], ...], "edp": [...]}``: the expert-parallel groups (``ep`` consecutive data ranks of
    one cell of the other axes: they split the experts) and the expert-data-parallel groups (the ranks of one
    cell holding the same experts: equal data rank modulo ``ep``), each listed by data rank."""
    cells = {}
    for other in range(layout.world_size):
        c = layout.coordinates(other)
        key = tuple(c[a.name] for a in AXES if not a.splits_data)
        cells.setdefault(key, []).append((layout.data_rank(c), other))
    ep, found = layout.ep, {"ep": [], "edp": []}
    for key in sorted(cells):
        ranks = [r for _, r in sorted(cells[key])]
        found["ep"] += [ranks[i:i + ep] for i in range(0, len(ranks), ep)]
        found["edp"] += [ranks[i::ep] for i in range(ep)]
    return found


def _expert_groups(rank: int, layout: Layout) -> dict:
    """This rank's "ep" and "edp" groups (None when ep is 1 or the group has one rank); every rank creates every
    group in the same order (new_group is collective)."""
    if layout.ep == 1:
        return {}
    mine = {}
    for name, lists in expert_group_ranks(layout).items():
        mine[name] = None
        for ranks in lists:
            if len(ranks) == 1:
                continue
            group = dist.new_group(ranks)
            if rank in ranks:
                mine[name] = group
    return mine


def init_topology(config: ParallelConfig) -> Topology:
    """Build (once per process) the process groups for a :class:`ParallelConfig` (``args.parallel_config``) and
    return the Topology.

    Installs the CPU backend first on a CPU-only Paddle. Calling it again returns the same object; calling it
    with a different layout raises.
    """
    global _TOPOLOGY
    expect_config(config, "init_topology")
    if _TOPOLOGY is not None:
        if (_TOPOLOGY.layout, _TOPOLOGY.layout.topo_order) != (config.layout, config.layout.topo_order):
            raise RuntimeError(f"init_topology already ran with {_TOPOLOGY.layout}; got {config.layout}")
        return _TOPOLOGY
    began = time.time()
    topology = _build_topology(config)
    if topology.layout.world_size > 1:
        prime_launcher_store(topology.rank)  # rank 0 hosts the launcher's store: see tcp_store
    _TOPOLOGY = dataclasses.replace(topology, build_seconds=time.time() - began)  # the Trainer's startup report
    return _TOPOLOGY
