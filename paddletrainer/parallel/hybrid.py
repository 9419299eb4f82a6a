"""The optimizer mode of fleet's hybrid layouts: tensor parallel, pipeline parallel, sharding stage 1 (V1 and
V2, ``split_param``) and dp inside a hybrid layout, all synchronised by ``HybridParallelOptimizer``.

``HybridParallelOptimizer.step`` reduces the sharding gradients to their owners and all-reduces the dp gradients
before it updates; :class:`HybridOptimizer` runs that synchronisation (``_hybrid_sync_grad``) on its own, so the
global norm sees the synchronised gradients, then the update alone (``_step``).
"""
from __future__ import annotations

import paddle
from paddle.distributed.fleet.utils.hybrid_parallel_util import obtain_optimizer_parameters_list

from ..paddle_contract import stage1_owner_ranks
from .optimizer import ParallelOptimizer
from .pipeline import shared_weights_counted_elsewhere
from .sharding import SplitParamSharding
from .wrappers import unwrap_optimizer

__all__ = ["HybridOptimizer"]


class HybridOptimizer(ParallelOptimizer):
    """:class:`~.optimizer.ParallelOptimizer` over fleet's ``HybridParallelOptimizer``.

    ``local_experts``: the experts are outside the wrapped optimizer's parameters (sharding stage 1 under expert
    parallel, :func:`~.expert.shard_dense_parameters`): the step updates them after the sharded step, the clear
    clears them and the counted gradients list them.
    """

    MODE = "hybrid"

    def __init__(self, optimizer, *, topology, model=None, expert_grads=None, local_experts: bool = False):
        super().__init__(optimizer, topology=topology, model=model, expert_grads=expert_grads)
        self._local_experts = local_experts and expert_grads is not None
        self._shared_elsewhere = shared_weights_counted_elsewhere(model) if model is not None else set()
        # sharding stage 1 V2 (split_param): gradients live in comm buffers, the step updates flat slices
        self._split_param = SplitParamSharding.of(optimizer)

    @property
    def split_param(self):
        return self._split_param

    def sync_gradients(self) -> None:
        if self._synced:
            return
        with paddle.no_grad():
            if self._split_param is not None:
                # before the sync: its dp all-reduce runs over the slice parameters' gradients
                self._split_param.link_slice_gradients()
            # expert parameters are reduced over their own (edp) group afterwards, never over dp
            self._optimizer._hybrid_sync_grad([p for p in self._parameters() if id(p) not in self._expert_ids])
        self._finish_sync()

    def step(self) -> None:
        self.sync_gradients()
        with paddle.no_grad():
            self._optimizer._step(self._parameters())
            if self._local_experts:
                self._expert_grads.apply(unwrap_optimizer(self._optimizer))

    def clear_grad(self, set_to_zero: bool = True) -> None:
        self._synced = False
        if self._split_param is not None:
            self._split_param.zero_gradients()  # see SplitParamSharding.zero_gradients: never clear_grad
            return
        self._optimizer.clear_grad(set_to_zero)
        if self._local_experts:  # not in the sharding optimizer's parameter list
            self._expert_grads.zero(set_to_zero)

    def named_counted_gradients(self) -> list:
        topo = self._topology
        if self._split_param is not None:
            return self._counted([(p, g, True) for p, g in self._split_param.slice_gradients()])
        owner = stage1_owner_ranks(self._optimizer._inner_opt) if topo.sharding_degree > 1 else None
        local = self._expert_grads.parameters if self._local_experts else []  # this rank's own experts
        return self._counted([(p, p.grad, owner is None or owner[p.name] == topo.sharding_rank)
                              for p in self._parameters()] + [(p, p.grad, True) for p in local])

    def _parameters(self) -> list:
        return list(obtain_optimizer_parameters_list(self._optimizer._inner_opt))
