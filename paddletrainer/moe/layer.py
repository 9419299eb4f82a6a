"""``MoELayer``: a dropless top-k mixture-of-experts MLP, exact under expert parallel.

Router: ``softmax(x · W_gate)`` in float32 → the ``top_k`` experts per token (optionally renormalised to sum to
one). Dispatch: the token's (token, slot) pairs sorted by expert; under expert parallel the sorted rows travel to
the experts' ranks (:mod:`.dispatch`), each local expert (a SwiGLU MLP) runs once on its contiguous block, the
results travel back and are combined with the routing weights. No token is ever dropped, so the output does
not depend on how the batch is split over ranks.

Auxiliary losses (returned by ``forward`` beside the output, already multiplied by their coefficients):

* load balance, Switch/GShard style: ``num_experts · Σ_e f_e · P_e`` with ``f_e`` the share of routed slots and
  ``P_e`` the mean router probability of expert ``e``, both over the whole global batch;
* router z-loss: mean over the global batch of ``logsumexp(logits)²``.

Gradient rule (the contract with the Trainer): each rank's loss is a mean over its own tokens, dense gradients
are averaged over the D data ranks (``token_group``), an expert parameter's gradient (already summed over the ep
ranks' tokens by the all-to-all backward) is summed over the ranks holding the same experts and scaled by 1/D.
The returned auxiliary term is this rank's share written for that rule: the global ``f_e`` (an all-reduced
count, no gradient) times this rank's probability sum scaled by ``D / N_global``. Its mean over the data ranks
is the global loss, and its gradient averaged over them equals one process's.

Parameters: ``gate.weight`` (dense), ``experts.<global index>.{gate,up,down}_proj.weight`` for the local experts
only, each with ``is_expert = no_sync = True`` (expert ``g`` lives on ep rank ``g // (num_experts // ep)``), and
``shared_expert.*`` (dense) when ``shared_expert_intermediate_size`` > 0. Expert weights are drawn from a NumPy
generator seeded by one draw of Paddle's RNG and the global index, so every layout builds the same experts and
the dense parameters created after them see the same Paddle RNG stream.
"""
from __future__ import annotations

import numpy as np
import paddle
import paddle.nn as nn
import paddle.nn.functional as F

from .dispatch import ExchangeRows, exchange_counts, local_expert_order
from .stats import MoEStats, global_sums

__all__ = ["MoELayer", "SwiGLU"]


class SwiGLU(nn.Layer):
    """``down(silu(gate(x)) · up(x))``, no biases (the Llama MLP)."""

    def __init__(self, hidden_size: int, intermediate_size: int, weight_attr=None):
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, weight_attr=weight_attr, bias_attr=False)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, weight_attr=weight_attr, bias_attr=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, weight_attr=weight_attr, bias_attr=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


def _check(condition: bool, message: str):
    if not condition:
        raise ValueError(f"MoELayer: {message}")


