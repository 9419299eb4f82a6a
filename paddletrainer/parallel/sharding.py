"""Sharding (ZeRO): stage 1 through fleet, stages 2 and 3 through Paddle's group-sharded classes.

* stage 1: ``fleet.distributed_optimizer`` → ``HybridParallelOptimizer`` → ``DygraphShardingOptimizer``
  (V1): whole parameters are assigned to sharding ranks greedily by size; each rank keeps the optimizer
  state of its own parameters, gradients are reduced to the owner and updated parameters broadcast back.
  V2 (``split_param``, ``DygraphShardingOptimizerV2``): parameters and gradients live in flat comm buffers;
  each rank owns one contiguous range of every buffer (parameters cut at any element), gradients are
  reduce-scattered into it and updated ranges all-gathered back. :class:`SplitParamSharding` is what the
  rest of paddletrainer needs to know about it (gradient slices, clearing, checkpoint ranges).
* stage 2: ``GroupShardedOptimizerStage2`` + ``GroupShardedStage2`` on the sharding group (state and
  gradients sharded; dp, if any, all-reduces on top), with whole parameters assigned to ranks largest first
  (:class:`_BalancedStage2Optimizer`) instead of Paddle's greedy in model order.
* stage 3: ``GroupShardedStage3`` (parameters sharded too: each rank keeps a flat slice of every
  parameter larger than ``segment_size`` elements, gathered on demand in forward/backward), with its
  gradients reduce-scattered into the slices instead of all-reduced (:class:`_ReduceScatterStage3`). A model
  built under ``paddle.LazyGuard`` arrives with each sliced parameter's slice already drawn (``lazy_init``):
  that slice becomes its own ``fw_storage`` and is not broadcast, so no rank holds the whole model. On the
  CPU build the tensors it frees leave the process (:mod:`.host_allocator`), so its peak is what is alive.

Paddle's stage 2/3 constructors assume a GPU; on CPU they are built inside
``cpu.sharding_construction.group_sharded_construction()``.
"""
from __future__ import annotations

import contextlib
import functools

import paddle
import paddle.distributed as dist
from paddle.base import core
from paddle.distributed import fleet
from paddle.distributed.fleet.meta_optimizers.dygraph_optimizer.dygraph_sharding_optimizer import (
    DygraphShardingOptimizerV2,
)
from paddle.distributed.fleet.meta_parallel.sharding.group_sharded_optimizer_stage2 import GroupShardedOptimizerStage2
from paddle.distributed.fleet.meta_parallel.sharding.group_sharded_stage2 import GroupShardedStage2
from paddle.distributed.fleet.meta_parallel.sharding import group_sharded_stage3
from paddle.distributed.fleet.meta_parallel.sharding.group_sharded_stage3 import GroupShardedStage3
from paddle.distributed.fleet.meta_parallel.sharding.group_sharded_utils import device_guard

from .. import paddle_contract
from . import cpu as cpu_backend
from . import host_allocator, lazy_init
from .optimizer import ParallelOptimizer, flat_parameters
from .config import STAGE3_DEFAULT_SEGMENT_SIZE, ParallelConfig, expect_config  # the default: re-exported here
from .topology import needs_cpu_backend
from .wrappers import optimizer_layers

__all__ = ["apply_sharding", "stage2_no_sync", "is_stage2_model", "SplitParamSharding",
           "STAGE3_DEFAULT_SEGMENT_SIZE", "Stage2Optimizer", "Stage3Optimizer"]


def _construction_scope():
    if not needs_cpu_backend():
        return contextlib.nullcontext()
    return cpu_backend.sharding_construction.group_sharded_construction()


def _device() -> str:
    return paddle.get_device().split(":")[0]


