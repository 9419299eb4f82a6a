"""Per-rank memory and per-step communication of a Llama-style model under a dp × sharding × tp × pp × vpp ×
sep/cp layout: the formulas (arithmetic spelled out beside each), for any config.

``scripts/cost_model.py`` prints them for one layout and measures them on CPU launches (``--measure``);
``planning.planner`` prices every layout with them. Pure arithmetic (no paddle), importable anywhere.
"""
from __future__ import annotations

import dataclasses
import math

__all__ = ["Config", "Layout", "communication", "fmt_bytes", "long_context_communication", "memory", "moe_all_to_all",
           "param_counts", "pipeline_bubble"]


def fmt_bytes(n: float) -> str:
    """``n`` bytes in the largest binary unit it reaches, two decimals (``1.50 GiB``)."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{int(n)} B"


@dataclasses.dataclass
class Config:
    hidden: int
    layers: int
    heads: int
    vocab: int
    seq: int
    intermediate: int
    kv_heads: int = 0  # 0 = heads (no GQA)
    tie: bool = False


@dataclasses.dataclass
class Layout:
    dp: int = 1
    sharding: int = 1
    stage: int = 0
    tp: int = 1
    pp: int = 1
    vpp: int = 1  # virtual_pp_degree: model chunks per pipeline stage (interleaved schedule)
    micro_batch: int = 1
    global_batch: int = 1
    tp_output_gathered: bool = True  # tensor_parallel_output=False: logits all-gathered (what the Trainer demos use)
    fused_qkv: bool = False  # PaddleNLP Llama's fuse_attention_qkv (default False: separate q, k, v projections)
    fused_ffn: bool = False  # fuse_attention_ffn (default False: separate gate and up projections)
    split_param: bool = False  # sharding stage1 V2 (sharding_parallel_config=split_param)
    sequence_parallel: bool = False  # Megatron sequence parallel inside tp (sequence_parallel)
    sep: int = 1  # sep_parallel_degree (Ulysses): each rank keeps 1/sep of every sequence
    cp: int = 1  # context_parallel_degree (ring attention): each rank keeps 2 of 2·cp chunks of every sequence
    recompute: bool = False  # full recompute: keep every layer's input, rebuild one layer's set in its backward
    flash_attention: bool = False  # fused attention kernel: the s x s scores are never stored (use_flash_attention)

    @property
    def data_world(self) -> int:
        return self.dp * self.sharding

    @property
    def grad_accum(self) -> int:
        # global batch = micro batch × accumulation steps × data-parallel ranks (dp × sharding)
        m, rem = divmod(self.global_batch, self.micro_batch * self.data_world)
        if m < 1 or rem:
            raise ValueError(f"global batch {self.global_batch} is not a multiple of micro batch {self.micro_batch} "
                             f"× dp·sharding {self.data_world}")
        return m


def pipeline_bubble(lay: Layout) -> float:
    """Idle fraction of equal pipeline stages: (p-1)/(v·m+p-1) — 1F1B for v = 1, the interleaved schedule with
    v chunks per stage otherwise (each stage's share of a micro-batch is 1/v, so the fill/drain shrinks by v)."""
    p, v, m = lay.pp, lay.vpp, lay.grad_accum
    return (p - 1) / (v * m + p - 1) if p > 1 else 0.0


def param_counts(c: Config, lay: Layout) -> dict:
    """Parameters of the whole model and of the busiest rank (after tp and pp; before sharding)."""
    h, I, V, L = c.hidden, c.intermediate, c.vocab, c.layers
    kv = (c.kv_heads or c.heads) * (h // c.heads)  # width of K and V (smaller than h with GQA)
    attn = h * h + 2 * h * kv + h * h  # q (h×h), k and v (h×kv), o (h×h)
    mlp = 3 * h * I  # SwiGLU: gate and up (h×I), down (I×h)
    norms = 2 * h  # input and post-attention RMSNorm weights
    emb = V * h
    head = 0 if c.tie else h * V
    total = emb + L * (attn + mlp + norms) + h + head  # + the final norm
    # tp splits every matmul weight and the vocab of embedding and head; norms stay whole on every tp rank.
    t = lay.tp
    layer_rank = (attn + mlp) // t + norms
    # pp: layers split evenly (ceil on the busiest stage); embedding on the first stage, head + final norm on
    # the last. The busiest rank is the larger of the two ends (with pp = 1 both are the same rank).
    per_stage = math.ceil(L / lay.pp)
    first = emb // t + per_stage * layer_rank
    last = per_stage * layer_rank + h + head // t
    busiest = first + last - per_stage * layer_rank if lay.pp == 1 else max(first, last)
    return {"total": total, "rank": busiest, "layers_per_stage": per_stage}


def memory(c: Config, lay: Layout, dtype: str = "fp32") -> dict:
    """Bytes per rank: params, grads, optimizer state (AdamW), activations of the busiest rank."""
    n = param_counts(c, lay)["rank"]
    S = lay.sharding
    if dtype == "fp32":
        p_b, g_b, o_b = 4, 4, 8  # fp32 weight, fp32 grad, AdamW moment1 + moment2 (4 + 4)
    else:
        p_b, g_b, o_b = 2, 2, 12  # bf16 weight and grad; fp32 master weight + two moments (4 + 4 + 4)
    # ZeRO: stage ≥ 1 shards the optimizer state, ≥ 2 the gradients, 3 the parameters, over S ranks.
    params = n * p_b / (S if lay.stage >= 3 else 1)
    grads = n * g_b / (S if lay.stage >= 2 else 1)
    optim = n * o_b / (S if lay.stage >= 1 else 1)
    # Activations kept for backward, per layer and micro-batch (Korthikanti et al. 2022, "Reducing Activation
    # Recomputation", no sequence parallel): s·b·h·(10 + 24/t + 5·a·s/(h·t)) bytes with 2-byte activations
    # and 1-byte dropout masks. For fp32 we double it (the masks are a small part). A Llama MLP (SwiGLU, I ≈ 2.7h)
    # keeps about as much as GPT's 4h GeLU MLP, so we keep the formula; it is an estimate (±30%).
    # Sequence parallel (same paper) splits the 10·s·b·h the tp ranks would otherwise each keep whole (norm
    # and dropout inputs) along the sequence: s·b·h·(34 + 5·a·s/h)/t — every activation divided by tp.
    # Flash attention keeps no s x s scores (softmax and its dropout mask): the 5·a·s/h term goes.
    s, b, h, a, t = c.seq, lay.micro_batch, c.hidden, c.heads, lay.tp
    scores = 0.0 if lay.flash_attention else 5 * a * s / h
    if lay.sequence_parallel and t > 1:
        per_layer = s * b * h * (34 + scores) / t * (2 if dtype == "fp32" else 1)
    else:
        per_layer = s * b * h * (10 + 24 / t + scores / t) * (2 if dtype == "fp32" else 1)
    # 1F1B: stage 0 holds min(pp, m) micro-batches' activations at its peak; without pp, one. Interleaved
    # (v chunks): (1 + (p-1)/(p·v)) times that (Narayanan et al. 2021), in units of a whole stage's layers.
    inflight = min(lay.pp, lay.grad_accum) if lay.pp > 1 else 1
    if lay.pp > 1 and lay.vpp > 1:
        inflight *= 1 + (lay.pp - 1) / (lay.pp * lay.vpp)
    logits = s * b * c.vocab * 4 * 2 // (1 if lay.tp_output_gathered else t)  # fp32 logits + their softmax grad
    # sep/cp: every activation (and the logits of this rank's tokens) covers s/sep or s/cp tokens. The formula's
    # s² attention-score term falls by the degree too (each rank scores its heads or its chunks against the whole
    # sequence: s·(s/n) per head), so the whole per-layer figure divides by the degree.
    n_seq = lay.sep * lay.cp
    per_layer, logits = per_layer / n_seq, logits / n_seq
    layers = param_counts(c, lay)["layers_per_stage"]
    if lay.recompute:
        # Full recompute keeps only each layer's input ([b,s,h], fp32 here, split by sp/sep/cp) per micro-batch in
        # flight, and rebuilds one layer's whole set during that layer's backward.
        inp = s * b * h * (4 if dtype == "fp32" else 2) / (t if lay.sequence_parallel and t > 1 else 1) / n_seq
        act = layers * inp * inflight + per_layer + logits
    else:
        act = layers * per_layer * inflight + logits
    return {"params": params, "grads": grads, "optimizer": optim, "activations": act,
            "total": params + grads + optim + act}


def communication(c: Config, lay: Layout, dtype: str = "fp32") -> dict:
    """Per rank and optimizer step: {axis: {"payload": bytes, "min_wire": bytes, "what": str}}.

    Payload follows what Paddle does on this layout; min_wire is the least any algorithm needs.
    """
    m = lay.grad_accum
    n = param_counts(c, lay)["rank"]
    g_b = 4 if dtype == "fp32" else 2
    G = n * g_b  # this rank's gradient bytes (after tp/pp split)
    W = n * (4 if dtype == "fp32" else 2)  # this rank's parameter bytes
    act = lay.micro_batch * c.seq * c.hidden * 4  # one [b, s, h] fp32 activation
    out = {}
    n_seq = lay.sep * lay.cp
    if lay.dp > 1 or n_seq > 1:
        # sep/cp ranks hold the same weights and each has the gradient of its part of the sequences: summed over
        # them in the same all-reduce, over the fused dp×sep group (fleet's; cp runs on the sep groups).
        D = lay.dp * n_seq
        # Once per step (no_sync on all micro-batches but the last): all-reduce of every gradient.
        # Under stage ≥ 1 the dp all-reduce covers what this rank keeps (all grads for stage 1, its shard for 2/3).
        Gd = G / (lay.sharding if lay.stage >= 2 else 1)
        group = "" if n_seq == 1 else f" over dp×{'sep' if lay.sep > 1 else 'cp'} ({D} ranks)"
        out["dp"] = {"payload": Gd, "min_wire": 2 * (D - 1) / D * Gd, "what": f"all-reduce grads{group}, once per step"}
    if lay.sharding > 1:
        out["sharding"] = _sharding_communication(c, lay, G, W, m)
    if lay.tp > 1:
        out["tp"] = _tp_communication(c, lay, act, m)
    if lay.pp > 1:
        p, v = lay.pp, lay.vpp
        # Per micro-batch each chunk boundary carries the activation forward and its gradient backward: p·v
        # chunks have p·v-1 boundaries (v = 1: p-1). Averaged over the p stages: (p·v-1) × 2 directions / p
        # sends of [b,s,h]. Payload counts both ends of a p2p transfer (the send and the recv): 2x.
        # Under sequence parallel the stages exchange the sequence-split [s/t,b,h] (the embedding scatters it).
        boundary = act / lay.tp if lay.sequence_parallel and lay.tp > 1 else act
        per_rank = m * boundary * 2 * (p * v - 1) / p
        out["pp"] = {"payload": 2 * per_rank, "min_wire": per_rank,
                     "what": f"send/recv [b,s,h] fwd+bwd per chunk boundary ({p * v - 1}), per micro-batch "
                             f"(x{m}), avg over stages; bubble {100 * pipeline_bubble(lay):.1f}%"}
    out.update(long_context_communication(c, lay))
    return out


def _sharding_communication(c: Config, lay: Layout, G: float, W: float, m: int) -> dict:
    """The sharding axis of :func:`communication` (``G``/``W``: this rank's gradient/parameter bytes)."""
    S = lay.sharding
    f = (S - 1) / S
    if lay.stage <= 1 and lay.split_param:
        # V2: reduce-scatter the fused gradient buffers (payload G, counted at its input), all-gather the
        # updated parameter buffers (W). Minimum: the same algorithm, (S-1)/S·(G + W).
        return {"payload": G + W, "min_wire": f * (G + W),
                "what": "reduce-scatter grad buffers + all-gather param buffers, once per step"}
    if lay.stage <= 1:
        # fleet's V1: reduce each grad to its owner (payload G), owners broadcast updated params (payload W).
        # Minimum: reduce-scatter + all-gather = (S-1)/S·(G + W).
        return {"payload": G + W, "min_wire": f * (G + W),
                "what": "reduce grads to owners + broadcast params, once per step"}
    if lay.stage == 2:
        # GroupShardedStage2 reduces every gradient to its owner in a backward hook; paddletrainer's no_sync
        # keeps the hooks disarmed on all micro-batches but the last (G once), then owners broadcast the
        # updated params (W). Minimum: (S-1)/S·(G + W).
        return {"payload": G + W, "min_wire": f * (G + W),
                "what": "reduce grads to owners on the last micro-batch + broadcast params"}
    # Stage 3: all-gather params before forward and again before backward of every micro-batch (2·W each),
    # and reduce-scatter each gradient into its owner's slice every micro-batch (G, counted at its input;
    # paddletrainer's hook — Paddle's own all-reduces the whole gradient, 2x the wire). Minimum is the
    # same algorithm: (S-1)/S·m·(2W + G).
    return {"payload": m * (2 * W + G), "min_wire": f * m * (2 * W + G),
            "what": f"all-gather params fwd+bwd, reduce-scatter grads into slices, each micro-batch (x{m})"}


def _tp_communication(c: Config, lay: Layout, act: float, m: int) -> dict:
    """The tensor-parallel axis of :func:`communication` (``act``: one [b, s, h] fp32 activation in bytes)."""
    t = lay.tp
    L = param_counts(c, lay)["layers_per_stage"]
    # Megatron TP per micro-batch and layer: forward all-reduces [b,s,h] after attention (o_proj) and after
    # the MLP (down_proj): 2. Backward all-reduces the input grad of every column-parallel projection (its
    # _c_identity): 1 for a fused qkv + 1 for a fused gate_up = 2 — the minimum; PaddleNLP's Llama by default
    # has separate q, k, v (3) and gate, up (2) projections: 5. Plus the vocab-parallel embedding (forward)
    # and the LM head's input (backward): 2 per micro-batch. Logits gathered (tensor_parallel_output=False):
    # an all-gather of [b,s,V] fp32.
    bwd = (1 if lay.fused_qkv else 3) + (1 if lay.fused_ffn else 2)
    unfused = (2 + 5) * L + 2
    gather = lay.micro_batch * c.seq * c.vocab * 4 if lay.tp_output_gathered else 0
    if not lay.sequence_parallel:
        n_ar = (2 + bwd) * L + 2
        n_min = 4 * L + 2
        return {"payload": m * (n_ar * act + gather),
                "min_wire": m * (2 * (t - 1) / t * n_min * act + (t - 1) / t * gather),
                "what": f"{n_ar} all-reduces of [b,s,h] (unfused q/k/v, gate/up: {unfused}; min {n_min}, "
                        f"fused) + logits all-gather, per micro-batch (x{m})"}
    # Sequence parallel: each column projection all-gathers its [s/t,b,h] input forward (reduce-scatter
    # backward), o_proj and down_proj reduce-scatter forward (all-gather backward): 2·(bwd + 2) per layer,
    # each moving (t-1)/t of [b,s,h] at least — the wire of the (bwd + 2) all-reduces they replace. Plus
    # the embedding's all-reduce, the scatter/gather around the layers (an all-gather each way) and the
    # head's input-grad all-reduce. The CPU reduce-scatter is an all-reduce (parallel/cpu/reduce_scatter.py),
    # so its wire is 2x the minimum for the reduce-scatter half: about 1.5x overall.
    # Once per step, the tp all-reduce of the norm weights' gradients (sequence-parallel parameters).
    n_ag, n_rs = (bwd + 2) * L + 2, (bwd + 2) * L
    norms = (2 * L + 1) * c.hidden * 4
    return {"payload": m * ((n_ag + n_rs + 2) * act + gather) + norms,
            "min_wire": m * ((t - 1) / t * (n_ag + n_rs) * act + 2 * (t - 1) / t * 2 * act
                             + (t - 1) / t * gather) + 2 * (t - 1) / t * norms,
            "what": f"SP: {n_ag} all-gathers + {n_rs} reduce-scatters of [b,s,h] (fused: {4 * L + 2} + "
                    f"{4 * L}) + 2 all-reduces + logits all-gather, per micro-batch (x{m}); norm grads"}


def long_context_communication(c: Config, lay: Layout) -> dict:
    """sep (Ulysses all-to-alls) and cp (ring K/V passes) per rank and optimizer step, fp32 activations.

    A = one [b, s/n, h] activation shard of this rank (n = sep or cp); K and V are [b, s/n, kv] each."""
    out = {}
    m, L = lay.grad_accum, param_counts(c, lay)["layers_per_stage"]
    kv = (c.kv_heads or c.heads) * (c.hidden // c.heads)
    if lay.sep > 1:
        S = lay.sep
        q_o = lay.micro_batch * c.seq // S * c.hidden * 4 // lay.tp  # this rank's q (or attention output) shard
        k_v = lay.micro_batch * c.seq // S * kv * 4 // lay.tp
        # Per layer forward: q, k, v all-to-all to whole sequences with 1/S of the heads, the output back (4);
        # backward the same four in reverse. An all-to-all keeps 1/S of its input and sends the rest: (S-1)/S.
        per_mb = 2 * L * (2 * q_o + 2 * k_v)
        # The CPU build has no all-to-all in gloo: paddletrainer's exact fill (parallel/cpu/all_to_all.py)
        # all-gathers every rank's whole input (payload S x the input, wire (S-1)/S of that) and keeps its piece:
        # S x the minimum wire.
        out["sep"] = {"payload": m * per_mb, "min_wire": m * (S - 1) / S * per_mb,
                      "what": f"4 all-to-alls of q/k/v/output fwd + 4 bwd per layer ({L}), per micro-batch (x{m}); "
                              f"on CPU the all-gather fill: payload {fmt_bytes(S * m * per_mb)}, wire "
                              f"{fmt_bytes((S - 1) * m * per_mb)} ({S}x the min)"}
    if lay.cp > 1:
        C = lay.cp
        block = 2 * lay.micro_batch * c.seq // C * kv * 4 // lay.tp  # this rank's K and V (2 of 2·cp chunks)
        # Ring (parallel/ring_attention.py): forward passes the K/V block C-1 hops; backward passes K/V C-1 hops
        # again with their gradients riding along, plus one last hop bringing the gradients home (C). The minimum
        # is the same ring (every rank needs every other K/V block and returns its gradient contribution); the
        # payload counts both ends of each send/recv, as for pp.
        per_mb = L * ((C - 1) * 2 + C) * block
        out["cp"] = {"payload": 2 * m * per_mb, "min_wire": m * per_mb,
                     "what": f"ring send/recv of this rank's K/V: {C - 1} hops fwd, {C - 1} bwd + their grads "
                             f"{C} hops, per layer ({L}), per micro-batch (x{m})"}
    return out


def moe_all_to_all(tokens: int, hidden: int, top_k: int, ep: int, bytes_per_value: int = 4) -> dict:
    """Token exchange of one MoE layer under expert parallel, per rank and micro-batch (:mod:`paddletrainer.moe`).

    ``tokens``: this rank's tokens in the micro-batch. Each (token, slot) row of ``hidden`` values goes to its
    expert's rank and comes back: 2 all-to-alls forward (dispatch, combine), their reverses backward (2 more),
    each of ``tokens · top_k`` rows. With balanced routing 1/ep of the rows stay on the rank: the wire is
    (ep-1)/ep of the payload. The per-expert counts exchanged first (ep × experts int64) are negligible.
    On CPU the all-to-all fill (parallel/cpu/all_to_all.py) all-gathers: ep x the minimum wire."""
    rows = tokens * top_k * hidden * bytes_per_value
    payload = 4 * rows
    return {"payload": payload, "min_wire": payload * (ep - 1) // ep,
            "what": f"4 all-to-alls (dispatch + combine, fwd and bwd) of {tokens}x{top_k} rows of {hidden} per MoE "
                    f"layer per micro-batch; CPU fill: {ep}x the min wire"}
