"""Expert parallel: the groups an MoE layer takes, and the Trainer's handling of expert parameters.

Expert parallel is carved from the data ranks (dp × sharding, see ``Layout.ep``): ``ep`` consecutive data ranks
of one cell of the other axes split the experts (the "ep" group; global expert ``g`` lives on ep rank
``g // (num_experts // ep)``), and the ranks holding the same experts form the expert-data-parallel ("edp")
group. The groups are built with the others by ``topology.init_topology``; the lookups here read them.

Expert parameters carry ``is_expert = True`` (and ``no_sync = True``), named by their global expert index. The
gradient rule (equal to one process with the same global batch): dense gradients are the mean over the data
ranks (the existing dp sync, which skips expert parameters); an expert gradient on its owner already sums every
ep rank's tokens (the all-to-all's backward), so it is summed over the edp group and scaled by 1/(data ranks)
(:class:`ExpertGradients`).
"""
from __future__ import annotations

import contextlib
import re

import paddle
import paddle.distributed as dist

from .layout import NUM_EXPERTS_FIELDS, launch_world_size
from .topology import get_topology

__all__ = ["expert_parallel_group", "expert_data_parallel_group", "token_group", "is_expert", "expert_parameters",
           "check_expert_model", "broadcast_initial_state", "keep_experts", "shard_dense_parameters", "ExpertGradients",
           "NUM_EXPERTS_FIELDS"]

# an expert parameter's structured name: "<layer prefix>experts.<global index>.<rest>"
_EXPERT_NAME = re.compile(r"^(.*?)experts\.(\d+)\.")


def _group(name: str):
    topology = get_topology()
    if topology is None:
        if launch_world_size() > 1:  # a model built now would hold every expert and read one rank's tokens
            raise RuntimeError("paddletrainer.parallel.expert: the process groups do not exist yet; call "
                               "paddletrainer.parallel.init_topology(training_args.parallel_config) before building "
                               "the MoE model (the Trainer reuses the same topology)")
        return None
    if topology.world_size == 1:
        return None
    return topology.group(name)


def expert_parallel_group():
    """The group of ranks that split the experts between them (None: every expert is local)."""
    return _group("ep")


def expert_data_parallel_group():
    """The group of ranks holding the same experts (None: one replica of each expert)."""
    return _group("edp")


def token_group():
    """The group over which the global batch's tokens are split: all data ranks (None: one process)."""
    return _group("data")


def is_expert(param) -> bool:
    """Whether ``param`` is an expert parameter (the MoE contract's ``is_expert`` attribute)."""
    return bool(getattr(param, "is_expert", False))


def expert_parameters(model) -> list:
    """The trainable expert parameters of ``model``, in ``model.parameters()`` order."""
    return [p for p in model.parameters() if is_expert(p) and not p.stop_gradient]


def _num_experts(model):
    config = getattr(model, "config", None)
    for name in NUM_EXPERTS_FIELDS:
        value = getattr(config, name, None) if config is not None else None
        if isinstance(value, int) and value > 0:
            return name, value
    return None, None


def check_expert_model(model, ep: int, sequence_parallel: bool = False, *, staged: bool = False) -> None:
    """Raise ``ValueError`` unless ``model`` can run under ``expert_parallel_degree=ep``: with ep > 1 it has
    expert parameters (else the degree would split nothing while every rank skipped the dp sync of nothing),
    and its config's number of experts, when it names one, is a multiple of ep. Needs no process group.
    ``sequence_parallel`` (tp's, active): a model with experts is refused at any ep — the MoE input would be
    one tp rank's slice of the sequence, and the router and expert gradients partial sums no sync completes.
    ``staged``: ``model`` is one pipeline stage, which may hold no MoE layer (the layers are cut between stages)."""
    if sequence_parallel and any(is_expert(p) for p in model.parameters()):
        raise ValueError(f"sequence_parallel=True with a mixture-of-experts model ({type(model).__name__} has "
                         "expert parameters): not supported yet; use sequence_parallel=False")
    if ep == 1:
        return
    if not staged and not any(is_expert(p) for p in model.parameters()):
        raise ValueError(f"expert_parallel_degree={ep} but {type(model).__name__} has no expert parameter "
                         "(is_expert): build an MoE model with the expert group, or drop the degree")
    field, count = _num_experts(model)
    if count is not None and count % ep:
        raise ValueError(f"expert_parallel_degree={ep} does not divide the model's {field}={count}: each ep rank "
                         f"holds num_experts / ep experts; use a divisor of {count}")
    if count is not None:
        held = {}
        for name, p in model.named_parameters():
            match = _EXPERT_NAME.match(name)
            if match and is_expert(p):
                held.setdefault(match.group(1), set()).add(match.group(2))
        layer, experts = max(held.items(), key=lambda item: len(item[1]), default=(None, ()))
        if len(experts) > count // ep:
            raise ValueError(f"expert_parallel_degree={ep} but {layer}experts holds {len(experts)} of the {count} "
                             f"experts on this rank (expected {count // ep}): build the model with "
                             "expert_parallel_group() after init_topology(args.parallel_config)")


