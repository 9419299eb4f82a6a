"""Process topology: ``ParallelDegrees`` → ``fleet.DistributedStrategy`` → ``fleet.init`` → :class:`Topology`.

This module holds the library's only ``fleet.init`` call. The degrees come already resolved and validated
from ``TrainingArguments.parallel_degrees`` (PaddleNLP's rules), so nothing here decides a layout; it only
builds the process groups for it.

Layouts:

* world size 1: no process group at all.
* plain data parallel (dp > 1, every other degree 1): ``paddle.distributed.init_parallel_env()`` and
  later ``paddle.DataParallel`` — the same choice PaddleNLP makes; there is no hybrid group (``hcg`` None).
* anything else: ``fleet.init(is_collective=True, strategy=...)`` with hybrid_configs.

Rank layout: fleet orders the axes as ``order`` (outermost first) and numbers ranks in row-major order
over that grid, the last axis ("mp") varying fastest. :func:`coordinates_of` reproduces that arithmetic
without processes.
"""
from __future__ import annotations

import dataclasses
import os
from typing import Any, Mapping, Sequence

__all__ = [
    "Topology",
    "init_topology",
    "get_topology",
    "coordinates_of",
    "hybrid_order",
    "build_strategy",
    "check_cpu_options",
]

# fleet axis names; "tp" is called "mp" by fleet. sep/cp are always 1 here but stay in the order so the
# grid has the same shape fleet builds by default.
PP_FIRST = ("dp", "pp", "sharding", "sep", "cp", "mp")
SHARDING_FIRST = ("dp", "sharding", "pp", "sep", "cp", "mp")

_TOPOLOGY = None


def hybrid_order(topo_order: str | None) -> tuple:
    """fleet's axis order for ``hybrid_parallel_topo_order`` ("pp_first" (default) or "sharding_first")."""
    if topo_order in (None, "", "pp_first"):
        return PP_FIRST
    if topo_order == "sharding_first":
        return SHARDING_FIRST
    raise ValueError(f"hybrid_parallel_topo_order must be 'pp_first' or 'sharding_first', got {topo_order!r}")


def coordinates_of(rank: int, degrees: Mapping[str, int], order: Sequence[str]) -> dict:
    """The coordinate of ``rank`` on every axis of a row-major grid ordered by ``order``.

    ``degrees`` maps axis names to sizes (missing axes have size 1; "tp" is accepted for fleet's "mp"). Example, order (dp, pp, sharding, mp)
    with degrees dp2·pp2·sharding2·mp2: strides are 8, 4, 2, 1, so rank 13 = 1·8 + 1·4 + 0·2 + 1·1 is
    dp 1, pp 1, sharding 0, mp 1.
    """
    degrees = dict(degrees)
    if "tp" in degrees:  # our name for fleet's "mp"
        degrees.setdefault("mp", degrees.pop("tp"))
    sizes = [int(degrees.get(axis, 1)) for axis in order]
    world = 1
    for size in sizes:
        world *= size
    if not 0 <= rank < world:
        raise ValueError(f"rank {rank} is outside a world of {world} processes ({dict(zip(order, sizes))})")
    coords = {}
    for axis, size in reversed(list(zip(order, sizes))):
        coords[axis] = rank % size
        rank //= size
    return {axis: coords[axis] for axis in order}


@dataclasses.dataclass(frozen=True)
class Topology:
    """Where this process sits in the 4D grid, and the process groups of each axis.

    ``data_rank`` / ``data_world_size`` index the data split: data is split over dp × sharding only
    (tensor- and pipeline-parallel ranks of one data rank read the same samples).
    Group accessors return a ``paddle.distributed`` Group, or None when the axis has size 1.
    """

    world_size: int
    rank: int
    local_rank: int
    dp_degree: int
    sharding_degree: int
    tp_degree: int
    pp_degree: int
    dp_rank: int
    sharding_rank: int
    tp_rank: int
    pp_rank: int
    order: tuple = PP_FIRST
    hcg: Any = dataclasses.field(default=None, repr=False, compare=False)
    _groups: Mapping[str, Any] = dataclasses.field(default_factory=dict, repr=False, compare=False)

    @property
    def data_rank(self) -> int:
        """dp_rank · sharding_degree + sharding_rank (PaddleNLP's dataset_rank)."""
        return self.dp_rank * self.sharding_degree + self.sharding_rank

    @property
    def data_world_size(self) -> int:
        """dp_degree · sharding_degree (PaddleNLP's dataset_world_size)."""
        return self.dp_degree * self.sharding_degree

    @property
    def is_first_stage(self) -> bool:
        return self.pp_rank == 0

    @property
    def is_last_stage(self) -> bool:
        return self.pp_rank == self.pp_degree - 1

    @property
    def use_hybrid(self) -> bool:
        """True when fleet's hybrid groups exist (any of sharding, tp, pp > 1)."""
        return self.hcg is not None

    @property
    def dp_group(self):
        return self._groups.get("dp")

    @property
    def sharding_group(self):
        return self._groups.get("sharding")

    @property
    def tp_group(self):
        return self._groups.get("tp")

    @property
    def pp_group(self):
        return self._groups.get("pp")

    @property
    def data_group(self):
        """The group spanning dp × sharding (this rank's tp/pp cell), for loss averaging."""
        return self._groups.get("data")