def apply_sharding(model, optimizer, *, topology, config: ParallelConfig, wrap_model: bool = True):
    """Shard ``optimizer`` (and, for stage 2/3, ``model``) over the sharding group, as ``config`` says.

    ``config`` (a :class:`~.config.ParallelConfig` of ``topology``'s layout) gives the stage, ``offload`` (keep
    the sharded fp32 master weights and optimizer state in host memory, Paddle's offload path: stage 3, on CPU
    through ``cpu.stage3_offload``, with host and device the same memory) and ``stage3_segment_size`` (the
    stage-3 slicing threshold in elements). Its construction refused every combination Paddle or a checkpoint
    cannot run (stage 2/3 with pp, stage 3 with tp, stage 1 and stage 2 offload): nothing is checked again here.
    ``wrap_model``: stage 1 only: also wrap the model with ``fleet.distributed_model`` (``ShardingParallel``,
    which broadcasts the initial parameters). False when another axis already wrapped it.

    Returns ``(model, optimizer)`` as Paddle returns them.
    """
    stage, offload = expect_config(config, "apply_sharding").sharding_stage, config.sharding_offload
    if stage == 0:
        raise ValueError("apply_sharding: the config has no sharding stage (sharding_parallel_degree 1)")
    if stage == 1:
        if wrap_model:
            model = fleet.distributed_model(model)
        return model, fleet.distributed_optimizer(optimizer)
    if offload and needs_cpu_backend():
        if not cpu_backend.is_installed():  # without cpu.stage3_offload Paddle's offload moves free the only copy
            raise RuntimeError("sharding offload on CPU needs paddletrainer's CPU backend: create the topology "
                               "with paddletrainer.parallel.init_topology before apply_sharding")
    group, dp_group, device = topology.sharding_group, topology.dp_group, _device()
    with _construction_scope():
        if stage == 2:
            with _parameter_settings_kept(optimizer._parameter_list):
                optimizer = _BalancedStage2Optimizer(params=optimizer._parameter_list, optim=optimizer, group=group,
                                                     offload=offload, dp_group=dp_group, device=device)
            model = GroupShardedStage2(model, optimizer, group=group, sync_buffers=True, dp_group=dp_group,
                                       device=device)
        else:
            model = _ReduceScatterStage3(model, optimizer=optimizer, group=group, sync_buffers=True,
                                         segment_size=config.stage3_segment_size, offload=offload,
                                         dp_group=dp_group, device=device,
                                         exclude_layer=list(lazy_init.STAGE3_EXCLUDED_LAYERS))
            if needs_cpu_backend():  # the unsliced parameters just freed (built before init_topology held the
                host_allocator.return_free_heap()  # mmap threshold, they may sit in the heap): pages back
    return model, optimizer


@contextlib.contextmanager
def _parameter_settings_kept(parameters):
    """Keep each parameter's regularizer and learning-rate factor as the user's optimizer set them.

    ``GroupShardedOptimizerStage2`` runs the base ``Optimizer.__init__`` over the user's parameter groups, whose
    ``_add_param_group`` turns a group's float ``weight_decay`` into ``param.regularizer = L2Decay(wd)``: an
    AdamW's decoupled decay would then also be added to the gradient (coupled L2), and the run leaves one
    process silently (AdamW's own ``_add_param_group`` sets no regularizer).
    """
    params = [p for group in parameters for p in group["params"]] if parameters and isinstance(parameters[0], dict) \
        else list(parameters or [])
    kept = [(p, getattr(p, "regularizer", None), dict(p.optimize_attr)) for p in params]
    yield
    for param, regularizer, optimize_attr in kept:
        param.regularizer = regularizer
        param.optimize_attr.clear()
        param.optimize_attr.update(optimize_attr)


def balanced_partition(sizes, world_size: int) -> list:
    """The rank of each item of ``sizes``: largest first, each to the rank with the smallest total so far.

    The longest-processing-time rule: the ranks' totals differ by at most one item (the last one the fullest
    rank received), and the largest total is within 4/3 of the best possible. Ties go to the earlier item and the lower rank, so
    the result depends on the sizes and their order only: every rank computes the same partition.
    """
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    loads, ranks = [0] * world_size, [0] * len(sizes)
    for index in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        rank = min(range(world_size), key=lambda r: (loads[r], r))
        ranks[index] = rank
        loads[rank] += sizes[index]
    return ranks


# Paddle's cache of the partition, ``self.__segment_params`` inside GroupShardedOptimizerStage2 (name-mangled):
# ``_clear_cache`` empties it, and ``_segment_params`` rebuilds it when empty.
_PADDLE_SEGMENTS = "_GroupShardedOptimizerStage2__segment_params"


