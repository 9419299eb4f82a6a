"""What this rank holds: its model and optimizer tensors, found through Paddle (:func:`rank_state`), each with
the global key and :class:`~.placement.Placement` that :func:`~.placement.place_rank` gives it in one call.

This is the only place that knows how Paddle's wrappers and optimizers store things:

* model: unwrap ``_layers`` / ``_layer`` (DataParallel, TensorParallel, PipelineParallel, sharding
  wrappers) and use ``state_dict()`` names — PaddleNLP's ``PipelinePretrainedModel.state_dict`` already
  maps pipeline-layer names back to the non-pipeline names, so a pp2 stage and a single process agree.
* tensor parallel: Paddle's mp layers (and PaddleNLP's LM head) set ``is_distributed`` and ``split_axis``.
* sharding stage 3: a parameter's ``fw_storage`` slice is saved/loaded as a flat range of it.
* sharding stage 1 V2 (``split_param``): the optimizer steps flat "slice parameters" named like their
  parameter, each declaring the flat range of it that it covers as ``ckpt_flat_range`` (set by
  ``parallel.sharding.SplitParamSharding``); their states are saved/loaded as that range.
* anything else can declare itself with a ``ckpt_placement`` attribute
  holding a :class:`~paddletrainer.checkpoint.placement.Placement`.
* optimizer: :func:`~paddletrainer.parallel.wrappers.unwrap_optimizer` gives the Paddle optimizer, whose
  ``_accumulators`` hold exactly the states this rank owns (under sharding stage 1/2 only its parameters' states).
* sharding offload: the fp32 master weights live on the parameters (``param.master_weight``), not in the
  optimizer; they are saved as the parameters' ``master_weight`` states (:func:`_offload_masters`).
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
from typing import Callable, Container, Dict, List, Optional, Tuple

import numpy as np
import paddle
from paddle.base.framework import EagerParamBase

from ..paddle_contract import creates_accumulators, optimizer_accumulators, optimizer_master_weights
from ..parallel.layout import AXES
from ..parallel.topology import Topology
from ..parallel.wrappers import unwrap_model, unwrap_optimizer
from .placement import (MASTER_WEIGHT, CheckpointError, HeldState, HeldTensor, Holdings, LoadTarget, Placement,
                        place_rank)

_FILE = "paddletrainer/checkpoint/local_state.py"  # named by the private reads it makes through paddle_contract


# ------------------------------------------------------------------------------------- topology
def topology_info(topology) -> Topology:
    """This rank's :class:`~paddletrainer.parallel.topology.Topology`; a duck-typed stand-in (``<axis>_degree``,
    ``<axis>_rank``, ``rank``: tools, tests) is converted; without one: plain data parallel."""
    if isinstance(topology, Topology):
        return topology
    if topology is None:
        return Topology.of(rank=paddle.distributed.get_rank(), dp_degree=paddle.distributed.get_world_size())
    # an axis added later (sep) may be missing from a stand-in written before it: inactive there
    fields = {f"{a.name}_{kind}": int(getattr(topology, f"{a.name}_{kind}") if a.named_at_degree_1 else
                                      getattr(topology, f"{a.name}_{kind}", 1 if kind == "degree" else 0))
              for a in AXES for kind in ("degree", "rank")}
    return Topology.of(rank=int(topology.rank), **fields)


def layout_dict(t: Topology) -> Dict[str, int]:
    """The degrees that decide whether per-rank state (RNG) can be restored (``Layout.as_dict``)."""
    return t.layout.as_dict()


# ----------------------------------------------------------------------------------------- dtypes
def dtype_name(t) -> str:
    return str(t.dtype).replace("paddle.", "")


def to_numpy(t) -> np.ndarray:
    """A host copy (``Tensor.numpy()`` copies on CPU, so later in-place updates cannot reach it).

    bfloat16 comes back as its uint16 bit pattern; the index records the real dtype.
    """
    return np.ascontiguousarray(t.numpy())


def host_array(t, copy: bool) -> np.ndarray:
    """``t`` as a NumPy array: its own memory (no copy) when it is a host tensor NumPy can view through
    DLPack and ``copy`` is False, else a host copy. A sync save writes from the view (nothing changes
    the tensor until the write is done); an async save needs the copy, a snapshot the step can't touch.
    ``np.copy`` of the view also runs at memcpy speed, about 2x ``Tensor.numpy()``.
    """
    if t.place.is_cpu_place() and t.dtype != paddle.bfloat16:
        try:
            view = np.from_dlpack(t.detach())
        except (BufferError, TypeError, RuntimeError):  # a dtype or layout DLPack can't express
            return to_numpy(t)
        return np.array(view, order="C", copy=True) if copy else np.ascontiguousarray(view)
    return to_numpy(t)


def writable_host_view(t) -> Optional[np.ndarray]:
    """A writable NumPy array over a host tensor's own memory (bfloat16 as uint16 bits), or None when the
    tensor is not a dense C-contiguous host tensor. A load reads stored bytes straight into it.
    (NumPy marks DLPack views read-only, so the array is built over the same address with ctypes; the
    caller keeps ``t`` alive while using it.)"""
    if not t.place.is_cpu_place():
        return None
    try:
        view = np.from_dlpack((t.view(paddle.uint16) if t.dtype == paddle.bfloat16 else t).detach())
    except (BufferError, TypeError, RuntimeError, ValueError):
        return None
    if not view.flags.c_contiguous:
        return None
    if view.nbytes == 0:
        return np.empty(view.shape, dtype=view.dtype)
    memory = (ctypes.c_uint8 * view.nbytes).from_address(view.__array_interface__["data"][0])
    return np.frombuffer(memory, dtype=view.dtype).reshape(view.shape)


def from_stored(arr: np.ndarray, stored_dtype: str, target_dtype: str) -> np.ndarray:
    """Stored array -> the host array of a ``target_dtype`` tensor (bfloat16 as its uint16 bit pattern)."""
    if stored_dtype == target_dtype:
        return arr
    if stored_dtype == "bfloat16":  # widen the bit pattern exactly: bf16 is the top half of fp32
        arr = (arr.astype(np.uint32) << 16).view(np.float32)
    if target_dtype == "bfloat16":  # Paddle's round-to-nearest-even cast, run on the host
        return paddle.to_tensor(arr.astype(np.float32), place=paddle.CPUPlace()).astype("bfloat16").numpy()
    return arr.astype(target_dtype)


def concrete_place(place):
    """The typed place (``CPUPlace``, ``CUDAPlace(i)``, ...) of a tensor's generic ``place``."""
    if place.is_gpu_place():
        return paddle.CUDAPlace(place.gpu_device_id())
    if place.is_cuda_pinned_place():
        return paddle.CUDAPinnedPlace()
    if place.is_xpu_place():
        return paddle.XPUPlace(place.xpu_device_id())
    if place.is_custom_place():
        return paddle.CustomPlace(place.custom_device_type(), place.custom_device_id())
    return paddle.CPUPlace()