class MoELayer(nn.Layer):
    """Dropless top-k MoE MLP; ``forward(x) -> (output shaped like x, auxiliary loss term)`` (see module).

    Args:
        hidden_size: the model width (the experts' input and output size).
        moe_intermediate_size: each expert's SwiGLU inner size.
        num_experts: experts in the layer (over all ep ranks).
        top_k: experts per token.
        norm_topk_prob: renormalise the top-k probabilities to sum to one (Mixtral) or keep them (Qwen2-MoE).
        aux_loss_coef: coefficient of the load-balance loss (0 = off).
        z_loss_coef: coefficient of the router z-loss (0 = off).
        shared_expert_intermediate_size: > 0 adds a dense SwiGLU every token goes through.
        expert_group: the Paddle group of the expert-parallel ranks (None: every expert on this process).
        token_group: the group over which the global batch's tokens are split (every data rank) for the
            statistics and the auxiliary losses (None: this process holds the whole batch).
        init_std: standard deviation of the experts' normal initialisation.
    """

    def __init__(self, hidden_size: int, moe_intermediate_size: int, num_experts: int, top_k: int = 2, *,
                 norm_topk_prob: bool = True, aux_loss_coef: float = 0.01, z_loss_coef: float = 0.0,
                 shared_expert_intermediate_size: int = 0, expert_group=None, token_group=None,
                 init_std: float = 0.02):
        super().__init__()
        _check(num_experts >= 1, f"num_experts must be >= 1, got {num_experts}")
        _check(1 <= top_k <= num_experts, f"top_k must be in [1, num_experts={num_experts}], got {top_k}")
        ep = expert_group.nranks if expert_group is not None else 1
        _check(num_experts % ep == 0, f"num_experts ({num_experts}) must be divisible by the expert-parallel "
                                      f"degree ({ep}) so every ep rank holds the same number of experts")
        _check(ep == 1 or token_group is not None, "expert_group spans several ranks but token_group is None: pass "
                                                  "token_group() too (the load-balance loss covers every data rank)")
        self.hidden_size, self.num_experts, self.top_k = hidden_size, num_experts, top_k
        self.moe_intermediate_size = moe_intermediate_size
        self.shared_expert_intermediate_size = shared_expert_intermediate_size
        self.norm_topk_prob, self.aux_loss_coef, self.z_loss_coef = norm_topk_prob, aux_loss_coef, z_loss_coef
        self.expert_group, self.token_group = (expert_group if ep > 1 else None), token_group
        self.experts_per_rank = num_experts // ep
        ep_rank = expert_group.rank if ep > 1 else 0
        self.local_experts = list(range(ep_rank * self.experts_per_rank, (ep_rank + 1) * self.experts_per_rank))
        self.gate = nn.Linear(hidden_size, num_experts, bias_attr=False)
        seed = int(paddle.randint(0, 2**31 - 1, [1]).item())  # one draw whatever the layout
        no_rng = paddle.ParamAttr(initializer=nn.initializer.Constant(0.0))
        self.experts = nn.LayerDict({str(g): SwiGLU(hidden_size, moe_intermediate_size, no_rng)
                                     for g in self.local_experts})
        for g in self.local_experts:
            rng = np.random.default_rng([seed, g])
            for param in self.experts[str(g)].parameters():
                param.set_value(paddle.to_tensor(rng.normal(0.0, init_std, param.shape), dtype=param.dtype))
                param.is_expert = True
                param.no_sync = True
        self.shared_expert = (SwiGLU(hidden_size, shared_expert_intermediate_size)
                              if shared_expert_intermediate_size > 0 else None)
        self.last_stats = None
        self._idle = None
        self._window = None

    def active_matmul_weights(self) -> int:
        """Weights one token multiplies through (for FLOPs and MFU): the router, its ``top_k`` experts' SwiGLU
        (gate, up, down) and the shared expert — not the other experts, which a dense count would include."""
        h, inter = self.hidden_size, self.moe_intermediate_size
        shared = 3 * h * self.shared_expert_intermediate_size if self.shared_expert is not None else 0
        return h * self.num_experts + self.top_k * 3 * h * inter + shared

    def take_window_stats(self):
        """The statistics of every training forward since the last call (pooled sums over the global batches:
        tokens per expert added up, the aux loss of the pooled fractions), or None; starts a new window."""
        window, self._window = self._window, None
        return None if window is None else MoEStats(window, self.num_experts, self.top_k)

    # ------------------------------------------------------------------ routing
    def _route(self, x):
        dtype = "float64" if x.dtype == paddle.float64 else "float32"  # never below float32
        logits = F.linear(x.astype(dtype), self.gate.weight.astype(dtype))
        probs = F.softmax(logits, axis=-1)
        weights, experts = paddle.topk(probs, self.top_k, axis=-1)
        if self.norm_topk_prob:
            weights = weights / weights.sum(axis=-1, keepdim=True)
        return logits, probs, weights, experts

    def _aux_losses(self, logits, probs, counts):
        """This rank's auxiliary term (see module) and the layer's global statistics."""
        n = int(probs.shape[0])
        z_per_token = paddle.logsumexp(logits, axis=-1) ** 2
        prob_sums, z_sum = probs.sum(axis=0), z_per_token.sum()
        sums = global_sums(paddle.to_tensor(counts, dtype="int64"), prob_sums, z_sum, n, self.token_group)
        self.last_stats = MoEStats(sums, self.num_experts, self.top_k)
        if self.training:  # the window the next logged metrics cover (sums add up; read at logging steps)
            self._window = sums if self._window is None else self._window + sums
        ranks = self.token_group.nranks if self.token_group is not None else 1
        tokens = sums[-1:].astype(probs.dtype)
        share = sums[: self.num_experts].astype(probs.dtype) / (tokens * self.top_k)
        term = paddle.zeros([1], dtype=probs.dtype)
        if self.aux_loss_coef:
            term = term + self.aux_loss_coef * self.num_experts * ranks * (share * prob_sums).sum() / tokens
        if self.z_loss_coef:
            term = term + self.z_loss_coef * ranks * z_sum / tokens
        return term.reshape([])

    # ------------------------------------------------------------------ experts
    def _run_local_experts(self, rows, per_expert: list):
        """Each local expert on its block of ``rows``. An expert with no rows does not run (Paddle's matmul
        backward fails on zero rows); it is run on one zero row instead and its output times zero is kept in
        ``self._idle`` so its parameters get a zero gradient (not None) like on the ranks where it had tokens."""
        blocks = paddle.split(rows, per_expert, axis=0) if len(per_expert) > 1 else [rows]  # rows: [n, hidden]
        outs, idle = [], []
        for g, block, count in zip(self.local_experts, blocks, per_expert):
            if count:
                outs.append(self.experts[str(g)](block))
            else:
                # zero rows still connected to the graph: the exchange back must run its backward on this
                # rank too (a collective), which Paddle skips for an input that needs no gradient
                outs.append(block * 0)
                idle.append((self.experts[str(g)](paddle.zeros([1, self.hidden_size], dtype=rows.dtype)) * 0).sum())
        self._idle = paddle.add_n(idle) if idle else None
        return paddle.concat(outs, axis=0) if len(outs) > 1 else outs[0]

    def _experts_forward(self, rows, counts: np.ndarray):
        """``rows`` sorted by global expert, ``counts[g]`` of them for expert ``g`` → the experts' outputs, same
        order; under expert parallel through the ep ranks that own the experts."""
        if self.expert_group is None:
            return self._run_local_experts(rows, counts.tolist())
        group, ranks = self.expert_group, self.expert_group.nranks
        received = exchange_counts(paddle.to_tensor(counts, dtype="int64"), group)
        send = counts.reshape(ranks, self.experts_per_rank).sum(axis=1).tolist()
        arrive = received.sum(axis=1).tolist()
        perm, inverse, per_expert = local_expert_order(received)
        mine = ExchangeRows.apply(rows, send, arrive, group)
        mine = paddle.gather(mine, paddle.to_tensor(perm), axis=0)
        out = self._run_local_experts(mine, per_expert)
        out = paddle.gather(out, paddle.to_tensor(inverse), axis=0)
        return ExchangeRows.apply(out, arrive, send, group)

    def forward(self, hidden_states):
        """``hidden_states [..., hidden]`` → ``(output [..., hidden], auxiliary loss term (scalar))``."""
        shape = hidden_states.shape
        x = hidden_states.reshape([-1, self.hidden_size])
        logits, probs, weights, experts = self._route(x)
        flat = experts.reshape([-1])
        host = flat.numpy()
        counts = np.bincount(host, minlength=self.num_experts).astype("int64")
        aux = self._aux_losses(logits, probs, counts)
        order = np.argsort(host, kind="stable").astype("int64")
        undo = np.empty_like(order)
        undo[order] = np.arange(order.shape[0], dtype="int64")
        rows = paddle.gather(x, paddle.to_tensor(order // self.top_k), axis=0)
        out = self._experts_forward(rows, counts)
        out = paddle.gather(out, paddle.to_tensor(undo), axis=0).reshape([-1, self.top_k, self.hidden_size])
        out = (out * weights.astype(out.dtype).unsqueeze(-1)).sum(axis=1)
        if self.shared_expert is not None:
            out = out + self.shared_expert(x)
        if self._idle is not None:  # adds exactly 0.0; carries the idle experts' zero gradients
            out = out + self._idle.astype(out.dtype)
        return out.reshape(shape), aux