class _BalancedStage2Optimizer(GroupShardedOptimizerStage2):
    """``GroupShardedOptimizerStage2`` whose ranks own near-equal numbers of trainable elements.

    Paddle 3.3.1's ``_segment_params`` gives each parameter, in model order, to the rank with the smallest
    running total, so the order decides: on a Llama with an untied head the embedding goes to rank 0, the
    layers even the ranks out, and the head, as large as the embedding and last, lands on top of one of them
    (168M Llama, hidden 1024, 8 layers, vocab 32000, two ranks: 69.2M / 99.1M elements, 43% apart). Here the
    same parameters are placed largest first (:func:`balanced_partition`; 84.2M / 84.2M there). Each
    rank's list keeps model order, as Paddle's. The rest of Paddle's stage 2 follows ``_segment_params``:
    ``param2rank``, ``dtype_rank_params`` (the per-rank parameter storages, the states each rank's optimizer
    keeps), ``rank_buffer_size`` and ``GroupShardedStage2``'s gradient storages. Checkpoints name tensors,
    not ranks, so one saved under either partition loads under the other.
    """

    def __init__(self, *args, **kwargs):
        check_paddle_stage2_sources()  # before Paddle's constructor partitions anything
        super().__init__(*args, **kwargs)

    def _segment_params(self):
        if not getattr(self, _PADDLE_SEGMENTS):
            sizes = [p._numel() if p.trainable else 0 for p in self._local_params]  # Paddle counts trainable only
            segments = [[] for _ in range(self.world_size)]
            for param, rank in zip(self._local_params, balanced_partition(sizes, self.world_size)):
                segments[rank].append(param)
            setattr(self, _PADDLE_SEGMENTS, segments)
        return getattr(self, _PADDLE_SEGMENTS)

    def _update_task(self, task):
        """Keep the last reduce's task only when the step must wait for it (``reduce_overlap``).

        Paddle keeps it either way (``_comm_task``), and a finished gloo task still holds the tensor it reduced:
        on every rank but the owner of the parameter whose gradient is reduced last (on a Llama, the
        embedding: the first layer, so the last in backward), that gradient, already cleared from the
        parameter, stays alive until the next step's first reduce, across the optimizer step and into the
        forward. On the 45.6M Llama (docs/benchmarks.md "Memory per rank") that was the whole 63 MiB gap between
        the two stage-2 ranks (Paddle's allocated host bytes 505 vs 442 MiB, equal once the task is dropped).
        A synchronous reduce (``sync_op=True`` without overlap) has finished when ``dist.reduce`` returns, and
        only the overlapped step reads ``_comm_task``, so nothing waits on the dropped task.
        """
        if self._reduce_overlap:
            GroupShardedOptimizerStage2._update_task(self, task)
        else:
            self._comm_task = None


# Set on a sliced parameter of _ReduceScatterStage3 whose padded size is its own size: backward's gradient tensor is
# reduced as it is, with no zero-filled buffer to accumulate it into (see install_gradient_buffers_where_padded).
_GRADIENT_IN_PLACE = "_paddletrainer_stage3_gradient_in_place"


def _create_params_grad_where_padded(trainable_params, param2buffer_size, task_flow):
    """Paddle's ``_create_params_grad`` for the parameters that need its buffer, the others left to backward.

    Paddle gives every sliced parameter, before its backward, a zero-filled gradient buffer of the padded size
    (a multiple of the group's), and backward adds the computed gradient into it: at that moment both are alive,
    two full-size gradients of the layer (the embedding's and the head's are the peak of the step). A parameter of
    :class:`_ReduceScatterStage3` marked ``_GRADIENT_IN_PLACE`` needs no padding, so it gets no buffer: backward's
    gradient becomes ``param.grad`` as it is, and the hook reduce-scatters that tensor (the same values: 0 + g).
    """
    padded = [p for p in trainable_params if not getattr(p, _GRADIENT_IN_PLACE, False)]
    return _create_params_grad_where_padded.__wrapped_paddle__(padded, param2buffer_size, task_flow)