def set_in_place(tensor, arr: np.ndarray) -> None:
    """Copy host ``arr`` into ``tensor`` on the place ``tensor`` already occupies.

    ``Tensor.set_value`` puts NumPy data on the *expected* place (the GPU) and swaps a Tensor's storage:
    Adam's beta powers (host by design), offload master weights/moments (host) and stage-3 slices (views
    Paddle's buffers share) would move or lose that sharing. ``DenseTensor.set`` with the tensor's own
    place writes into the existing allocation when the size matches.
    """
    tensor.get_tensor().set(np.ascontiguousarray(arr), concrete_place(tensor.place))


# ---------------------------------------------------------------------------------------- model
@dataclasses.dataclass
class LocalTensor:
    """A tensor this rank holds and where it sits. ``storage`` may be longer than the placement says
    (a stage-3 slice padded for alignment): only the first ``placement.local_numel`` elements are data.
    ``forward_may_write``: the forward/backward may change it in place (buffers, BatchNorm statistics),
    unlike trained parameters and optimizer states, which only the optimizer step writes."""

    tensor: object
    placement: Placement
    forward_may_write: bool = False

    @property
    def storage_numel(self) -> int:
        return int(np.prod(self.tensor.shape))

    def host_array(self, copy: bool = True) -> np.ndarray:
        """The data this rank saves (a stage-3 slice without its padding); see :func:`host_array`."""
        arr = host_array(self.tensor, copy=copy)
        if self.placement.flat is not None and arr.size != self.placement.local_numel:
            arr = np.ascontiguousarray(arr.reshape(-1)[: self.placement.local_numel])
        return arr

    def assign(self, arr: np.ndarray, stored_dtype: str) -> None:
        """Fill the tensor from a stored array, where the tensor lives (see :func:`set_in_place`)."""
        value = from_stored(arr, stored_dtype, dtype_name(self.tensor))
        n = self.storage_numel
        if value.size != n:  # restore the alignment padding of a stage-3 slice (never read: zeros)
            padded = np.zeros(n, dtype=value.dtype)
            padded[: value.size] = value.reshape(-1)
            value = padded
        set_in_place(self.tensor, value.reshape(self.tensor.shape))


