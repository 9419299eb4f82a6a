"""PaddleNLP's broadcasts of a loaded state (``trainer.utils.helper``; ``paddletrainer.utils.helper`` re-exports
them with its names and signatures): a file only some nodes have (``distributed_isfile``, ``distributed_file``),
an optimizer state only the data group's source rank loaded (``broadcast_dp_optimizer``; with MoE experts,
``broadcast_moe_optimizer``) and a model's parameters (``broadcast_dataset_rank0_model``).

Each reads the groups from fleet's hybrid communicate group, as PaddleNLP does; without one (a plain
``init_parallel_env`` job) the data group is the whole job and its source is rank 0. All are collective: every
rank of the group must call them.
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any, Optional, Tuple

import paddle
import paddle.distributed as dist
from paddle.distributed.parallel import sync_params_buffers

from .layout import launch_local_rank, launch_world_size
from ..paddle_contract import fleet_hybrid_group

__all__ = ["distributed_isfile", "distributed_file", "broadcast_dp_optimizer", "broadcast_moe_optimizer",
           "broadcast_dataset_rank0_model"]

logger = logging.getLogger(__name__)
_NO_FILE = 2**20  # larger than any rank: "this rank does not have the file" in the min over ranks
_OPTIMIZER_EXTRAS = ("master_weights", "LR_Scheduler")  # the optimizer state's keys that are not accumulators


def _hcg():
    """fleet's hybrid communicate group, or None when fleet was not initialised with one."""
    return fleet_hybrid_group()


def _data_group() -> Tuple[Any, int, int]:
    """``(group, source rank, this rank's data-parallel rank)``: fleet's dp group, else the whole job."""
    hcg = _hcg()
    if hcg is None:
        return None, 0, dist.get_rank()
    return hcg.get_data_parallel_group(), hcg.get_data_parallel_group_src_rank(), hcg.get_data_parallel_rank()


def _processes_and_local_rank() -> Tuple[int, int]:
    """``(processes in the job, this process's rank on its node)`` as the launcher exports them (the layout's
    readers of ``PADDLE_TRAINERS_NUM`` and ``PADDLE_RANK_IN_NODE``, which PaddleNLP reads too)."""
    return launch_world_size(), launch_local_rank() or 0


def distributed_isfile(filename: str) -> bool:
    """Whether the first process of any node has ``filename``. A collective whenever the job has more than one
    process (every rank must call it); ``os.path.isfile`` in a one-process job."""
    processes, local_rank = _processes_and_local_rank()
    if processes <= 1:
        return os.path.isfile(filename)
    count = paddle.to_tensor([1 if local_rank == 0 and os.path.isfile(filename) else 0], dtype="int64")
    dist.all_reduce(count)
    return int(count.item()) >= 1


def distributed_file(filename: str) -> str:
    """Make ``filename`` exist on every node: the lowest rank that is the first process of a node having it sends
    its bytes, and the first process of each node lacking it writes them (creating the directory). Returns
    ``filename``. Raises ``FileNotFoundError`` when no node has it. A collective in a multi-process job."""
    processes, local_rank = _processes_and_local_rank()
    if processes <= 1:
        return filename
    has_it = local_rank == 0 and os.path.isfile(filename)
    mine = paddle.to_tensor([dist.get_rank() if has_it else _NO_FILE], dtype="int64")
    ranks = []
    dist.all_gather(ranks, mine)
    src = int(paddle.min(paddle.concat(ranks)).item())
    if src == _NO_FILE:
        raise FileNotFoundError(f"distributed_file: no node has {filename!r}")
    payload = [None]
    if dist.get_rank() == src:
        with open(filename, "rb") as f:
            payload = [f.read()]
    dist.broadcast_object_list(payload, src=src)
    if local_rank == 0 and not os.path.isfile(filename):
        os.makedirs(os.path.dirname(filename) or ".", exist_ok=True)
        with open(filename, "wb") as f:
            f.write(payload[0])
    dist.barrier()
    return filename


@dataclass(frozen=True)
class _TensorSpec:
    """What a receiving rank needs to allocate a tensor before the broadcast fills it."""

    shape: tuple
    dtype: Any
    name: str


