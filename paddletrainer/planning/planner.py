"""The layout planner: every layout of a model on ``devices`` devices, its predicted peak memory per rank and
step time, the ones that fit, best (fastest) first.

    from paddletrainer.planning import plan
    for cand in plan("path/to/config.json", devices=8, profile="A100-80G", global_batch=512, seq_length=4096)[:5]:
        print(cand.describe())

Layouts: tp × sep|cp × sharding (stage 1/2/3) × pp (× vpp) × dp = devices, with recompute and sequence
parallel on/off and every micro-batch that divides the global batch (gradient accumulation the rest).

Memory of the busiest rank = the profile's fixed process baseline + the training state
(``memory_model.state_bytes_per_rank``: parameters, gradients, optimizer state, fp32 masters under 16-bit
training, dp buffers) + the activations (``cost_model.memory``) + the transient of a step (see
``Calibration``: what the allocator holds beyond the live tensors; stage 3's gathered parameters).

Step time = compute × (1 + (pp-1)/(m·vpp)) + communication, not overlapped. Compute: model FLOPs (6 per
matmul parameter and token, 12·L·h·s per token for attention, a third more of the layers' share with recompute)
over peak TFLOPs × efficiency, split evenly over the ranks (the busiest pipeline stage's share). Communication:
``cost_model.communication``'s minimum wire bytes per axis (what NCCL's ring all-reduce, all-gather and
reduce-scatter send) over the intra-node bandwidth when the axis's group fits in one node, the inter-node one
otherwise (axes placed innermost first: tp, sep/cp, sharding, pp, dp, as fleet's topology orders them); the
data-parallel all-reduce takes the faster of ring and tree. Pure arithmetic (no paddle).
"""
from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import stat
from pathlib import Path

from ..parallel.layout import NUM_EXPERTS_FIELDS
from .cost_model import Config, Layout, communication, fmt_bytes, memory, param_counts
from .memory_model import DTYPE_BYTES, OPTIMIZER_STATES, state_bytes_per_rank
from .profiles import DeviceProfile, get_profile

__all__ = ["Calibration", "Candidate", "CALIBRATION", "config_from_paddlenlp", "enumerate_layouts", "plan",
           "predict_memory", "predict_time"]


@dataclasses.dataclass(frozen=True)
class Calibration:
    """Constants of the memory model's two least-known terms, fitted on CPU measurements.

    ``activation_factor`` scales ``cost_model.memory``'s activation estimate (a bf16 GPT formula doubled for
    fp32); the transient of a step is ``transient_fixed + transient_grad × the gradient bytes the rank's
    backward produces (before sharding)`` (what the allocator holds beyond the live tensors at the peak: freed
    blocks it keeps, the gradients' temporaries). Stage 3 returns freed host memory to the system
    (``parallel.host_allocator``), so its transient is ``transient_fixed`` plus what its gathered tensors hold
    at their peak, which is arithmetic, not a fitted factor (:func:`stage3_gathered_bytes`). The defaults
    (``CALIBRATION``) are the least-squares
    fit of the peak minus the baseline and the counted state on bench_memory's 2026-11-25 20:00 run (every
    layout but dp, whose gradient copy was removed afterwards; 45.6M and 168M Llamas; its table is in
    docs/benchmarks.md as of commit 4429ade), measured per process baseline subtracted; checked on the
    2026-11-26 run (docs/benchmarks.md, "Memory per rank"; tests/unit/test_planner.py).
    The class's own defaults are the uncalibrated arithmetic. Fitted on CPU only: on GPUs the allocator differs
    (docs/benchmarks.md, "Layout planner against published runs", says how far that lands).
    """

    activation_factor: float = 1.0
    transient_fixed: float = 0.0
    transient_grad: float = 0.0


CALIBRATION = Calibration(activation_factor=0.93, transient_fixed=91 * 2**20, transient_grad=0.41)


