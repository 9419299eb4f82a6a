"""``ParallelOptimizer``: one optimizer interface over Paddle's per-axis optimizer wrappers; one implementation per
mode, each in its axis module (``data_parallel.LocalOptimizer``: one process or plain data parallel;
``hybrid.HybridOptimizer``: fleet's hybrid optimizer for tp, pp, sharding stage 1 and dp inside a hybrid layout;
``sharding.Stage2Optimizer`` and ``sharding.Stage3Optimizer``). ``parallel.apply.parallelize`` picks one.

Paddle finishes the gradient synchronisation of most layouts *inside* ``optimizer.step()``:

* ``HybridParallelOptimizer.step`` (tp / pp / sharding stage 1 / dp inside a hybrid layout) first reduces
  the sharding gradients to their owners and all-reduces dp gradients, then updates;
* the stage-2 optimizer's step scales the reduced gradients by 1/sharding (and all-reduces over dp);
* stage 3 all-reduces its unsliced parameters' gradients and moves slice gradients into place.

A global gradient norm needs the synchronised gradients *before* the update, so every mode splits the step in two:
``sync_gradients`` runs Paddle's own synchronisation once (the very same functions ``step`` would call), and
``step`` then runs only the update. ``step`` without a preceding sync does both, so code that never clips still
works. Everything else is forwarded to the wrapped optimizer.

Each mode's class defines the four operations of a step itself — ``sync_gradients``, ``named_counted_gradients``,
``step``, ``clear_grad`` — so a mode reads whole in its own module; what every mode shares is here: the end of a
sync (:meth:`ParallelOptimizer._finish_sync`: the expert gradients, then the step marked synchronised) and the
rules that decide which rank counts a gradient in the global norm (:meth:`ParallelOptimizer._counted`).
"""
from __future__ import annotations

import paddle

__all__ = ["ParallelOptimizer"]


class ParallelOptimizer:
    """The interface the Trainer, clipping and the checkpoint use; see the module docstring.

    Args:
        optimizer: what Paddle returned for this mode (a plain optimizer, ``HybridParallelOptimizer``,
            ``GroupShardedOptimizerStage2`` or, for stage 3, the original optimizer with a patched step).
        topology: the :class:`~paddletrainer.parallel.topology.Topology`.
        model: the wrapped model (stage 2/3 keep their synchronisation functions on it).
        expert_grads: under expert parallel, the :class:`~.expert.ExpertGradients` reduced after the dense sync.
    """

    MODE = ""  # each implementation's name for logs and tests

    def __init__(self, optimizer, *, topology, model=None, expert_grads=None):
        self._optimizer = optimizer
        self._topology = topology
        self._model = model
        self._expert_grads = expert_grads
        self._expert_ids = {id(p) for p in expert_grads.parameters} if expert_grads is not None else set()
        self._synced = False  # this step's gradients are synchronised (until clear_grad)
        self._shared_elsewhere = set()  # ids of weights another stage counts in the norm (pipeline parallel)

    # -- what the Trainer uses -------------------------------------------------------------------
    @property
    def inner(self):
        """The optimizer object Paddle returned (for checkpoint code that needs its concrete type)."""
        return self._optimizer

    @property
    def mode(self) -> str:
        return self.MODE

    @property
    def split_param(self):
        """The :class:`~.sharding.SplitParamSharding` view under sharding stage 1 V2, else None."""
        return None

    def sync_gradients(self) -> None:
        """Finish this step's gradient synchronisation.

        Idempotent until :meth:`clear_grad`: every mode's synchronisation (reducing to the owners, stage 2's
        1/sharding scale, the dp all-reduce, stage 3's slice moves) must run once per step, so later calls —
        :func:`~.clipping.clip_grad_norm` and :func:`~.collectives.global_grad_norm` call it too, and so
        may code that measures the norm after :meth:`step` — do nothing. A mode returns at once when
        ``self._synced`` is set and ends with :meth:`_finish_sync`.
        """
        raise NotImplementedError(f"{type(self).__name__} does not define its gradient synchronisation")

    def step(self) -> None:
        """Update the parameters; synchronises first unless :meth:`sync_gradients` already did (this step's
        gradients stay marked synchronised until :meth:`clear_grad`)."""
        raise NotImplementedError(f"{type(self).__name__} does not define its update")

    def clear_grad(self, set_to_zero: bool = True) -> None:
        """Clear gradients and end the step: a mode unsets ``self._synced``, so the next :meth:`sync_gradients`
        synchronises again."""
        raise NotImplementedError(f"{type(self).__name__} does not define how it clears gradients")

    def named_counted_gradients(self) -> list:
        """``(parameter name, grad, counted)`` for every gradient this rank holds after :meth:`sync_gradients`
        (stage 3's slices keep their ``slice@<name>``): :meth:`counted_gradients` with names, for per-group
        clipping. A mode lists ``(parameter, grad, owned)`` and passes it through :meth:`_counted`."""
        raise NotImplementedError(f"{type(self).__name__} does not list its gradients")

    def _finish_sync(self) -> None:
        """The end of every mode's sync: the expert gradients are reduced over their own group after the dense
        ones, then this step's gradients are marked synchronised."""
        if self._expert_grads is not None:
            with paddle.no_grad():
                self._expert_grads.sync()
        self._synced = True

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

    def _counted(self, with_ownership) -> list:
        """``(parameter name, grad, counted)`` from a mode's ``(parameter, grad, owned)``: ``owned`` (whether the
        mode's own sharding gives this rank the gradient's squares) narrowed by the rules every mode shares, listed
        in :meth:`counted_gradients`; entries without a gradient are dropped."""
        topo = self._topology
        entries = []
        for param, grad, owned in with_ownership:
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


def flat_parameters(params) -> list:
    """A parameter list, or the parameters of a list of parameter groups, in order."""
    if params and isinstance(params[0], dict):
        return [p for group in params for p in group["params"]]
    return list(params)