def _specs(value):
    """``value`` with every Tensor replaced by its :class:`_TensorSpec` (containers rebuilt, never mutated)."""
    if isinstance(value, paddle.Tensor):
        return _TensorSpec(tuple(value.shape), value.dtype, value.name)
    if isinstance(value, dict):
        return type(value)((k, _specs(v)) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return type(value)(_specs(v) for v in value)
    return value


def _allocate(value):
    """The structure :func:`_specs` described, with an uninitialised tensor for each spec."""
    if isinstance(value, _TensorSpec):
        tensor = paddle.empty(list(value.shape), dtype=value.dtype)
        tensor.name = value.name
        return tensor
    if isinstance(value, dict):
        return type(value)((k, _allocate(v)) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return type(value)(_allocate(v) for v in value)
    return value


def _broadcast_leaves(value, src: int, group) -> None:
    """Broadcast every Tensor of ``value`` in place from global rank ``src`` over ``group``."""
    if isinstance(value, paddle.Tensor):
        dist.broadcast(value, src=src, group=group, sync_op=True)
    elif isinstance(value, dict):
        for v in value.values():
            _broadcast_leaves(v, src, group)
    elif isinstance(value, (list, tuple)):
        for v in value:
            _broadcast_leaves(v, src, group)


def broadcast_dp_optimizer(state_dict: Optional[dict]) -> Optional[dict]:
    """The optimizer state the data group's source rank loaded, on every rank of the group: the others pass None
    and get tensors of the same names, shapes and dtypes filled from it (the source keeps its own dict)."""
    if dist.get_world_size() <= 1:
        return state_dict
    group, src, _ = _data_group()
    if group is not None and group.nranks <= 1:
        return state_dict
    is_src = dist.get_rank() == src
    if is_src and state_dict is None:
        logger.warning("broadcast_dp_optimizer: rank %d is the data group's source but has no state_dict",
                       dist.get_rank())
    if not is_src and state_dict is not None:
        logger.warning("broadcast_dp_optimizer: rank %d's own state_dict is replaced by rank %d's",
                       dist.get_rank(), src)
    layout = [_specs(state_dict) if is_src else None]
    dist.broadcast_object_list(layout, src=src, group=group)
    if not is_src:
        state_dict = _allocate(layout[0])
    _broadcast_leaves(state_dict, src, group)
    return state_dict


def _synced_part(model_state_dict: dict, state_dict: dict) -> dict:
    """The part of an optimizer state that belongs to parameters the data group shares (not ``no_sync`` ones,
    i.e. not an expert's): accumulators and master weights whose name starts with such a parameter's name,
    and the schedule."""
    shared = [v.name for v in model_state_dict.values() if not getattr(v, "no_sync", False)]

    def owned(key: str) -> bool:
        return any(key.startswith(name) for name in shared)

    part = {"master_weights": {k: v for k, v in state_dict.get("master_weights", {}).items() if owned(k)},
            "LR_Scheduler": state_dict.get("LR_Scheduler", {})}
    part.update((k, v) for k, v in state_dict.items() if k not in _OPTIMIZER_EXTRAS and owned(k))
    return part


def _broadcast_source_keys(state_dict: dict, src: int, group) -> dict:
    """Every accumulator and master weight the source rank has (its shapes and dtypes sent first), received into
    new tensors (a rank's own tensors of those names are left as they are) and returned on the host."""
    is_src = dist.get_rank() == src
    layout = [_specs({k: v for k, v in state_dict.items() if k not in _OPTIMIZER_EXTRAS}) if is_src else None,
              _specs(state_dict.get("master_weights", {})) if is_src else None,
              state_dict.get("LR_Scheduler", {}) if is_src else None]
    dist.broadcast_object_list(layout, src=src, group=group)
    received = {"master_weights": {}}
    for specs, local, out in ((layout[0], state_dict, received), (layout[1], state_dict.get("master_weights", {}),
                                                                  received["master_weights"])):
        for key, spec in specs.items():
            tensor = local[key].to(paddle.get_device()) if is_src else _allocate(spec)
            tensor.name = key
            dist.broadcast(tensor, src=src, group=group, sync_op=True)
            out[key] = tensor.cpu()
    received["LR_Scheduler"] = layout[2]
    return received


def broadcast_moe_optimizer(state_dict: dict, model_state_dict: Optional[dict] = None,
                            broadcast_dp: bool = True) -> dict:
    """An optimizer state with MoE experts, completed on every data rank: the source rank's state for the
    shared parameters (``broadcast_dp``: only those of ``model_state_dict``'s parameters not marked ``no_sync``;
    otherwise every key the source has), merged under each other rank's own entries (its experts')."""
    group, src, data_rank = _data_group()
    if group is not None and group.nranks <= 1:
        return state_dict
    if broadcast_dp:
        received = broadcast_dp_optimizer(_synced_part(model_state_dict, state_dict))
    else:
        received = _broadcast_source_keys(state_dict, src, group)
    if data_rank == 0:
        return state_dict
    own_master = state_dict.pop("master_weights", {})
    received.update(state_dict)
    if own_master:
        received.setdefault("master_weights", {}).update(own_master)
    return received


def broadcast_dataset_rank0_model(model: paddle.nn.Layer) -> None:
    """Copy the parameters and buffers of the first rank of each sharding group, then of each data group, to
    the other ranks of that group (the whole job from rank 0 without fleet's hybrid group)."""
    if dist.get_world_size() <= 1:
        return
    hcg = _hcg()
    if hcg is None:
        sync_params_buffers(model, comm_group=None, src_rank=0, is_model_parallel=False, fuse_params=False)
        return
    for group, src in ((hcg.get_sharding_parallel_group(), hcg.get_sharding_parallel_group_src_rank()),
                       (hcg.get_data_parallel_group(), hcg.get_data_parallel_group_src_rank())):
        if group.nranks > 1:
            sync_params_buffers(model, comm_group=group, src_rank=src, is_model_parallel=False, fuse_params=False)
