"""``ParallelOptimizer``: one optimizer interface over Paddle's per-axis optimizer wrappers.

Paddle finishes the gradient synchronisation of most layouts *inside* ``optimizer.step()``:

* ``HybridParallelOptimizer.step`` (tp / pp / sharding stage 1 / dp inside a hybrid layout) first reduces
  the sharding gradients to their owners and all-reduces dp gradients, then updates;
* the stage-2 optimizer's step scales the reduced gradients by 1/sharding (and all-reduces over dp);
* stage 3 all-reduces its unsliced parameters' gradients and moves slice gradients into place.

A global gradient norm needs the synchronised gradients *before* the update, so this wrapper splits the
step in two: :meth:`ParallelOptimizer.sync_gradients` runs Paddle's own synchronisation once (the very same
functions ``step`` would call), and :meth:`step` then runs only the update. ``step`` without a preceding
sync does both, so code that never clips still works. Everything else is forwarded to the wrapped optimizer.

:meth:`ParallelOptimizer.counted_gradients` lists, for this rank, the gradients whose squares it contributes
to the global norm, so that a sum over the tp, pp and sharding groups counts every parameter exactly once.
"""
from __future__ import annotations

import paddle
from paddle.distributed.fleet.utils.hybrid_parallel_util import obtain_optimizer_parameters_list

from .pipeline import shared_weights_counted_elsewhere
from .sharding import SplitParamSharding
from ..paddle_contract import stage1_owner_ranks
from .wrappers import unwrap_optimizer

__all__ = ["ParallelOptimizer"]

LOCAL, HYBRID, STAGE2, STAGE3 = "local", "hybrid", "stage2", "stage3"