def _stage3_slice(t, topo):
    """The ``fw_storage`` of a parameter sliced by GroupShardedStage3 (None for any other tensor): flat range
    ``[r·n, (r+1)·n)`` of the (padded) flattened parameter, r = sharding rank, n = slice length. The parameter
    itself may be released between steps, so the slice is what gets saved and loaded."""
    fw = getattr(t, "fw_storage", None)
    if fw is None or topo.sharding_degree <= 1 or not isinstance(fw, paddle.Tensor):
        return None
    return fw


def _forward_may_write(t) -> bool:
    """Buffers, and parameters without gradients: BatchNorm keeps its running statistics in parameters
    with ``stop_gradient`` and updates them in the forward (a frozen weight is treated the same way)."""
    return not isinstance(t, EagerParamBase) or bool(t.stop_gradient)


def _model_holdings(model, topo) -> List[Tuple[HeldTensor, object, bool]]:
    """The model's tensors as this rank holds them: ``(HeldTensor, the tensor saved and loaded, whether the
    forward may write it)`` per ``state_dict()`` entry."""
    found = []
    for name, t in unwrap_model(model).state_dict().items():
        declared = getattr(t, "ckpt_placement", None)
        split_axis = None
        if declared is None and getattr(t, "is_distributed", False) and topo.tp_degree > 1:
            split_axis = getattr(t, "split_axis", None)
            if split_axis is None:
                raise CheckpointError(
                    f"{name} is tensor-parallel (is_distributed) but has no split_axis; set it or a ckpt_placement")
            split_axis = int(split_axis)
        slice_ = _stage3_slice(t, topo)
        stored = t if slice_ is None else slice_
        n = int(np.prod(stored.shape))
        flat = None if slice_ is None else (topo.sharding_rank * n, (topo.sharding_rank + 1) * n)
        # stage 3: the optimizer keys the slice's accumulators "slice@<name>", the slice's own name
        held = HeldTensor(name, tuple(t.shape), (t.name, stored.name), n, split_axis, declared, flat)
        found.append((held, stored, slice_ is None and _forward_may_write(t)))
    return found


def _offload_masters(model) -> List[Tuple[str, object]]:
    """Sharding offload's fp32 master weights, ``(parameter name, master)``: Paddle's stage 3 offload keeps them as
    ``param.master_weight`` (a slice's master for a sliced parameter) and trains them, copying them into the
    parameters after each step; each has its parameter's (or slice's) element count and placement."""
    found = []
    for param in unwrap_model(model).parameters():
        master = getattr(param, "master_weight", None)
        if isinstance(master, paddle.Tensor) and master._is_initialized():
            found.append((param.name, master))
    return found


# ------------------------------------------------------------------------------------ optimizer
def ensure_accumulators(optimizer) -> None:
    """Create the accumulators of a fresh optimizer (they are lazy) so loading can fill them in place.

    Under sharding stage 3 the optimizer updates a parameter's slice, a stand-in named ``slice@<name>``
    that GroupShardedStage3 builds at every step; its accumulators are keyed and shaped by that slice, so
    they are created here for a stand-in of the same name (the step then finds and reuses them by name).
    """
    inner = unwrap_optimizer(optimizer)
    params = _stepped_parameters(inner)
    if not params or not creates_accumulators(inner):
        return
    # sharding offload runs the optimizer step in host memory (Paddle wraps it in device_guard())
    offload = any(isinstance(getattr(p, "master_weight", None), paddle.Tensor) for p in params)
    with _host_device() if offload else contextlib.nullcontext():
        block = paddle.static.default_main_program().global_block()
        inner._create_accumulators(block, [_optimized_tensor(p) for p in params])