def get_topology() -> Topology | None:
    """The topology built by :func:`init_topology` in this process, or None."""
    return _TOPOLOGY


def _degrees_of(args) -> dict:
    d = args.parallel_degrees
    return {"world_size": int(d.world_size), "dp": max(int(d.dp), 1), "sharding": max(int(d.sharding), 1),
            "mp": max(int(d.tp), 1), "pp": max(int(d.pp), 1)}


def build_strategy(args, on_cpu: bool):
    """The ``fleet.DistributedStrategy`` for ``args`` (PaddleNLP's construction; see module docstring).

    * hybrid_configs: the degrees, the axis order and pp_configs, set in one assignment (the setter
      works once per key group), then ``sharding_configs`` and ``mp_configs`` fields by attribute mutation:
      assigning them as a dict raises "Assignment not allowed to message field".
    * pipeline_configs: accumulate_steps = gradient_accumulation_steps, micro_batch_size =
      per_device_train_batch_size; partial send/recv off on CPU (gloo has no all_gather_partial).
    * tensor_parallel_configs: tensor_init_seed = seed, so tp ranks draw the same init streams.
    """
    from paddle.distributed import fleet

    degrees = _degrees_of(args)
    pp_options = args.pipeline_parallel_options
    sharding_options = args.sharding_parallel_options
    tp_options = args.tensor_parallel_options
    strategy = fleet.DistributedStrategy()
    if degrees["pp"] > 1:
        partial = not on_cpu and "disable_partial_send_recv" not in pp_options
        strategy.pipeline_configs = {
            "accumulate_steps": int(args.gradient_accumulation_steps),
            "micro_batch_size": int(args.per_device_train_batch_size),
            "enable_partial_send_recv": partial,
            "p2p_cache_shape": "disable_p2p_cache_shape" not in pp_options,
        }
    if degrees["mp"] > 1:
        strategy.tensor_parallel_configs = {"tensor_init_seed": int(args.seed)}
    strategy.hybrid_configs = {
        "dp_degree": degrees["dp"],
        "mp_degree": degrees["mp"],
        "pp_configs": {
            "delay_scale_loss": "enable_delay_scale_loss" in pp_options,  # the Trainer divides the grads
            "clear_every_step_cache": "enable_clear_every_step_cache" in pp_options,
            "use_batch_p2p_comm": "disable_batch_p2p_comm" not in pp_options,
            "enable_timer": "enable_timer" in pp_options,
        },
        "pp_degree": degrees["pp"],
        "sharding_degree": degrees["sharding"],
        "order": list(hybrid_order(args.hybrid_parallel_topo_order)),
    }
    sharding_configs = strategy.hybrid_configs["sharding_configs"]
    # split_param, tensor fusion and comm overlap are refused in TrainingArguments (REFUSED_PARALLEL_OPTIONS).
    sharding_configs.accumulate_steps = int(args.gradient_accumulation_steps)
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


def check_cpu_options(args) -> None:
    """Raise for options Paddle's CPU build cannot run (called before any process group exists)."""
    sharding_options = args.sharding_parallel_options
    if "split_param" in sharding_options:
        raise NotImplementedError(
            "sharding_parallel_config split_param (DygraphShardingOptimizerV2) is not supported on CPU: it needs "
            "the tensor-fusion buffers (GPU/XPU only) and, patched, silently stops updating parameters after "
            "the first clear_grad; use stage1 without split_param"
        )
    for option in ("enable_stage1_tensor_fusion", "enable_stage1_overlap"):
        if option in sharding_options:
            raise NotImplementedError(f"sharding_parallel_config {option} needs GPU tensor fusion; not on CPU")
    from . import cpu_backend

    if "enable_timer" in args.pipeline_parallel_options:
        raise NotImplementedError("pipeline_parallel_config enable_timer needs CUDA: Paddle's pipeline timers "
                                  "call paddle.device.cuda.synchronize; not on CPU")
    tp_options = args.tensor_parallel_options
    cpu_backend.reject_sequence_parallel(bool(args.sequence_parallel))
    if "enable_mp_async_allreduce" in tp_options or "enable_mp_fused_linear_param_grad_add" in tp_options:
        raise NotImplementedError("tensor_parallel_config async/fused options need CUDA kernels; not on CPU")


def needs_cpu_backend() -> bool:
    """True on a Paddle build without CUDA or a custom device: the gloo fills of ``cpu_backend`` apply."""
    import paddle

    return not paddle.is_compiled_with_cuda() and not paddle.device.get_all_custom_device_type()