def install_gradient_buffers_where_padded() -> None:
    """Put :func:`_create_params_grad_where_padded` in ``group_sharded_stage3`` (its ``ForwardPostHooks.backward``
    looks the function up there at call time); a parameter not marked gets Paddle's buffer as before. Idempotent;
    the source check reads Paddle's function through ``__wrapped_paddle__``."""
    if group_sharded_stage3._create_params_grad is not _create_params_grad_where_padded:
        _create_params_grad_where_padded.__wrapped_paddle__ = group_sharded_stage3._create_params_grad
        group_sharded_stage3._create_params_grad = _create_params_grad_where_padded


class _ReduceScatterStage3(GroupShardedStage3):
    """``GroupShardedStage3`` whose backward hooks reduce-scatter each sliced gradient instead of all-reducing it.

    Paddle 3.3.1's hook (``GroupShardedStage3._get_allreduce_fn``) runs ``dist.all_reduce`` on the whole padded
    gradient and then keeps this rank's slice of it: a ring all-reduce sends 2·(N−1)/N of the gradient per
    rank, twice what a reduce-scatter, which delivers just the slice, needs. Here the hook reduce-scatters the
    same padded buffer (scaled by 1/N first, as Paddle does, so the values are the same sum) into a fresh slice,
    all-reduces only that slice over the dp group when there is one (Paddle all-reduces the whole gradient
    there too), and accumulates it into ``bw_storage`` exactly as Paddle does (over micro-batches; on the host in
    fp32 under offload). Then Paddle's own hook runs for the rest — releasing the gathered full parameter —
    and finds no gradient left to reduce. Parameters at or below the segment size are not sliced; their
    gradients stay in Paddle's fused buffers, all-reduced once per step in ``_update_params_slice``.

    On a CPU build gloo has no reduce-scatter and ``cpu.reduce_scatter`` provides an exact one
    built on an all-reduce, so the bytes on the wire stay those of an all-reduce there; with NCCL this halves
    the gradient traffic of stage 3.
    """

    def __init__(self, *args, **kwargs):
        check_paddle_stage3_sources()  # before Paddle's constructor allocates or communicates anything
        super().__init__(*args, **kwargs)
        install_gradient_buffers_where_padded()
        if not (self._offload or self.use_main_grad):
            for param in self._layer.parameters():  # a slice of the group's size each: no padding to add
                if self._param2buffer_size.get(param.name) == param._numel():
                    setattr(param, _GRADIENT_IN_PLACE, True)

    @paddle.autograd.no_grad()
    def _sync_params_and_buffers(self):
        # Paddle broadcasts every parameter from the group's first rank. A lazily built model's sliced
        # parameters hold no data: each rank drew its own slice from the same stream (lazy_init), so only the
        # materialised ones are broadcast, over the sharding group and then dp, as Paddle does.
        for param in self._layer.parameters():
            if hasattr(param, lazy_init.SLICE_ATTR):
                continue
            dist.broadcast(param, src=self._global_root_rank, group=self._group, sync_op=True)
            if self._dp_group is not None and self._dp_group.nranks > 1:
                dist.broadcast(param, src=self._dp_group.ranks[0], group=self._dp_group, sync_op=True)

    def _param_storage(self, param, buffer_size):
        """Paddle's slice storage of ``param``; for a lazily built parameter, the slice ``lazy_init`` drew."""
        piece = getattr(param, lazy_init.SLICE_ATTR, None)
        if piece is None:
            return super()._param_storage(param, buffer_size)
        start, end = self._param2buffer[param.name][self._rank]
        if list(piece.shape) != [end - start] or self._offload or param.dtype != paddle.float32:
            raise RuntimeError(f"lazy stage 3: {param.name}'s slice ({piece.shape}, {param.dtype}) is not Paddle's "
                               f"range {start}..{end} of an fp32 parameter without offload")
        param.fw_storage = core.eager.Tensor(value=piece, name="slice@" + param.name)  # what Paddle names it
        param.status = "part"
        delattr(param, lazy_init.SLICE_ATTR)
        return None

    def _get_allreduce_fn(self, param):
        release_full_param = super()._get_allreduce_fn(param)

        @paddle.autograd.no_grad()
        def release_then_reduce_scatter(*args):
            # The gradient is complete, and with it every use of the gathered parameter in this backward (its
            # grad node computed the input's gradient too): Paddle's hook, finding no gradient left to reduce,
            # frees the gathered parameter first, so it is not alive beside the gradient's reduction buffers.
            full_grad = self._task_flow.full_grad.pop(param.name, None)
            if full_grad is None and getattr(param, _GRADIENT_IN_PLACE, False) and param.grad is not None:
                full_grad = param.grad.reshape([-1])  # the backward's own gradient tensor, flat (a view)
            release_full_param(*args)
            if full_grad is not None:
                self._reduce_scatter_into_slice(param, full_grad)

        return release_then_reduce_scatter

    def _reduce_scatter_into_slice(self, param, full_grad):
        start, end = self._param2buffer[param.name][self._rank]
        full_grad.scale_(scale=self._world_size_scaling)  # SUM of the 1/N-scaled gradients, as Paddle's mean
        grad_slice = paddle.empty([end - start], dtype=full_grad.dtype)
        if cpu_backend.is_installed():  # gloo's reduce-scatter is an all-reduce: in place on this scratch buffer
            cpu_backend.reduce_scatter.reduce_scatter_into(grad_slice, full_grad, group=self._group, scratch_input=True)
        else:
            dist.reduce_scatter(grad_slice, full_grad, op=dist.ReduceOp.SUM, group=self._group, sync_op=True)
        if self._dp_group is not None and self._dp_group.nranks > 1:
            grad_slice.scale_(scale=1.0 / self._dp_group.nranks)
            dist.all_reduce(grad_slice, group=self._dp_group)
        if self._offload:  # fp32 on the host; the module attribute, which cpu.stage3_offload replaces on CPU
            grad_slice = group_sharded_stage3._device2cpu(grad_slice, True)
        if param.bw_storage is None:
            param.bw_storage = grad_slice
        elif self._offload:
            with device_guard():
                param.bw_storage = paddle.add(param.bw_storage, grad_slice)
        else:
            param.bw_storage = paddle.add(param.bw_storage, grad_slice)
        # drop the full-size gradient (param.grad / main_grad are views of full_grad)
        if self.use_main_grad:
            param.main_grad = None
        else:
            param.clear_gradient(False)