def _stepped_parameters(inner) -> list:
    """The parameters (split_param: slice parameters) the Paddle optimizer ``inner`` updates on this rank."""
    params = []
    for entry in inner._parameter_list or []:  # plain parameters, or param groups {"params": [...], ...}
        params.extend(entry["params"] if isinstance(entry, dict) else [entry])
    # an uninitialised parameter is a split_param slice this rank owns nothing of: the step never updates it.
    # Not a sliced stage-3 parameter: GroupShardedStage3 frees its memory between steps (``_clear_data``) and
    # steps its ``fw_storage`` slice; skipping it would leave the slice's moments and beta powers unloaded.
    return [p for p in params if not p.stop_gradient
            and (p._is_initialized() or isinstance(getattr(p, "fw_storage", None), paddle.Tensor))]


def _host_device():
    from paddle.distributed.fleet.meta_parallel.sharding.group_sharded_utils import device_guard

    return device_guard()


def _optimized_tensor(param):
    """What the optimizer's step will update for ``param``: itself, or under sharding stage 3 a stand-in
    shaped like its slice, in the dtype of the slice the step updates (sharding offload updates the fp32
    host master, which the slice then shares)."""
    slice_ = getattr(param, "fw_storage", None)
    if not isinstance(slice_, paddle.Tensor) or slice_.name == param.name:
        return param
    master = getattr(param, "master_weight", None)
    dtype = master.dtype if isinstance(master, paddle.Tensor) else slice_.dtype
    stand_in = EagerParamBase(shape=slice_.shape, dtype=dtype, name=slice_.name)
    stand_in.optimize_attr = dict(param.optimize_attr)
    stand_in.regularizer = param.regularizer
    return stand_in


def _optimizer_holdings(optimizer):
    """This rank's optimizer states as ``(HeldState, tensor)`` (multi-precision optimizers key moments by the
    master weight's name, hence the reverse map), the split_param slices' flat ranges by name, and the parameters
    the optimizer updates with their flat ranges: the :class:`~.placement.Holdings` fields of the optimizer."""
    inner = unwrap_optimizer(optimizer)
    masters = optimizer_master_weights(inner, _FILE)
    master_to_param = {mw.name: pname for pname, mw in masters.items()}
    flat_ranges = {p.name: p.ckpt_flat_range for p in (inner._parameter_list or [])
                   if not isinstance(p, dict) and hasattr(p, "ckpt_flat_range")}
    states = [(HeldState(master_to_param.get(owner, owner), kind, tuple(t.shape)), t)
              for kind, accs in optimizer_accumulators(inner, _FILE).items() for owner, t in accs.items()]
    states += [(HeldState(pname, MASTER_WEIGHT, tuple(t.shape)), t) for pname, t in masters.items()]
    stepped = [(p.name, getattr(p, "ckpt_flat_range", None)) for p in _stepped_parameters(inner)]
    return states, flat_ranges, stepped


# ------------------------------------------------------------------------------------- what this rank holds
@dataclasses.dataclass
class RankState:
    """What this rank holds, named and placed (:func:`rank_state`)."""

    topo: Topology
    models: Dict[str, LocalTensor]  # model key -> tensor (a stage-3 parameter: its slice)
    optims: Dict[str, LocalTensor]  # optim/<param global name>/<kind> -> state; empty without an optimizer
    masters: Dict[str, Tuple[LocalTensor, LocalTensor]]  # offload master weights: key -> (master, what it masters)
    stepped: set  # global names of the parameters whose optimizer states belong here; empty without an optimizer


