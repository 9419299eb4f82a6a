"""Load-balance statistics of one MoE layer's forward, over the whole global batch.

A forward all-reduces one float64 vector over the token group (every data rank): the tokens routed to each
expert, the router probability summed over tokens per expert, the router z-loss summed over tokens, and the
number of tokens. Everything reported here is a function of those sums, so it is the same on every rank and in
every layout that sees the same global batch (dropless routing). The vector stays on the device; nothing is
read to the host until a metric is asked for.
"""
from __future__ import annotations

from dataclasses import dataclass

import paddle
import paddle.distributed as dist

__all__ = ["MoEStats", "global_sums", "summary_metrics", "moe_metrics"]


@paddle.no_grad()
def global_sums(counts, prob_sums, z_sum, num_tokens: int, token_group):
    """``[counts (E), prob sums (E), z sum, tokens]`` as float64, summed over ``token_group`` (None: this process)."""
    vector = paddle.concat([counts.astype("float64"), prob_sums.detach().astype("float64"),
                            z_sum.detach().astype("float64").reshape([1]),
                            paddle.full([1], float(num_tokens), dtype="float64")])
    if token_group is not None and token_group.nranks > 1:
        dist.all_reduce(vector, group=token_group)
    return vector


@dataclass
class MoEStats:
    """One layer's statistics over the global batch (read lazily from the all-reduced sums)."""

    sums: paddle.Tensor
    num_experts: int
    top_k: int

    def _host(self):
        return self.sums.numpy()

    @property
    def tokens_per_expert(self) -> list:
        """Routed (token, slot) pairs per global expert: their sum is tokens × top_k."""
        return [int(round(c)) for c in self._host()[: self.num_experts]]

    @property
    def imbalance(self) -> float:
        """max / mean of the tokens per expert (1.0 = perfectly balanced)."""
        counts = self._host()[: self.num_experts]
        mean = counts.mean()
        return float(counts.max() / mean) if mean > 0 else 0.0

    @property
    def aux_loss(self) -> float:
        """``num_experts · Σ_e f_e · P_e`` (Switch/GShard), ``f_e`` = share of routed slots, ``P_e`` = mean
        router probability, both over the global batch (1.0 when balanced)."""
        host = self._host()
        e, tokens = self.num_experts, host[-1]
        if tokens == 0:
            return 0.0
        f = host[:e] / (tokens * self.top_k)
        p = host[e: 2 * e] / tokens
        return float(e * (f * p).sum())

    @property
    def z_loss(self) -> float:
        """Mean over the global batch of ``logsumexp(router logits)²``."""
        host = self._host()
        return float(host[2 * self.num_experts] / host[-1]) if host[-1] else 0.0


def summary_metrics(named_stats: dict) -> dict:
    """``{layer name: MoEStats}`` → flat float metrics: per layer ``moe/<name>/imbalance`` and ``.../aux_loss``,
    plus ``moe/max_imbalance`` and ``moe/aux_loss`` (the mean over layers)."""
    metrics = {}
    if not named_stats:
        return metrics
    for name, stats in named_stats.items():
        metrics[f"moe/{name}/imbalance"] = round(stats.imbalance, 4)
        metrics[f"moe/{name}/aux_loss"] = round(stats.aux_loss, 6)
    imbalances = [s.imbalance for s in named_stats.values()]
    metrics["moe/max_imbalance"] = round(max(imbalances), 4)
    metrics["moe/aux_loss"] = round(sum(s.aux_loss for s in named_stats.values()) / len(named_stats), 6)
    return metrics


def moe_metrics(layers: dict) -> dict:
    """``{name: MoELayer}`` → :func:`summary_metrics` of each layer's training forwards since the last call
    (``MoELayer.take_window_stats``; layers without a training forward since are left out). What a model's
    ``extra_metrics()`` returns for the Trainer to log with the loss."""
    windows = {name: layer.take_window_stats() for name, layer in layers.items()}
    return summary_metrics({name: stats for name, stats in windows.items() if stats is not None})
