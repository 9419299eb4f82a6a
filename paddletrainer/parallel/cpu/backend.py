"""Fills for the gaps Paddle's CPU build (gloo) has in its hybrid-parallel machinery.

Paddle 3.3.1 runs data parallel and sharding stage 1 on gloo as shipped, but tensor parallel, pipeline
parallel, groups of 4+ processes and sharding stage 2/3 each trip over a GPU-only assumption. Every fill
below names the Paddle function it replaces and why; :func:`install` applies them once per process, and
only :func:`paddletrainer.parallel.topology.init_topology` calls it (and only on a CPU-only build).

:func:`check_paddle_assumptions` verifies that every symbol we patch still exists with the shape we rely on,
so a Paddle upgrade that moves one fails the unit tests instead of silently running unpatched code.

The fills:

1. one gloo TCP store per process group (``collective._new_process_group_impl``),
2. tensor-parallel ops as autograd functions over all_reduce / all_gather (``mp_ops._c_identity``, ...;
   they live in :mod:`paddletrainer.parallel.cpu.tp_ops`),
3. ``hybrid_parallel_util.broadcast_input_data`` is a no-op,
4. ``ParallelEnv.device_id`` defaults to 0 and pipeline p2p uses plain blocking send/recv,
5. sharding stage 2/3 construction (:func:`group_sharded_construction`, a scoped context manager),
6. (retired: sequence parallel used to be refused here; fill 9 made it run),
7. sharding stage 3 offload: host<->device moves that copy instead of aliasing (``group_sharded_stage3``'s
   ``_device2cpu``/``_cpu2device`` and the unsliced-parameter part of ``_clear_gradients``),
8. the interleaved pipeline (virtual stages): p2p batches and shape metadata in a ring-safe order for
   gloo's blocking send/recv (``p2p_communication._batched_p2p_ops``, ``P2pHelper``), which also makes two
   stages correct, so Paddle's "pp degree > 2" sanity check is relaxed to 2 (they live in
   :mod:`paddletrainer.parallel.cpu.interleave`),
9. an exact reduce-scatter over ``all_reduce`` for gloo, which has none (``stream.reduce_scatter``'s
   ``_reduce_scatter_tensor_in_dygraph`` / ``_reduce_scatter_in_dygraph`` and ``paddle.distributed.reduce_scatter``;
   it lives in :mod:`paddletrainer.parallel.cpu.reduce_scatter`): sequence parallel's ``ReduceScatterOp`` / ``AllGatherOp``
   backward and sharding stage1 V2's gradient buffers run on it,
10. sharding stage1 V2 (``split_param``): ``tensor_fusion_helper.alignment`` gets an entry for the device type
   it reports on CPU ("unknown"), with the GPU's 256 bytes, so the comm buffers (and the slices each rank
   owns) are laid out exactly as on a GPU,
11. an exact all-to-all over ``all_gather`` for gloo, which has none (``stream.all_to_all``'s dygraph helpers;
   it lives in :mod:`paddletrainer.parallel.cpu.all_to_all`, with its own assumption checks): the sep
   (Ulysses) attention's all-to-all runs on it.
"""
from __future__ import annotations

import contextlib
import importlib
import inspect
import os
import socket
import threading

import paddle
import paddle.distributed as dist

from .all_to_all import install_all_to_all
from .interleave import install_interleave
from .reduce_scatter import STREAM_MODULE as _REDUCE_SCATTER_MODULE, install_reduce_scatter
from .tp_ops import _c_concat, _c_identity, _c_split, _mp_allreduce, parallel_softmax_cross_entropy
from ..tcp_store import prime_disconnect_logging

__all__ = [
    "install",
    "is_installed",
    "check_paddle_assumptions",
    "group_sharded_construction",
    "store_port_for_group",
    "parallel_softmax_cross_entropy",
]

_INSTALLED = False
_LOCK = threading.Lock()

# Keeps every per-group TCPStore alive for the life of the process (gloo reads from it lazily).
_GROUP_STORES: dict = {}
# The global ranks of the group being created; set by our ``new_group`` wrapper, read by the
# process-group factory (Paddle passes only the in-group rank and size down to the factory).
_PENDING_GROUP_RANKS = threading.local()