@paddle.no_grad()
def broadcast_initial_state(model, topology) -> None:
    """Plain data parallel's start: every parameter and buffer broadcast from global rank 0, except, under expert
    parallel, the expert parameters, broadcast from the first rank of each edp group (the ep ranks hold different
    experts). Unlike ``sync_params_buffers`` it does not skip ``no_sync`` parameters (every expert is one)."""
    edp = topology.group("edp") if topology.layout.ep > 1 else None
    for name, tensor in list(model.named_parameters()) + list(model.named_buffers()):
        if topology.layout.ep == 1 or not is_expert(tensor):
            dist.broadcast(tensor, src=0)
        elif edp is not None:
            dist.broadcast(tensor, src=edp.ranks[0], group=edp)


@contextlib.contextmanager
def keep_experts(model, topology):
    """Around a fleet wrapper that broadcasts the whole model over the dp group at construction (``TensorParallel``):
    the expert parameters (different on each ep rank) are put back afterwards, then broadcast over their edp group
    only. Nothing is done without expert parallel."""
    params = expert_parameters(model) if topology.layout.ep > 1 else []
    saved = [p.clone() for p in params]
    yield
    edp = topology.group("edp")
    with paddle.no_grad():
        for p, value in zip(params, saved):
            p.set_value(value)
            if edp is not None:
                dist.broadcast(p, src=edp.ranks[0], group=edp)


@contextlib.contextmanager
def shard_dense_parameters(optimizer, experts):
    """Around the construction of sharding stage 1's optimizer (``DygraphShardingOptimizer``): it partitions,
    reduces and broadcasts parameters by name and position, and the ep ranks hold different experts under the
    same Paddle names, so it is given the dense parameters only. Afterwards the experts are appended to the
    Paddle optimizer's own parameter list (its state and checkpoint entries are this rank's), and
    ``ParallelOptimizer`` updates them locally after the sharded step. Nothing is done without experts."""
    ids = {id(p) for p in experts}
    if not ids:
        yield
        return
    if optimizer._parameter_list and isinstance(optimizer._parameter_list[0], dict):
        raise ValueError("expert parallel with sharding stage 1 needs an optimizer over a parameter list, not "
                         "parameter groups (Paddle's stage-1 optimizer refuses groups)")
    optimizer._parameter_list = [p for p in optimizer._parameter_list if id(p) not in ids]
    yield
    optimizer._parameter_list = list(optimizer._parameter_list) + list(experts)


class ExpertGradients:
    """The expert half of the gradient sync: sum over the edp group, scale by 1/(data ranks)."""

    def __init__(self, params, *, group, data_world_size: int):
        self._params = list(params)
        self._group = group
        self._scale = 1.0 / data_world_size

    @property
    def parameters(self) -> list:
        return list(self._params)

    @paddle.no_grad()
    def sync(self) -> None:
        """Reduce every expert gradient (a parameter no token reached gets a zero gradient: every replica must
        join the same all-reduces)."""
        for p in self._params:
            if p.grad is None:
                p._copy_gradient_from(paddle.zeros_like(p))
            if self._group is not None:
                dist.all_reduce(p.grad, group=self._group)
            p.grad.scale_(self._scale)

    def zero(self, set_to_zero: bool = True) -> None:
        for p in self._params:
            p.clear_gradient(set_to_zero)

    def apply(self, optimizer) -> None:
        """Update the experts with ``optimizer`` (the Paddle optimizer that owns their state) on this rank
        alone: under sharding stage 1 its sharded step leaves them out (:func:`shard_dense_parameters`)."""
        params_grads = [(p, p.grad) for p in self._params if not p.stop_gradient and p.grad is not None]
        if params_grads:
            optimizer._apply_optimize(loss=None, startup_program=None, params_grads=params_grads)