@functools.lru_cache(maxsize=1)
def check_paddle_stage3_sources() -> None:
    """Raise ``RuntimeError`` unless the installed Paddle's stage-3 functions listed in
    ``paddle_contract.STAGE3_SOURCES`` are, token for token, those :class:`_ReduceScatterStage3` was written
    against. Cached: the installed Paddle does not change within a process (tests call ``cache_clear()``)."""
    problems = paddle_contract.digest_problems(paddle_contract.STAGE3_SOURCES)
    if problems:
        raise RuntimeError("paddletrainer's stage-3 gradient reduce-scatter (_ReduceScatterStage3) was written "
                           "against other Paddle code: " + "; ".join(problems)
                           + ". Then update the digest in paddle_contract.STAGE3_SOURCES.")


@functools.lru_cache(maxsize=1)
def check_paddle_stage2_sources() -> None:
    """Raise ``RuntimeError`` unless the installed Paddle's stage-2 functions listed in
    ``paddle_contract.STAGE2_SOURCES`` are, token for token, those :class:`_BalancedStage2Optimizer` was written
    against. Cached (tests call ``cache_clear()``)."""
    problems = paddle_contract.digest_problems(paddle_contract.STAGE2_SOURCES)
    if problems:
        raise RuntimeError("paddletrainer's balanced stage-2 partition (_BalancedStage2Optimizer) was written "
                           "against other Paddle code: " + "; ".join(problems)
                           + ". Then update the digest in paddle_contract.STAGE2_SOURCES.")


def _v2_of(optimizer):
    """The ``DygraphShardingOptimizerV2`` among the optimizers ``optimizer`` wraps, or None."""
    return next((o for o in optimizer_layers(optimizer) if isinstance(o, DygraphShardingOptimizerV2)), None)