def _build_topology(args) -> Topology:
    import paddle.distributed as dist

    degrees = _degrees_of(args)
    world = degrees["world_size"]
    product = degrees["dp"] * degrees["sharding"] * degrees["mp"] * degrees["pp"]
    if product != world:
        raise ValueError(f"parallel degrees dp{degrees['dp']}·sharding{degrees['sharding']}·tp{degrees['mp']}·"
                         f"pp{degrees['pp']} = {product} do not match the world size {world}")
    env_world = int(os.environ.get("PADDLE_TRAINERS_NUM", "1"))
    if env_world != world:
        raise ValueError(f"args.parallel_degrees.world_size={world} but the launcher started {env_world} processes")
    rank = int(os.environ.get("PADDLE_TRAINER_ID", "0"))
    local_rank = int(os.environ.get("PADDLE_LOCAL_RANK", os.environ.get("PADDLE_RANK_IN_NODE", "0")))
    order = hybrid_order(args.hybrid_parallel_topo_order)
    common = dict(world_size=world, rank=rank, local_rank=local_rank, dp_degree=degrees["dp"],
                  sharding_degree=degrees["sharding"], tp_degree=degrees["mp"], pp_degree=degrees["pp"], order=order)
    if world == 1:
        return Topology(dp_rank=0, sharding_rank=0, tp_rank=0, pp_rank=0, **common)

    on_cpu = needs_cpu_backend()
    if not on_cpu and degrees["pp"] == 2 and args.virtual_pp_degree > 1:
        raise ValueError(f"virtual_pp_degree={args.virtual_pp_degree} needs pipeline_parallel_degree > 2 on GPU "
                         "(Paddle's interleaved schedule; its two-stage p2p order is fixed only by the CPU backend)")
    if on_cpu:
        check_cpu_options(args)
        from . import cpu_backend

        cpu_backend.install()

    hybrid = degrees["sharding"] > 1 or degrees["mp"] > 1 or degrees["pp"] > 1
    if not hybrid:
        dist.init_parallel_env()
        coords = coordinates_of(rank, degrees, order)
        group = dist.collective._get_default_group()
        return Topology(dp_rank=coords["dp"], sharding_rank=0, tp_rank=0, pp_rank=0,
                        _groups={"dp": group, "data": group}, **common)

    from paddle.distributed import fleet

    fleet.init(is_collective=True, strategy=build_strategy(args, on_cpu))
    hcg = fleet.get_hybrid_communicate_group()
    if on_cpu:
        cpu_backend.install_pipeline_pair_groups(hcg)  # pp > 2 only
    groups = {
        "dp": hcg.get_data_parallel_group() if degrees["dp"] > 1 else None,
        "sharding": hcg.get_sharding_parallel_group() if degrees["sharding"] > 1 else None,
        "tp": hcg.get_model_parallel_group() if degrees["mp"] > 1 else None,
        "pp": hcg.get_pipe_parallel_group() if degrees["pp"] > 1 else None,
    }
    groups["data"] = _data_group(rank, degrees, order, groups)
    coords = coordinates_of(rank, degrees, order)
    expected = (hcg.get_data_parallel_rank(), hcg.get_sharding_parallel_rank(), hcg.get_model_parallel_rank(),
                hcg.get_stage_id())
    if expected != (coords["dp"], coords["sharding"], coords["mp"], coords["pp"]):
        raise RuntimeError(f"fleet placed rank {rank} at dp/sharding/tp/pp {expected}, coordinates_of says "
                           f"{coords}: the rank layout assumption is wrong")
    return Topology(dp_rank=coords["dp"], sharding_rank=coords["sharding"], tp_rank=coords["mp"],
                    pp_rank=coords["pp"], hcg=hcg, _groups=groups, **common)


def _data_group(rank, degrees, order, groups):
    """dp × sharding group of this rank's (pp, tp) cell; every rank creates every cell's group in order."""
    import paddle.distributed as dist

    if degrees["dp"] == 1:
        return groups["sharding"]
    if degrees["sharding"] == 1:
        return groups["dp"]
    world = degrees["world_size"]
    cells = {}
    for other in range(world):
        c = coordinates_of(other, degrees, order)
        cells.setdefault((c["pp"], c["mp"]), []).append(other)
    mine = None
    for key in sorted(cells):  # the same order on every rank: new_group is collective
        group = dist.new_group(cells[key])
        if rank in cells[key]:
            mine = group
    return mine


def init_topology(args) -> Topology:
    """Build (once per process) the process groups for ``args.parallel_degrees`` and return the Topology.

    Installs the CPU backend first when Paddle has neither CUDA nor a custom device. Calling it again
    returns the same object; calling it with different degrees raises.
    """
    global _TOPOLOGY
    if _TOPOLOGY is not None:
        degrees = _degrees_of(args)
        seen = (_TOPOLOGY.world_size, _TOPOLOGY.dp_degree, _TOPOLOGY.sharding_degree, _TOPOLOGY.tp_degree,
                _TOPOLOGY.pp_degree)
        wanted = (degrees["world_size"], degrees["dp"], degrees["sharding"], degrees["mp"], degrees["pp"])
        if seen != wanted:
            raise RuntimeError(f"init_topology already ran with world/dp/sharding/tp/pp {seen}; got {wanted}")
        return _TOPOLOGY
    _TOPOLOGY = _build_topology(args)
    return _TOPOLOGY