class ParallelOptimizer:
    """Wraps the optimizer returned by an axis function; see the module docstring.

    Args:
        optimizer: what Paddle returned (a plain optimizer, ``HybridParallelOptimizer``,
            ``GroupShardedOptimizerStage2`` or, for stage 3, the original optimizer with a patched step).
        mode: "local" (one process or plain data parallel), "hybrid", "stage2" or "stage3".
        topology: the :class:`~paddletrainer.parallel.topology.Topology`.
        model: the wrapped model (stage 2/3 keep their synchronisation functions on it).
        dp_buffers: plain data parallel's :class:`~.data_parallel.GradientBuffers` (their reduction is finished
            by :meth:`sync_gradients`, they are zeroed in place by :meth:`clear_grad`).
        expert_grads: under expert parallel, the :class:`~.expert.ExpertGradients` reduced after the dense sync.
        local_experts: the experts are outside the wrapped optimizer's parameters (sharding stage 1 under expert
            parallel, :func:`~.expert.shard_dense_parameters`): :meth:`step` updates them after the sharded step,
            :meth:`clear_grad` clears them and :meth:`counted_gradients` lists them.
    """

    def __init__(self, optimizer, *, mode: str, topology, model=None, dp_buffers=None, expert_grads=None,
                 local_experts: bool = False):
        if mode not in (LOCAL, HYBRID, STAGE2, STAGE3):
            raise ValueError(f"unknown ParallelOptimizer mode {mode!r}")
        self._optimizer = optimizer
        self._mode = mode
        self._topology = topology
        self._model = model
        self._dp_buffers = dp_buffers
        self._expert_grads = expert_grads
        self._expert_ids = {id(p) for p in expert_grads.parameters} if expert_grads is not None else set()
        self._local_experts = local_experts and expert_grads is not None
        self._synced = False
        self._shared_elsewhere = shared_weights_counted_elsewhere(model) if model is not None else set()
        # sharding stage 1 V2 (split_param): gradients live in comm buffers, the step updates flat slices
        self._split_param = SplitParamSharding.of(optimizer) if mode == HYBRID else None

    # -- what the Trainer uses -------------------------------------------------------------------
    @property
    def inner(self):
        """The optimizer object Paddle returned (for checkpoint code that needs its concrete type)."""
        return self._optimizer

    @property
    def mode(self) -> str:
        return self._mode

    @property
    def split_param(self):
        """The :class:`~.sharding.SplitParamSharding` view under sharding stage 1 V2, else None."""
        return self._split_param

    @paddle.no_grad()
    def sync_gradients(self) -> None:
        """Finish this step's gradient synchronisation.

        Idempotent until :meth:`clear_grad`: every mode's synchronisation (reducing to the owners, stage 2's
        1/sharding scale, the dp all-reduce, stage 3's slice moves) must run once per step, so later calls —
        :func:`~.clipping.clip_grad_norm` and :func:`~.collectives.global_grad_norm` call it too, and so
        may code that measures the norm after :meth:`step` — do nothing.
        """
        if self._synced:
            return
        if self._mode == HYBRID:
            if self._split_param is not None:
                # before the sync: its dp all-reduce runs over the slice parameters' gradients
                self._split_param.link_slice_gradients()
            # expert parameters are reduced over their own (edp) group below, never over dp
            self._optimizer._hybrid_sync_grad([p for p in self._hybrid_parameters() if id(p) not in self._expert_ids])
        elif self._mode == STAGE2:
            # Exactly what GroupShardedStage2's redefined step runs before the update.
            self._model._grad_scale()
            self._model._dp_allreduce()
        elif self._mode == STAGE3:
            self._model._update_params_slice()
        elif self._dp_buffers is not None:
            self._dp_buffers.sync()  # waits for the all-reduces the backward hooks launched, launches the rest
        if self._expert_grads is not None:
            self._expert_grads.sync()
        self._synced = True

    @paddle.no_grad()
    def step(self) -> None:
        """Update the parameters; synchronises first unless :meth:`sync_gradients` already did (this step's
        gradients stay marked synchronised until :meth:`clear_grad`)."""
        self.sync_gradients()
        if self._mode == LOCAL:
            self._optimizer.step()
        elif self._mode == HYBRID:
            self._optimizer._step(self._hybrid_parameters())
            if self._local_experts:
                self._expert_grads.apply(unwrap_optimizer(self._optimizer))
        elif self._mode == STAGE2:
            # The class's step (skipping the instance-level wrapper that would scale again).
            type(self._optimizer).step(self._optimizer)
        else:
            # Stage 3's step re-slices unless update_scaler is set (GroupShardedScaler uses the same flag).
            previous = getattr(self._optimizer, "update_scaler", None)
            self._optimizer.update_scaler = True
            try:
                self._optimizer.step()
            finally:
                self._optimizer.update_scaler = previous

    def clear_grad(self, set_to_zero: bool = True) -> None:
        """Clear gradients and end the step: the next :meth:`sync_gradients` synchronises again (the stage 2/3
        wrappers replace the inner ``clear_grad`` with their own buffer-aware version)."""
        self._synced = False
        if self._split_param is not None:
            self._split_param.zero_gradients()  # see SplitParamSharding.zero_gradients: never clear_grad
        elif self._mode in (STAGE2, STAGE3):
            self._optimizer.clear_grad()
        elif self._dp_buffers is not None:
            self._dp_buffers.zero()  # in place: the gradients stay views of the all-reduce buckets
            if self._expert_grads is not None:  # not in the buckets
                self._expert_grads.zero(set_to_zero)
        else:
            self._optimizer.clear_grad(set_to_zero)
            if self._local_experts:  # not in the sharding optimizer's parameter list
                self._expert_grads.zero(set_to_zero)

    def state_dict(self):
        return self._optimizer.state_dict()

    def set_state_dict(self, state_dict):
        return self._optimizer.set_state_dict(state_dict)

    def get_lr(self):
        return self._optimizer.get_lr()

    def set_lr(self, value):
        return self._optimizer.set_lr(value)

    def __getattr__(self, name):
        # Only reached for names not defined here: _learning_rate, _parameter_list, _accumulators, ...
        return getattr(self.__dict__["_optimizer"], name)

    # -- gradients for the global norm -----------------------------------------------------------
    def counted_gradients(self) -> list:
        """``(grad, counted)`` for every gradient this rank holds after :meth:`sync_gradients`.

        ``counted`` says whether this rank adds the gradient's squares to the global norm:

        * sharding: only the owner of a parameter (stage 1/2), every rank for its own slice (stage 3, and
          stage 1 V2, whose slices are flat ranges of the reduce-scattered gradient buffers) and sharding
          rank 0 for stage 3's unsliced (replicated) parameters;
        * tensor parallel: split parameters (``is_distributed``) on every tp rank, replicated ones on tp
          rank 0 only;
        * pipeline: a weight shared between stages (a tied embedding) on the lowest rank of its shared group only
          (:func:`~.pipeline.shared_weights_counted_elsewhere`);
        * sep / cp: on sep (cp) rank 0 only (Paddle's norm group, the "check" group, spans those ranks);
        * expert parallel: the squares are summed over the whole world (experts differ between the ep ranks), so
          a dense gradient counts on dp rank 0 only and an expert gradient on its first edp replica only.

        Every gradient is listed (counted or not) so that clipping can scale all of them.
        """
        return [(grad, counted) for _, grad, counted in self.named_counted_gradients()]

    def named_counted_gradients(self) -> list:
        """``(parameter name, grad, counted)``: :meth:`counted_gradients` with the name of the parameter each
        gradient belongs to (stage 3's slices keep their ``slice@<name>``), for per-group clipping."""
        topo = self._topology
        entries = []
        for param, grad, owned in self._gradients_with_ownership():
            if grad is None:
                continue
            counted = owned
            if not getattr(param, "is_distributed", False) and topo.tp_rank != 0:
                counted = False
            if id(param) in self._shared_elsewhere:  # every stage holding it holds the same summed gradient
                counted = False
            if topo.sep_rank != 0 or topo.cp_rank != 0:  # after the sync every sep/cp rank holds the same sum
                counted = False
            if topo.layout.ep > 1:  # the norm is summed over the world: count one replica of each tensor
                replica = topo.layout.ep_coordinates(topo.coords)[1] if id(param) in self._expert_ids else topo.dp_rank
                counted = counted and replica == 0
            entries.append((param.name, grad, counted))
        return entries

    def _gradients_with_ownership(self):
        topo = self._topology
        if self._mode == LOCAL:
            return [(p, p.grad, True) for p in self._local_parameters()]
        if self._mode == HYBRID and self._split_param is not None:
            return [(p, g, True) for p, g in self._split_param.slice_gradients()]
        if self._mode == HYBRID:
            params = self._hybrid_parameters()
            owner = stage1_owner_ranks(self._optimizer._inner_opt) if topo.sharding_degree > 1 else None
            local = self._expert_grads.parameters if self._local_experts else []  # this rank's own experts
            return [(p, p.grad, owner is None or owner[p.name] == topo.sharding_rank) for p in params] + \
                [(p, p.grad, True) for p in local]
        if self._mode == STAGE2:
            owner = self._optimizer._param2rank
            return [(p, p.grad, owner[p.name] == topo.sharding_rank) for p in self._optimizer._local_params]
        # stage 3: after sync the inner optimizer's parameters are [slices..., unsliced params...] (with
        # parameter groups, only the groups hold the slices: Paddle leaves _parameter_list as built)
        unsliced = {id(p) for p in self._model._unslice_params}
        return [(p, p.grad, id(p) not in unsliced or topo.sharding_rank == 0)
                for p in _flat(self._optimizer._param_groups)]

    def _local_parameters(self):
        return _flat(self._optimizer._parameter_list)

    def _hybrid_parameters(self):
        return list(obtain_optimizer_parameters_list(self._optimizer._inner_opt))


def _flat(params) -> list:
    """A parameter list, or the parameters of a list of parameter groups, in order."""
    if params and isinstance(params[0], dict):
        return [p for group in params for p in group["params"]]
    return list(params)