class SplitParamSharding:
    """Sharding stage 1 V2 (``split_param``) seen through its comm buffers.

    ``DygraphShardingOptimizerV2`` copies every parameter into a flat, padded buffer and makes the
    parameter and its ``.grad`` views of it. Sharding rank r owns range ``[r·n, (r+1)·n)`` of each buffer
    (n = buffer size / sharding degree); the optimizer updates a flat "slice parameter" per parameter, the
    part of that parameter (and of its padding) inside the owned range, and holds state only for it.

    Args:
        optimizer: the ``HybridParallelOptimizer`` fleet returned (it wraps the V2 optimizer).
    """

    def __init__(self, optimizer):
        self._v2 = _v2_of(optimizer)
        self._views = {}  # param name -> ShardingGradView (index, owned range, gradient slice)
        for buffer in self._v2._comm_buffer_list:
            self._views.update(buffer._sharding_param_grad_view)
        # Give every slice parameter its real shape now (Paddle does it lazily at the first step), so that a
        # checkpoint loaded before the first step finds optimizer states of the right size.
        for name, (start, stop) in self.owned_ranges().items():
            slice_param = self._v2._slice_params[name]
            self._views[name].fill_slice_param(slice_param)
            slice_param.ckpt_flat_range = (start, stop)  # read by checkpoint.local_state

    @staticmethod
    def of(optimizer):
        """A :class:`SplitParamSharding` when ``optimizer`` runs V2, else None."""
        return SplitParamSharding(optimizer) if _v2_of(optimizer) is not None else None

    def link_slice_gradients(self) -> None:
        """Make each slice parameter's ``.grad`` a view of its owned gradient range (Paddle does this only
        inside ``step``; the dp all-reduce and the norm need it before)."""
        self._v2._assign_slice_grad()

    def slice_gradients(self) -> list:
        """``(param, gradient slice)`` for every parameter with a non-empty owned range on this rank: views of
        the reduce-scattered gradient buffer, the only gradient values V2's step reads (padding is zero)."""
        out = []
        for param in self._v2._parameter_list:
            view = self._views[param.name]
            if view.has_effective_slice_param and view._slice_grad is not None:
                out.append((param, view._slice_grad))
        return out

    def zero_gradients(self) -> None:
        """Zero the gradient buffers in place.

        Not ``clear_grad``: ``Tensor.clear_gradient(set_to_zero=True)`` marks the gradient "fake empty", so the
        next backward *replaces* ``param.grad`` with a new tensor instead of adding into the buffer view, so
        the buffers (what V2 reduce-scatters and steps on) no longer receive the gradients: from the second
        step on, training silently departs from one process.
        """
        for buffer in self._v2._comm_buffer_list:
            buffer.grad_storage.zero_()

    def owned_ranges(self) -> dict:
        """``{param name: (start, stop)}``: the flat range of each parameter (padding included) that this
        rank's slice parameter covers, for parameters with a non-empty owned range."""
        return {name: (int(view._param_begin - view._index), int(view._param_end - view._index))
                for name, view in self._views.items() if view.has_effective_slice_param}


class _Stage2DeferredReduce:
    """Gradient accumulation for ``GroupShardedStage2`` with one reduction per optimizer step.

    ``GroupShardedStage2`` re-arms its backward hooks in every forward (``_init_internal_storage``: the
    counters, and a fresh zero buffer for the gradients other ranks own), so every micro-batch's backward
    reduces its gradients to their owners: accumulation A sends A times the gradients. Inside
    :func:`stage2_no_sync` the forward leaves the hooks disarmed and the buffers alone, so gradients
    accumulate locally; the next forward outside it arms the hooks without touching the buffers, and that
    backward reduces the accumulated sum once.
    """

    def __init__(self, model):
        missing = [name for name in ("_init_internal_storage", "_clear_counters", "_grad_reduced", "_trainable_params")
                   if not hasattr(model, name)]
        if missing:  # the hooks' skip flag and the forward's re-arming are what this relies on
            raise RuntimeError(f"GroupShardedStage2 no longer has {missing}: paddletrainer's stage2 no_sync "
                               "(parallel/sharding.py) must be reviewed for this Paddle version")
        self.model = model
        self.deferring = False
        self.pending = False  # gradients accumulated locally since the last reduction
        self._original = model._init_internal_storage
        model._init_internal_storage = self._init_internal_storage

    def _init_internal_storage(self, needs_fresh):
        model = self.model
        if self.pending and needs_fresh:  # Paddle would rebuild the gradient storage, dropping the accumulated sum
            raise RuntimeError("GroupShardedStage2 must rebuild its gradient storage (the trainable parameters changed) "
                               "while gradients are being accumulated: change stop_gradient only between optimizer steps")
        if self.pending:
            model._clear_counters()  # arm the hooks; keep the accumulated gradients
        else:
            self._original(needs_fresh)
        if self.deferring and model.training:
            model._grad_reduced = [False] * len(model._trainable_params)  # hooks skip this backward
            self.pending = True
        else:
            self.pending = False