def rank_state(model, optimizer=None, topology=None, *, create_accumulators: bool = False) -> RankState:
    """Find what this rank holds through Paddle (the model's state dict and stage-3 slices, the offload master
    weights, the optimizer's states when ``optimizer`` is given, created first with ``create_accumulators``) and
    have :func:`~.placement.place_rank` name and place all of it."""
    topo = topology_info(topology)
    tensors, offloaded = _model_holdings(model, topo), _offload_masters(model)
    states, flat_ranges, stepping = [], {}, []
    if optimizer is not None:
        if create_accumulators:
            ensure_accumulators(optimizer)
        states, flat_ranges, stepping = _optimizer_holdings(optimizer)
    placed = place_rank(Holdings([h for h, _, _ in tensors], [s for s, _ in states], flat_ranges, stepping,
                                 [name for name, _ in offloaded], topo.tp_rank, topo.tp_degree))
    held = [LocalTensor(t, p, forward_may_write=w) for (_, p), (_, t, w) in zip(placed.tensors, tensors)]
    optims = {}
    for where, (_, t) in zip(placed.states, states):
        if where is not None:
            optims[where[0]] = LocalTensor(t, where[1])
    masters = {}
    for where, (_, master) in zip(placed.offloaded, offloaded):
        if where is not None:
            masters[where[0]] = (LocalTensor(master, held[where[1]].placement), held[where[1]])
    stepped = placed.stepped if optimizer is not None else set()
    return RankState(topo, {key: lt for (key, _), lt in zip(placed.tensors, held)}, optims, masters, stepped)


# ------------------------------------------------------------------------------------- a load's targets
@dataclasses.dataclass
class RankTensors:
    """Everything a checkpoint load fills on this rank, gathered in one pass (:func:`rank_tensors`): a load asks
    this module once for its targets, and once more, while reading, for their memory (:func:`direct_views`,
    :meth:`LocalTensor.assign`)."""

    topo: Topology
    layout: Dict[str, int]  # :func:`layout_dict` of ``topo``
    models: Dict[str, LocalTensor]
    masters: Dict[str, Tuple[LocalTensor, LocalTensor]]  # :attr:`RankState.masters`
    optims: Dict[str, LocalTensor]  # states and stored offload masters; empty without an optimizer to restore
    stepped: set  # :attr:`RankState.stepped`; empty without an optimizer to restore
    model_targets: Dict[str, LoadTarget]  # key -> (placement, dtype name, storage numel): what a load plans for
    optim_targets: Dict[str, LoadTarget]


def rank_tensors(model, optimizer, topology, stored: Container[str],
                 select: Callable[[object, Dict[str, LocalTensor]], Dict[str, LocalTensor]]) -> RankTensors:
    """This rank's load targets: the model's tensors as ``select(model, tensors)`` keeps them (a PEFT model:
    its adapters), the offload master weights, and, when ``optimizer`` is given, its states with their
    accumulators created first and the offload masters the checkpoint holds (``stored``: its keys)."""
    held = rank_state(model, optimizer, topology, create_accumulators=True)
    models = select(model, held.models)
    optims = dict(held.optims)
    if optimizer is not None:
        optims.update({k: m for k, (m, _) in held.masters.items() if k in stored})

    def planned(tensors):
        return {k: (lt.placement, dtype_name(lt.tensor), lt.storage_numel) for k, lt in tensors.items()}

    return RankTensors(held.topo, layout_dict(held.topo), models, held.masters, optims, held.stepped,
                       planned(models), planned(optims))


def direct_views(whole: Dict[str, Tuple[str, str]], targets: Dict[str, LocalTensor]):
    """``{file: {in-file key: the tensor's own memory}}`` for every target one stored piece fills exactly
    (``whole``: key -> (file, in-file key), :attr:`~.placement.LoadPlan.whole`) that is a dense host tensor: a
    load reads those bytes straight into the tensor. Also returns the tensors by key, to keep them alive while
    their memory is written."""
    direct: Dict[str, Dict[str, np.ndarray]] = {}
    alive = {}
    for key, (file, in_file) in whole.items():
        view = writable_host_view(targets[key].tensor)
        if view is None:
            continue
        direct.setdefault(file, {})[in_file] = view
        alive[key] = targets[key].tensor
    return direct, alive