# Environment variable: fixed ports for the per-group stores (see store_port_for_group).
STORE_BASE_PORT_ENV = "PADDLETRAINER_GLOO_STORE_BASE_PORT"


# --------------------------------------------------------------------------------------------------
# Fill 1: one TCP store per gloo process group
# --------------------------------------------------------------------------------------------------
def store_port_for_group(group_id: int) -> int | None:
    """The fixed TCP port of group ``group_id``'s store, or None to let its master pick a free port.

    Fixed ports are used only when ``PADDLETRAINER_GLOO_STORE_BASE_PORT`` is set (port = base + group id,
    e.g. base 50000 puts group 11 on 50011): for clusters where only a known port range is open.
    Otherwise a fixed scheme is fragile: a port derived from the launcher's (which sit in the kernel's
    ephemeral range) was observed taken by an outgoing connection in a 16-process run, and the store's
    bind failure aborts the process.
    """
    override = os.environ.get(STORE_BASE_PORT_ENV)
    return int(override) + group_id if override else None


def _free_port() -> int:
    """A port that is free right now on this host (the OS picks it; the store binds it right after)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        return sock.getsockname()[1]


def _group_store(global_ranks, group_rank: int, group_size: int, group_id: int):
    """Create the store of one group; its master is the group's first member.

    The master picks the port and publishes ``host:port`` under a per-group key in the launcher's default
    store *before* it starts the server (TCPStore's master constructor returns only once every member has
    connected, so publishing afterwards would deadlock); members read the key (``get`` blocks until it is
    set) and connect, retrying until the server listens.
    """
    from paddle.base import core
    from paddle.distributed import collective

    key = f"paddletrainer/gloo_group_store/{group_id}"
    default_store = collective._default_store
    if default_store is None:
        raise RuntimeError("gloo subgroups need the default store: call init_topology (fleet.init) first")
    port = store_port_for_group(group_id)
    if group_rank == 0:
        endpoints = os.environ.get("PADDLE_TRAINER_ENDPOINTS", "").split(",")
        first = global_ranks[0] if global_ranks else 0
        mine = endpoints[first] if first < len(endpoints) and endpoints[first] else "127.0.0.1:0"
        host = mine.rsplit(":", 1)[0]
        port = _free_port() if port is None else port
        default_store.set(key, f"{host}:{port}")
        store = core.TCPStore(host, port, True, group_size, 900)
        prime_disconnect_logging(host, port)  # this process now hosts a store server: see tcp_store
    else:
        address = bytes(default_store.get(key)).decode()
        host, port = address.rsplit(":", 1)
        store = core.TCPStore(host, int(port), False, group_size, 900)
    _GROUP_STORES[group_id] = store
    return store


def _make_new_process_group_impl(original):
    def _new_process_group_impl(backend, store, rank, world_size, group_name, pg_options, group_id=0, *args, **kwargs):
        # Replaces collective._new_process_group_impl for gloo subgroups. Paddle creates every gloo group
        # through the ONE default store, and the rendezvous keys of different groups overwrite each other:
        # with 4+ processes group creation fails at random ("Connection refused", "TIMEOUT self_rank",
        # "address.cc:30 ... 136 vs 45"). A private store per group makes the keys disjoint.
        if backend == "gloo" and group_id != 0:
            ranks = getattr(_PENDING_GROUP_RANKS, "ranks", None)
            store = _group_store(ranks, rank, world_size, group_id)
        return original(backend, store, rank, world_size, group_name, pg_options, group_id, *args, **kwargs)

    _new_process_group_impl.__wrapped_paddle__ = original
    return _new_process_group_impl


def _make_new_group(original):
    def new_group(ranks=None, *args, **kwargs):
        # Records the global ranks so the store's master host is that of the group's first member.
        _PENDING_GROUP_RANKS.ranks = sorted(ranks) if ranks is not None else None
        try:
            return original(ranks, *args, **kwargs)
        finally:
            _PENDING_GROUP_RANKS.ranks = None

    new_group.__wrapped_paddle__ = original
    new_group.__doc__ = original.__doc__
    return new_group


def _install_group_stores():
    from paddle.distributed import collective
    from paddle.distributed.fleet.meta_parallel.sharding import group_sharded_optimizer_stage2 as gso2

    collective._new_process_group_impl = _make_new_process_group_impl(collective._new_process_group_impl)
    wrapped = _make_new_group(collective.new_group)
    # new_group is reached as paddle.distributed.new_group (fleet topology), collective.new_group
    # (stage 3) and a by-name import in the stage-2 optimizer: patch all three references.
    collective.new_group = wrapped
    dist.new_group = wrapped
    gso2.new_group = wrapped


# --------------------------------------------------------------------------------------------------
# Fill 2: tensor-parallel ops (no CPU kernels for c_identity / c_split / c_concat / c_softmax_with_ce)
# --------------------------------------------------------------------------------------------------
def _install_tensor_parallel_ops():
    from paddle.distributed import collective
    from paddle.distributed.fleet.layers.mpu import mp_ops

    mp_ops._c_identity = _c_identity
    mp_ops._c_split = _c_split
    mp_ops._c_concat = _c_concat
    mp_ops._mp_allreduce = _mp_allreduce
    mp_ops._c_softmax_with_cross_entropy = parallel_softmax_cross_entropy
    # collective re-exports these by name; PaddleNLP's Llama head calls collective._c_identity/_c_concat.
    collective._c_identity = _c_identity
    collective._c_split = _c_split
    collective._c_concat = _c_concat
    collective._mp_allreduce = _mp_allreduce


# --------------------------------------------------------------------------------------------------
# Fill 3: broadcast_input_data
# --------------------------------------------------------------------------------------------------
def _broadcast_input_data(hcg, *inputs, **kwargs):
    """Replaces hybrid_parallel_util.broadcast_input_data, which asserts a GPU/XPU device.

    TensorParallel.forward calls it to copy the batch from tp-rank 0 to the other tp ranks. Our data
    order gives every rank of a tensor-parallel group the same batch already, so there is nothing to do.
    """
    return inputs, kwargs


def _install_broadcast_input_data():
    from paddle.distributed.fleet.meta_parallel import tensor_parallel
    from paddle.distributed.fleet.utils import hybrid_parallel_util

    hybrid_parallel_util.broadcast_input_data = _broadcast_input_data
    tensor_parallel.broadcast_input_data = _broadcast_input_data  # imported there by name


# --------------------------------------------------------------------------------------------------
# Fill 4: pipeline parallel (device id, p2p)
# --------------------------------------------------------------------------------------------------
# Neighbour-pair groups of the pipeline, {frozenset((me, peer)): group}; filled only when pp > 2.
_PAIR_GROUPS: dict = {}


def _p2p_group(group, peer: int):
    """The 2-rank group shared with ``peer`` when one exists (pp > 2), else ``group``."""
    if not _PAIR_GROUPS:
        return group
    return _PAIR_GROUPS.get(frozenset((dist.get_rank(), peer)), group)


def _send_on_calc_stream(tensor, group, dst, nranks=1, rank_id=0):
    """Replaces p2p_communication._send_on_calc_stream.

    gloo rejects ``send_on_calc_stream`` ("does not support send with sync_op and use_calc_stream");
    its plain blocking ``send`` does the same job. Partial send (a 1/mp slice) is never used: the
    strategy turns ``enable_partial_send_recv`` off on CPU because gloo lacks ``all_gather_partial``.
    """
    group = _p2p_group(group, dst)
    return group.process_group.send(tensor, group.get_group_rank(dst), True)


def _recv_on_calc_stream(tensor, group, src, nranks=1, rank_id=0):
    """Replaces p2p_communication._recv_on_calc_stream (see :func:`_send_on_calc_stream`)."""
    group = _p2p_group(group, src)
    return group.process_group.recv(tensor, group.get_group_rank(src), True)


def install_pipeline_pair_groups(hcg) -> None:
    """Fill 4b: with more than 2 stages, carry pipeline p2p on one 2-rank group per neighbour pair.

    Paddle sends the first step's shape metadata (``SendRecvMeta.send_meta/recv_meta`` →
    ``paddle.distributed.send/recv``) and the activations over the whole pipe group. On gloo, with 4
    stages in one group, the first step hangs (TIMEOUT in stage 0's send_meta while stage 2 waits in
    recv_meta); pp2 — a group that is already a pair — works. So every pipe's neighbours (i, i+1 mod pp)
    get their own group and both paths use it. Called once after ``fleet.init``; ``new_group`` is
    collective, so every rank creates every pair in the same order.
    """
    from paddle.distributed.fleet.meta_parallel.pp_utils import p2p_communication

    if hcg.get_pipe_parallel_world_size() <= 2 or _PAIR_GROUPS:
        return
    me = dist.get_rank()
    for ranks in hcg.topology().get_comm_list("pipe"):
        for i in range(len(ranks)):
            pair = sorted({ranks[i], ranks[(i + 1) % len(ranks)]})
            group = dist.new_group(pair)
            if me in pair:
                _PAIR_GROUPS[frozenset(pair)] = group

    meta_cls = p2p_communication.SendRecvMeta
    send_meta, recv_meta = meta_cls.send_meta, meta_cls.recv_meta

    def send_meta_over_pair(self, tensor, group, reverse=False, broadcast=False):
        if not broadcast:
            peer = hcg._get_p2p_prev_rank() if reverse else hcg._get_p2p_next_rank()
            group = _p2p_group(group, peer)
        return send_meta(self, tensor, group, reverse=reverse, broadcast=broadcast)

    def recv_meta_over_pair(self, group, reverse=False, broadcast=False):
        if not broadcast:
            peer = hcg._get_p2p_next_rank() if reverse else hcg._get_p2p_prev_rank()
            group = _p2p_group(group, peer)
        return recv_meta(self, group, reverse=reverse, broadcast=broadcast)

    meta_cls.send_meta, meta_cls.recv_meta = send_meta_over_pair, recv_meta_over_pair


def _install_pipeline():
    from paddle.distributed.fleet.meta_parallel.pp_utils import p2p_communication

    # PipelineLayer.__init__ reads ParallelEnv().device_id, which ParallelEnv sets only for
    # GPU/XPU/custom devices; a class-level default of 0 (the one CPU) fills the missing attribute.
    dist.ParallelEnv._device_id = 0
    # Module globals: _batched_p2p_ops and P2PonCalcStream look these names up at call time.
    p2p_communication._send_on_calc_stream = _send_on_calc_stream
    p2p_communication._recv_on_calc_stream = _recv_on_calc_stream


# --------------------------------------------------------------------------------------------------
# Fill 5: sharding stage 2 / 3 construction
# --------------------------------------------------------------------------------------------------
@contextlib.contextmanager
def group_sharded_construction():
    """Scope in which GroupShardedOptimizerStage2 / GroupShardedStage2 / GroupShardedStage3 can be built.

    Their constructors assume a GPU; during construction only we make these true:

    * ``core.is_compiled_with_cuda()`` → True: passes the asserts "Only GPU and XPU and CustomDevice is
      supported now" (group_sharded_optimizer_stage2.py) and "Only support CUDA / XPU / CustomDevice."
      (group_sharded_stage3.py). Nothing else in construction branches on it for device="cpu".
    * ``paddle.get_device()`` → "cpu:0": the stage-2 optimizer parses a device index from it
      (``int(paddle.get_device().split(":")[1])``) and would raise IndexError on "cpu".
    * ``ParamStorage.add_rank_params(convert_gpu=False)``: with True it calls ``param.cpu()``, which on
      CPU aliases the parameter, then clears it, destroying the weights ("Tensor not initialized yet").

    Training afterwards needs none of these; stage 3 offload needs fill 7 (installed with the others).
    Gradient clipping is done by :func:`paddletrainer.parallel.clipping.clip_grad_norm`, so Paddle's
    GroupShardedClipGrad (which calls ``.cuda``) is never installed.
    """
    from paddle.base import core
    from paddle.distributed.fleet.meta_parallel.sharding import group_sharded_storage

    saved_cuda = core.is_compiled_with_cuda
    saved_get_device = paddle.get_device
    saved_add = group_sharded_storage.ParamStorage.add_rank_params

    def add_rank_params(self, trainable_params, param2align, convert_gpu=True):
        return saved_add(self, trainable_params, param2align, convert_gpu=False)

    core.is_compiled_with_cuda = lambda: True
    paddle.get_device = lambda: "cpu:0"
    group_sharded_storage.ParamStorage.add_rank_params = add_rank_params
    try:
        yield
    finally:
        core.is_compiled_with_cuda = saved_cuda
        paddle.get_device = saved_get_device
        group_sharded_storage.ParamStorage.add_rank_params = saved_add


# --------------------------------------------------------------------------------------------------
# Fill 10: sharding stage1 V2 comm-buffer alignment
# --------------------------------------------------------------------------------------------------
CPU_FUSION_DEVICE_TYPE = "unknown"  # what tensor_fusion_helper.get_current_device_type finds for CPUPlace


def _install_tensor_fusion_alignment():
    from paddle.distributed.fleet.utils import tensor_fusion_helper

    tensor_fusion_helper.alignment.setdefault(CPU_FUSION_DEVICE_TYPE, tensor_fusion_helper.alignment["gpu"])


# --------------------------------------------------------------------------------------------------
# Fill 7: sharding stage 3 offload
# --------------------------------------------------------------------------------------------------
# GroupShardedStage3(offload=True) keeps each rank's fp32 master slice in host memory and moves the working
# copy between host and device around every forward/backward. Its move helpers assume two memories: on a
# CPU build ``tensor.cpu()`` returns the *same* tensor, so "copy to host, then free the device tensor"
# frees the only copy ("Tensor not initialized yet"), and ``tensor.to("cpu:0")`` is not a valid place.
# The fills keep Paddle's offload control flow (master weights, fp32 host gradients, the optimizer step
# under ``device_guard``) and only make each move a real copy, so the offload path runs on CPU exactly as
# it would with an accelerator, with host and "device" being the same memory.
def _offload_to_host(tensor, convert_dtype=False):
    """Replaces ``group_sharded_stage3._device2cpu``: a host copy of ``tensor``; frees ``tensor`` unless converting.

    Paddle frees only the temporary fp32 cast when ``convert_dtype`` is set (the caller still owns the
    original gradient), and the tensor itself otherwise; the fill frees the same one.
    """
    if convert_dtype:
        return paddle.cast(tensor, "float32")  # a new tensor even for float32 input
    host = tensor.detach().clone()
    tensor._clear_data()
    return host


def _offload_to_device(param):
    """Replaces ``group_sharded_stage3._cpu2device``: a working copy of ``param.fw_storage`` in the training dtype."""
    from paddle.distributed.fleet.meta_parallel.sharding import group_sharded_stage3 as gs3

    copy = param.fw_storage.detach().clone()
    dtype = gs3.param2dtype.get(param.name, copy.dtype)
    return copy if copy.dtype == dtype else paddle.cast(copy, dtype)


def _install_stage3_offload():
    from paddle.distributed.fleet.meta_parallel.sharding import group_sharded_stage3 as gs3

    for name, fill in (("_device2cpu", _offload_to_host), ("_cpu2device", _offload_to_device)):
        if getattr(gs3, name) is not fill:
            fill.__wrapped_paddle__ = getattr(gs3, name)
            setattr(gs3, name, fill)
    original_clear = gs3.GroupShardedStage3._clear_gradients
    if getattr(original_clear, "__paddletrainer_fill__", False):
        return

    @paddle.autograd.no_grad()
    def clear_gradients(self):
        if not self._offload:
            return original_clear(self)
        # Paddle's offload branch copies each unsliced parameter back from its host master with
        # ``param.to(device + ":" + id)``, which has no CPU form. Do that branch here (clear the gradient,
        # give the parameter its own copy in the training dtype, rebuild the released gradient buffers),
        # then run Paddle's method as without offload: its sliced-parameter part does not depend on the
        # flag, and its non-offload unsliced part only zeroes the freshly rebuilt (already zero) buffers.
        for param in list(self._unslice_params):
            if self.use_main_grad:
                param.main_grad = None
            else:
                param.clear_gradient(False)
            paddle.cast(param, gs3.param2dtype.get(param.name, param.dtype))._share_buffer_to(param)
        for grad_storage in self._grad_storages.values():
            grad_storage.manual_release()
            grad_storage.rebuild()
        self._offload = False
        try:
            return original_clear(self)
        finally:
            self._offload = True

    clear_gradients.__paddletrainer_fill__ = True
    clear_gradients.__wrapped_paddle__ = original_clear
    gs3.GroupShardedStage3._clear_gradients = clear_gradients


# --------------------------------------------------------------------------------------------------
# install / check
# --------------------------------------------------------------------------------------------------
def is_installed() -> bool:
    """True once :func:`install` ran in this process."""
    return _INSTALLED


def install() -> None:
    """Apply every CPU fill (idempotent). Call before ``fleet.init`` so the group stores take effect."""
    global _INSTALLED
    with _LOCK:
        if _INSTALLED:
            return
        check_paddle_assumptions()
        _install_group_stores()
        _install_tensor_parallel_ops()
        _install_broadcast_input_data()
        _install_pipeline()
        _install_stage3_offload()
        install_interleave()
        install_reduce_scatter()
        _install_tensor_fusion_alignment()
        install_all_to_all()  # fill 11 (sep/Ulysses): its own module, with its own assumption checks
        _INSTALLED = True


def _params_of(func) -> list:
    func = getattr(func, "__wrapped_paddle__", func)
    return list(inspect.signature(inspect.unwrap(func)).parameters)


def paddle_source(func) -> str:
    """The source of Paddle's ``func`` itself, through decorators and the fills' wrappers (``__wrapped_paddle__``):
    what the checks of patched or reproduced Paddle code read (here and in ``sharding``)."""
    func = getattr(func, "__wrapped_paddle__", func)
    return inspect.getsource(inspect.unwrap(func))


def check_paddle_assumptions() -> None:
    """Fail loudly if a Paddle symbol we patch (or the way Paddle calls it) changed.

    Checks names, signatures and the call sites that make each fill reach Paddle's code paths.
    Raises ``RuntimeError`` listing every broken assumption.
    """
    from paddle.base import core
    from paddle.distributed import collective
    from paddle.distributed.fleet.layers.mpu import mp_ops
    from paddle.distributed.fleet.meta_parallel import pipeline_parallel, tensor_parallel
    from paddle.distributed.fleet.meta_parallel.parallel_layers import pp_layers
    from paddle.distributed.fleet.meta_parallel.pp_utils import p2p_communication
    from paddle.distributed.fleet.meta_parallel.sharding import (
        group_sharded_optimizer_stage2 as gso2,
        group_sharded_stage3 as gs3,
        group_sharded_storage,
    )
    from paddle.distributed.fleet.utils import hybrid_parallel_util, sequence_parallel_utils

    problems = []

    def expect(condition, message):
        # condition is a zero-argument callable: a symbol that vanished fails its check, not the whole run
        try:
            ok = condition()
        except Exception as exc:  # noqa: BLE001 - any failure to inspect the symbol is a broken assumption
            ok, message = False, f"{message} ({type(exc).__name__}: {exc})"
        if not ok:
            problems.append(message)

    # 1. group stores
    expect(lambda: _params_of(collective._new_process_group_impl)[:7]
           == ["backend", "store", "rank", "world_size", "group_name", "pg_options", "group_id"],
           "collective._new_process_group_impl(backend, store, rank, world_size, group_name, pg_options, "
           "group_id, ...) signature changed")
    expect(lambda: "_new_process_group_impl(" in paddle_source(collective.new_group),
           "collective.new_group no longer creates its process group via _new_process_group_impl")
    expect(lambda: _params_of(collective.new_group)[:1] == ["ranks"], "collective.new_group(ranks, ...) changed")
    expect(lambda: hasattr(gso2, "new_group"), "group_sharded_optimizer_stage2 no longer imports new_group")
    expect(lambda: hasattr(core, "TCPStore") and hasattr(core, "ProcessGroupGloo"), "core.TCPStore / ProcessGroupGloo gone")
    # 2. tensor-parallel ops
    for name in ("_c_identity", "_c_split", "_c_concat", "_mp_allreduce", "_c_softmax_with_cross_entropy"):
        expect(lambda: callable(getattr(mp_ops, name, None)), f"mp_ops.{name} is gone")
    expect(lambda: _params_of(mp_ops._c_identity)[:3] == ["tensor", "group", "skip_c_identity_dynamic"],
           "mp_ops._c_identity(tensor, group, skip_c_identity_dynamic) signature changed")
    expect(lambda: _params_of(mp_ops._c_split)[:2] == ["tensor", "group"], "mp_ops._c_split signature changed")
    expect(lambda: _params_of(mp_ops._c_concat)[:2] == ["tensor", "group"], "mp_ops._c_concat signature changed")
    expect(lambda: _params_of(mp_ops._mp_allreduce)[:3] == ["tensor", "op", "group"], "mp_ops._mp_allreduce changed")
    expect(lambda: _params_of(mp_ops._c_softmax_with_cross_entropy)[:5]
           == ["logits", "label", "group", "return_softmax", "ignore_index"],
           "mp_ops._c_softmax_with_cross_entropy signature changed")
    for name in ("_c_identity", "_c_concat", "_c_split"):
        expect(lambda: hasattr(collective, name), f"collective.{name} re-export is gone")
    # 3. broadcast_input_data
    expect(lambda: _params_of(hybrid_parallel_util.broadcast_input_data)[:1] == ["hcg"],
           "hybrid_parallel_util.broadcast_input_data(hcg, *inputs, **kwargs) changed")
    expect(lambda: "broadcast_input_data" in vars(tensor_parallel), "tensor_parallel no longer imports broadcast_input_data")
    # 4. pipeline
    expect(lambda: "ParallelEnv().device_id" in inspect.getsource(pp_layers.PipelineLayer.__init__),
           "PipelineLayer.__init__ no longer reads ParallelEnv().device_id")
    for name in ("_send_on_calc_stream", "_recv_on_calc_stream"):
        expect(lambda: _params_of(getattr(p2p_communication, name))[:3] in (["tensor", "group", "dst"], ["tensor", "group", "src"]),
               f"p2p_communication.{name} signature changed")
    expect(lambda: hasattr(pipeline_parallel.PipelineParallel, "forward_backward_pipeline"),
           "PipelineParallel.forward_backward_pipeline is gone")
    # 5. sharding stage 2/3
    expect(lambda: "core.is_compiled_with_cuda()" in inspect.getsource(gso2.GroupShardedOptimizerStage2.__init__),
           "GroupShardedOptimizerStage2.__init__ no longer asserts is_compiled_with_cuda (drop the fill?)")
    expect(lambda: "core.is_compiled_with_cuda()" in inspect.getsource(gs3.GroupShardedStage3.__init__),
           "GroupShardedStage3.__init__ no longer asserts is_compiled_with_cuda (drop the fill?)")
    expect(lambda: "convert_gpu" in _params_of(group_sharded_storage.ParamStorage.add_rank_params),
           "ParamStorage.add_rank_params lost its convert_gpu argument")
    expect(lambda: "update_scaler" in inspect.getsource(gs3.GroupShardedStage3._redefine_opt_step),
           "GroupShardedStage3's optimizer step no longer honours update_scaler")
    # 7. sharding stage 3 offload
    expect(lambda: _params_of(gs3._device2cpu)[:2] == ["trans_param", "convert_dtype"],
           "group_sharded_stage3._device2cpu(trans_param, convert_dtype) signature changed")
    expect(lambda: _params_of(gs3._cpu2device)[:1] == ["param"], "group_sharded_stage3._cpu2device(param) changed")
    expect(lambda: ".cpu()" in paddle_source(gs3._device2cpu) and "_clear_data()" in paddle_source(gs3._device2cpu),
           "group_sharded_stage3._device2cpu no longer copies with .cpu() then frees (drop fill 7?)")
    expect(lambda: "global param2dtype" in inspect.getsource(gs3.GroupShardedStage3.__init__),
           "GroupShardedStage3 no longer records parameter dtypes in the module global param2dtype")
    expect(lambda: all(part in paddle_source(gs3.GroupShardedStage3._clear_gradients)
                       for part in ("self._offload", "self._unslice_params", "manual_release", "rebuild",
                                    'self._default_device + ":"')),
           "GroupShardedStage3._clear_gradients' offload branch changed (review fill 7)")
    # 8. interleaved pipeline on two stages
    expect(lambda: _params_of(p2p_communication._batched_p2p_ops)
           == ["tensor_send_prev", "tensor_recv_prev", "tensor_send_next", "tensor_recv_next", "hcg"],
           "p2p_communication._batched_p2p_ops(tensor_send_prev, tensor_recv_prev, tensor_send_next, "
           "tensor_recv_next, hcg) signature changed")
    expect(lambda: "_batched_p2p_ops if batch_p2p_comm" in paddle_source(p2p_communication._p2p_helper),
           "p2p_communication._p2p_helper no longer looks up _batched_p2p_ops by its module name")
    helper = p2p_communication.P2pHelper
    for name, needed in (("send_forward_recv_forward", ["output_tensor", "recv_prev", "batch_p2p_comm",
                                                        "overlap_p2p_comm", "skip_check_meta"]),
                         ("send_forward_backward_recv_forward_backward",
                          ["output_tensor", "input_tensor_grad", "recv_prev", "recv_next", "batch_p2p_comm",
                           "skip_check_meta"]),
                         ("send_forward", ["output_tensor", "pp_last_stage", "batch_p2p_comm", "skip_check_meta"]),
                         ("send_backward", ["input_tensor_grad", "pp_first_stage", "batch_p2p_comm"]),
                         ("recv_forward", ["pp_first_stage", "sync_recv", "batch_p2p_comm"]),
                         ("recv_backward", ["pp_last_stage", "sync_recv", "batch_p2p_comm"])):
        expect(lambda: _params_of(getattr(helper, name))[1:] == needed,
               f"P2pHelper.{name}({', '.join(needed)}) changed")
    for cls in (pipeline_parallel.PipelineParallelWithInterleave,
                pipeline_parallel.PipelineParallelWithInterleaveFthenB):
        expect(lambda: "self.num_stages > 2" in paddle_source(cls._check_sanity),
               f"{cls.__name__}._check_sanity no longer requires pp > 2 (review fill 8)")
    # 9. reduce-scatter
    rs_module = importlib.import_module(_REDUCE_SCATTER_MODULE)
    expect(lambda: _params_of(rs_module._reduce_scatter_tensor_in_dygraph)[:6]
           == ["out_tensor", "in_tensor", "op", "group", "sync_op", "use_calc_stream"],
           "stream.reduce_scatter._reduce_scatter_tensor_in_dygraph(out_tensor, in_tensor, op, group, sync_op, "
           "use_calc_stream) signature changed")
    expect(lambda: _params_of(rs_module._reduce_scatter_in_dygraph)[:6]
           == ["tensor", "tensor_list", "op", "group", "sync_op", "use_calc_stream"],
           "stream.reduce_scatter._reduce_scatter_in_dygraph(tensor, tensor_list, op, group, sync_op, "
           "use_calc_stream) signature changed")
    expect(lambda: all(f"{name}(" in paddle_source(rs_module.reduce_scatter) for name in
                       ("_reduce_scatter_tensor_in_dygraph", "_reduce_scatter_in_dygraph")),
           "stream.reduce_scatter no longer ends in _reduce_scatter_(tensor_)in_dygraph (review fill 9)")
    expect(lambda: _params_of(dist.reduce_scatter)[:5] == ["tensor", "tensor_list", "op", "group", "sync_op"],
           "paddle.distributed.reduce_scatter(tensor, tensor_list, op, group, sync_op) signature changed")
    expect(lambda: "dist.stream.reduce_scatter(" in paddle_source(sequence_parallel_utils.reduce_scatter)
           and "process_group.all_gather(" in paddle_source(sequence_parallel_utils.all_gather),
           "sequence_parallel_utils no longer reduce-scatters via dist.stream.reduce_scatter and all-gathers via "
           "ProcessGroup.all_gather (review fill 9)")
    # 10. stage1 V2 alignment
    from paddle.distributed.fleet.utils import tensor_fusion_helper

    expect(lambda: "gpu" in tensor_fusion_helper.alignment
           and '"unknown"' in paddle_source(tensor_fusion_helper.get_current_device_type)
           and "alignment[get_current_device_type()]" in paddle_source(tensor_fusion_helper.build_reduce_scatter_buffer),
           "tensor_fusion_helper no longer pads V2 comm buffers by alignment[get_current_device_type()] with "
           "'unknown' for a CPU place (review fill 10)")
    if problems:
        raise RuntimeError("paddletrainer's CPU backend no longer matches this Paddle version:\n  - "
                           + "\n  - ".join(problems))