def is_stage2_model(model) -> bool:
    """True for a ``GroupShardedStage2``-wrapped model."""
    return isinstance(model, GroupShardedStage2)


@contextlib.contextmanager
def stage2_no_sync(model):
    """Inside: forward/backward of ``GroupShardedStage2`` ``model`` accumulate without reducing (see
    :class:`_Stage2DeferredReduce`); the first forward after it reduces the accumulated gradients."""
    state = getattr(model, "_paddletrainer_deferred_reduce", None)
    if state is None:
        state = _Stage2DeferredReduce(model)
        model._paddletrainer_deferred_reduce = state
    state.deferring = True
    try:
        yield
    finally:
        state.deferring = False


class Stage2Optimizer(ParallelOptimizer):
    """:class:`~.optimizer.ParallelOptimizer` of sharding stage 2 (``GroupShardedOptimizerStage2`` on a
    ``GroupShardedStage2`` model): the sync is what the stage-2 model's redefined step runs before the update."""

    MODE = "stage2"

    def sync_gradients(self) -> None:
        if self._synced:
            return
        with paddle.no_grad():
            self._model._grad_scale()  # the reduced gradients × 1/sharding
            self._model._dp_allreduce()
        self._finish_sync()

    def step(self) -> None:
        self.sync_gradients()
        with paddle.no_grad():
            type(self._optimizer).step(self._optimizer)  # the class's step: the instance's wrapper would scale again

    def clear_grad(self, set_to_zero: bool = True) -> None:
        self._synced = False
        self._optimizer.clear_grad()  # the stage-2 wrapper's buffer-aware clear

    def named_counted_gradients(self) -> list:
        owner, rank = self._optimizer._param2rank, self._topology.sharding_rank
        return self._counted([(p, p.grad, owner[p.name] == rank) for p in self._optimizer._local_params])


class Stage3Optimizer(ParallelOptimizer):
    """:class:`~.optimizer.ParallelOptimizer` of sharding stage 3 (``GroupShardedStage3``): the sync moves the
    reduced slices into place; the step runs with ``update_scaler`` set, so it does not re-slice."""

    MODE = "stage3"

    def sync_gradients(self) -> None:
        if self._synced:
            return
        with paddle.no_grad():
            self._model._update_params_slice()
        self._finish_sync()

    def step(self) -> None:
        self.sync_gradients()
        # Stage 3's step re-slices unless update_scaler is set (GroupShardedScaler uses the same flag).
        previous = getattr(self._optimizer, "update_scaler", None)
        self._optimizer.update_scaler = True
        try:
            with paddle.no_grad():
                self._optimizer.step()
        finally:
            self._optimizer.update_scaler = previous

    def clear_grad(self, set_to_zero: bool = True) -> None:
        self._synced = False
        self._optimizer.clear_grad()  # the stage-3 wrapper's buffer-aware clear

    def named_counted_gradients(self) -> list:
        # after the sync the inner optimizer's parameters are [slices..., unsliced params...] (with parameter
        # groups, only the groups hold the slices: Paddle leaves _parameter_list as built)
        unsliced = {id(p) for p in self._model._unslice_params}
        return self._counted([(p, p.grad, id(p) not in unsliced or self._topology.sharding_rank == 0)
                              for p in flat_parameters(self._optimizer._param_groups)])