def stage3_gathered_bytes(c: Config, lay: Layout, width: int) -> float:
    """The bytes stage 3 holds beyond its slices at its peak, from the lifetime of what it gathers.

    A layer's parameters are gathered for its forward (the next layer's prefetched) and released after it; in
    backward they are gathered again, the next layer's prefetched, and each is released as soon as its gradient
    is complete (``sharding._ReduceScatterStage3``), before that gradient, full-size until then, is reduce-scattered
    into the rank's slice (on CPU an all-reduce in place, in 16 MiB pieces). So the peak is the larger of: the
    largest single matrix (the embedding or the head, V·h/tp) in its backward: gathered and its full gradient,
    2 matrices; and a decoder layer in backward: its gathered weights, the next layer's prefetched and its full
    gradients, 3 layers. It does not grow with the sharding degree: the state it sits on top of shrinks as 1/N.
    """
    if lay.stage != 3:
        return 0.0
    h, I = c.hidden, c.intermediate
    kv = (c.kv_heads or c.heads) * (h // c.heads)
    layer = (2 * h * h + 2 * h * kv + 3 * h * I) // lay.tp
    matrix = max(c.vocab * h // lay.tp, h * I // lay.tp)
    return width * max(2 * matrix, 3 * layer)


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One layout with its predictions: ``memory`` and ``time`` hold the parts (bytes, seconds)."""

    layout: Layout
    memory: dict
    time: dict
    fits: bool
    seq: int  # tokens per sequence

    @property
    def tokens_per_s(self) -> float:
        return self.layout.global_batch * self.seq / self.time["step"]

    @property
    def peak(self) -> float:
        return self.memory["peak"]

    @property
    def step_time(self) -> float:
        return self.time["step"]

    def name(self) -> str:
        lay, parts = self.layout, []
        for axis in ("dp", "tp", "pp", "sep", "cp"):
            if getattr(lay, axis) > 1:
                parts.append(f"{axis}{getattr(lay, axis)}")
        if lay.sharding > 1:
            parts.append(f"sharding{lay.sharding}(stage{lay.stage})")
        if lay.vpp > 1:
            parts.append(f"vpp{lay.vpp}")
        if lay.sequence_parallel:
            parts.append("sp")
        if lay.recompute:
            parts.append("recompute")
        return " ".join(parts) or "one device"

    def describe(self) -> str:
        return (f"{self.name()}: micro-batch {self.layout.micro_batch} x accumulation {self.layout.grad_accum}; "
                f"peak {fmt_bytes(self.peak)} per rank; step {self.step_time:.3f} s")


# ------------------------------------------------------------------------------------ the model
MAX_CONFIG_BYTES = 16 << 20  # a config.json is a few KiB
MAX_SIZE = 2**31 - 1  # any model dimension, sequence length or count: beyond it the arithmetic means nothing
_CONFIG_SIZES = ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size", "intermediate_size")


def _config_document(path) -> dict:
    """The JSON object of config file ``path``: a regular file (a FIFO, a device or a directory is refused at once,
    never read) of at most :data:`MAX_CONFIG_BYTES`; raises ``ValueError`` saying what is wrong."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as f:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise ValueError("is a directory" if stat.S_ISDIR(mode) else "is not a regular file")
        raw = f.read(MAX_CONFIG_BYTES + 1)
    if len(raw) > MAX_CONFIG_BYTES:
        raise ValueError(f"is larger than {MAX_CONFIG_BYTES} bytes (not a model config)")
    try:
        d = json.loads(raw)
    except RecursionError:
        raise ValueError("is not JSON (nested too deeply)") from None
    if not isinstance(d, dict):
        raise ValueError("is not a JSON object (a model config)")
    return d


def _size(d: dict, key: str, optional: bool = False) -> int:
    value = d.get(key)
    if optional and value in (None, 0):
        return 0
    if type(value) is not int or not 1 <= value <= MAX_SIZE:
        raise ValueError(f"{key}={json.dumps(value)[:40]} is invalid: must be an integer in [1, {MAX_SIZE}]")
    return value


def config_from_paddlenlp(source, seq_length: int | None = None) -> Config:
    """A ``Config`` from a PaddleNLP/Hugging Face ``config.json`` (a path or its dict); ``ValueError`` naming the
    field for a file or value that is not a model config's (``OSError`` when the file cannot be opened)."""
    d = _config_document(source) if isinstance(source, (str, Path)) else dict(source)
    missing = [k for k in _CONFIG_SIZES if k not in d]
    if missing:
        raise ValueError(f"model config lacks {', '.join(missing)} (a PaddleNLP Llama-style config.json has them)")
    experts = next((f"{k}={d[k]}" for k in NUM_EXPERTS_FIELDS if type(d.get(k)) is int and d[k] > 1), None)
    if experts:
        raise ValueError(f"model config has {experts}: the planner prices dense models only (its memory and time "
                         "would be a dense model's); plan a mixture-of-experts model by hand (docs/layouts.md)")
    seq = seq_length or d.get("seq_length")
    if not seq:
        raise ValueError("no sequence length: pass seq_length (--seq-length); the config has no seq_length")
    sizes = {k: _size(d, k) for k in _CONFIG_SIZES}
    return Config(hidden=sizes["hidden_size"], layers=sizes["num_hidden_layers"],
                  heads=sizes["num_attention_heads"], vocab=sizes["vocab_size"], seq=_size({"seq_length": seq},
                                                                                           "seq_length"),
                  intermediate=sizes["intermediate_size"], kv_heads=_size(d, "num_key_value_heads", optional=True),
                  tie=bool(d.get("tie_word_embeddings", False)))


def _act_dtype(profile: DeviceProfile) -> str:
    return "fp32" if DTYPE_BYTES[profile.dtype] == 4 else "bf16"


def predict_memory(c: Config, lay: Layout, profile: DeviceProfile, optimizer: str = "adamw",
                   calibration: Calibration = CALIBRATION) -> dict:
    """Bytes of the busiest rank by part, and ``peak`` (their sum)."""
    n = param_counts(c, lay)["rank"]
    states = state_bytes_per_rank(n, dtype=profile.dtype, optimizer=optimizer, dp=lay.dp * lay.sep * lay.cp,
                                  sharding=lay.sharding, stage=lay.stage, grads_in_comm_buffers=True)
    act = memory(c, lay, _act_dtype(profile))["activations"] * calibration.activation_factor
    width = DTYPE_BYTES[profile.dtype]
    # freed blocks the allocator keeps grow with the gradients; stage 3 returns what it frees (parallel.host_allocator)
    kept_freed = 0.0 if lay.stage == 3 else calibration.transient_grad * n * width
    transient = calibration.transient_fixed + kept_freed + stage3_gathered_bytes(c, lay, width)
    out = {"baseline": profile.baseline_bytes, **{k: v for k, v in states.as_dict().items() if k != "total"},
           "activations": act, "transient": transient}
    out["peak"] = sum(out.values())
    return out


def model_flops_per_token(c: Config, recompute: bool = False) -> float:
    """Training FLOPs per token: 6 per matmul parameter (forward 2, backward 4) + 12·L·h·s for attention
    scores; recompute runs the layers' forward twice (+ a third of their share)."""
    h, L = c.hidden, c.layers
    kv = (c.kv_heads or c.heads) * (h // c.heads)
    per_layer = 2 * h * h + 2 * h * kv + 3 * h * c.intermediate  # q, o; k, v; gate, up, down
    layers = 6 * L * per_layer + 12 * L * h * c.seq
    head = h * c.vocab  # the LM head is a matmul, tied or not; the embedding is a lookup
    return layers * (4 / 3 if recompute else 1) + 6 * head


def _axis_bandwidth(lay: Layout, axis: str, profile: DeviceProfile) -> float:
    """Fleet orders ranks dp, pp, sharding, sep, mp (outermost first): a group is inside a node when its span
    (its degree × the degrees inside it) fits in one."""
    inner = {"tp": 1, "sep": lay.tp, "cp": lay.tp, "sharding": lay.tp * lay.sep * lay.cp,
             "pp": lay.tp * lay.sep * lay.cp * lay.sharding, "dp": lay.tp * lay.sep * lay.cp * lay.sharding * lay.pp}
    degree = {"tp": lay.tp, "sep": lay.sep, "cp": lay.cp, "sharding": lay.sharding, "pp": lay.pp,
              "dp": lay.dp * lay.sep * lay.cp}[axis]
    if axis == "dp" and lay.sep * lay.cp > 1:  # the fused dp×sep group spans the sep ranks too
        inner["dp"] = lay.tp
        degree = lay.dp * lay.sep * lay.cp * lay.sharding * lay.pp
    span = inner[axis] * degree
    return profile.intra_node_bw if span <= profile.devices_per_node else profile.inter_node_bw


def predict_time(c: Config, lay: Layout, profile: DeviceProfile) -> dict:
    """Seconds per optimizer step by part (``compute``, ``bubble``, ``comm_<axis>``) and ``step``."""
    world = lay.dp * lay.sharding * lay.tp * lay.pp * lay.sep * lay.cp
    tokens = lay.global_batch * c.seq
    per_stage = param_counts(c, lay)["layers_per_stage"]
    imbalance = per_stage * lay.pp / c.layers  # the busiest stage sets the pace
    compute = model_flops_per_token(c, lay.recompute) * tokens / world * imbalance / (
        profile.peak_tflops * 1e12 * profile.efficiency)
    m = lay.grad_accum
    out = {"compute": compute, "bubble": compute * (lay.pp - 1) / (m * lay.vpp) if lay.pp > 1 else 0.0}
    act_scale = 1.0 if _act_dtype(profile) == "fp32" else 0.5  # cost_model prices activations as fp32
    for axis, v in communication(c, lay, _act_dtype(profile)).items():
        wire = v["min_wire"] * (act_scale if axis in ("tp", "pp", "sep", "cp") else 1.0)
        bw = _axis_bandwidth(lay, axis, profile)
        t = wire / bw
        if axis == "dp":  # NCCL picks ring or tree: tree sends 2x the payload but in log2(n) latency steps
            n_dp = lay.dp * lay.sep * lay.cp
            ring = t + 2 * (n_dp - 1) * profile.latency_s
            tree = 2 * v["payload"] / bw + 2 * math.ceil(math.log2(n_dp)) * profile.latency_s
            t = min(ring, tree)
        out[f"comm_{axis}"] = t
    out["step"] = sum(out.values())
    return out


# ------------------------------------------------------------------------------------ the search
@functools.lru_cache(maxsize=4096)  # the search asks for the same few numbers' divisors many times
def _divisors(n: int, at_most: int | None = None) -> list:
    """The divisors of ``n`` (those ≤ ``at_most``), ascending, in O(√n) steps."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    every = small + [n // d for d in reversed(small) if d * d != n]
    return every if at_most is None else [d for d in every if d <= at_most]


def enumerate_layouts(c: Config, devices: int, global_batch: int, max_micro_batch: int = 8,
                      devices_per_node: int = 8, flash_attention: bool = False):
    """Every layout of ``devices`` ranks the model's shape allows (tp divides the heads and stays in a node;
    pp ≤ layers; vpp divides the layers per stage; sep divides heads/tp; sequences split evenly)."""
    kv = c.kv_heads or c.heads
    for tp in _divisors(devices):
        if c.heads % tp or kv % tp or tp > devices_per_node:
            continue
        for pp in _divisors(devices // tp):
            if pp > c.layers:
                continue
            for n_seq, axis in [(1, None)] + [(d, a) for d in _divisors(devices // tp // pp)[1:] for a in ("sep", "cp")]:
                if (axis == "sep" and (c.heads // tp) % n_seq) or (axis and c.seq % (2 * n_seq)):
                    continue
                yield from _data_layouts(c, devices // tp // pp // n_seq, global_batch, max_micro_batch,
                                         dict(tp=tp, pp=pp, sep=n_seq if axis == "sep" else 1,
                                              cp=n_seq if axis == "cp" else 1, flash_attention=flash_attention))


def _data_layouts(c: Config, data: int, global_batch: int, max_micro_batch: int, kw: dict):
    """The dp × sharding split of ``data`` ranks, stages, micro-batches, vpp, recompute and sp."""
    if global_batch % data:
        return
    for sharding in _divisors(data):
        for stage in ((1, 2, 3) if sharding > 1 else (0,)):
            for mb in _divisors(global_batch // data, max_micro_batch):
                m = global_batch // data // mb
                if mb > max_micro_batch or (kw["pp"] > 1 and m < kw["pp"]):
                    continue
                vpps = [1] + [v for v in _divisors(c.layers // kw["pp"])[1:]
                              if kw["pp"] > 1 and c.layers % kw["pp"] == 0 and m % kw["pp"] == 0]
                for vpp in vpps:
                    for rc in (False, True):
                        for sp in ((False, True) if kw["tp"] > 1 else (False,)):
                            yield Layout(dp=data // sharding, sharding=sharding, stage=stage, micro_batch=mb,
                                         global_batch=global_batch, vpp=vpp, recompute=rc, sequence_parallel=sp,
                                         **kw)


def plan(model, devices: int, global_batch: int, profile="A100-80G", device_memory: float | None = None,
         seq_length: int | None = None, optimizer: str = "adamw", max_micro_batch: int = 8,
         calibration: Calibration = CALIBRATION, include_unfit: bool = False,
         flash_attention: bool | None = None) -> list:
    """Candidates for ``model`` (a ``Config``, a config.json path or its dict) on ``devices`` devices of
    ``profile`` (a ``PROFILES`` name or a ``DeviceProfile``), fastest first; those whose predicted peak
    exceeds ``device_memory`` (bytes; default the profile's) are dropped unless ``include_unfit``.
    ``flash_attention`` (default: on for 16-bit profiles, as PaddleNLP's GPU recipes set it) drops the stored
    attention scores from the activations."""
    c = model if isinstance(model, Config) else config_from_paddlenlp(model, seq_length)
    if seq_length and isinstance(model, Config):
        c = dataclasses.replace(c, seq=seq_length)
    prof = get_profile(profile)
    for name, value in (("devices", devices), ("global_batch", global_batch), ("max_micro_batch", max_micro_batch)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if optimizer not in OPTIMIZER_STATES:
        raise ValueError(f"optimizer must be one of {sorted(OPTIMIZER_STATES)}, got {optimizer!r}")
    limit = prof.memory_bytes if device_memory is None else device_memory
    fa = DTYPE_BYTES[prof.dtype] < 4 if flash_attention is None else bool(flash_attention)
    out = []
    for lay in enumerate_layouts(c, devices, global_batch, max_micro_batch, prof.devices_per_node, fa):
        mem = predict_memory(c, lay, prof, optimizer, calibration)
        fits = mem["peak"] <= limit
        if fits or include_unfit:
            out.append(Candidate(lay, mem, predict_time(c, lay, prof), fits, c.seq))
    out.sort(key=lambda cand: (not cand.fits, cand.step_time, cand.peak))
    return out
