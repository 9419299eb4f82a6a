"""Throughput, FLOPs per token and model FLOPs utilization (MFU).

The FLOPs estimate is the one in the PaLM paper, appendix B (https://arxiv.org/abs/2204.02311), also used by
nanoGPT's ``estimate_mfu`` and torchtitan: ``6·N + 12·L·h·s`` per token for a forward + backward pass, where
N is the number of weights that take part in a matrix multiply. It counts model FLOPs (no activation
recomputation), so MFU numbers are comparable across codebases that use the same formula.

Nothing here touches a device: every count comes from batch shapes, which paddle keeps on the host.
"""
from __future__ import annotations

import time
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

import numpy as np
import paddle

__all__ = ["causal_lm_flops_per_token", "flops_per_token_from_config", "flops_per_token_of_model", "mfu", "batch_counts", "ThroughputMeter",
           "TokenCounter", "trained_tokens"]

IGNORE_INDEX = -100  # the label of a token no loss is taken on (prompts, padding), PaddleNLP's and Hugging Face's


def causal_lm_flops_per_token(num_layers: int, hidden_size: int, num_heads: int, seq_len: int, vocab_size: int,
                              intermediate_size: Optional[int] = None, num_kv_heads: Optional[int] = None,
                              *, gated_mlp: bool = True) -> int:
    """Training FLOPs (forward + backward) per token of a decoder-only transformer such as Llama.

    ``intermediate_size=None`` means ``4·hidden_size``; ``num_kv_heads=None`` means ``num_heads`` (no GQA);
    ``gated_mlp=True`` is the SwiGLU MLP (gate, up, down), ``False`` a GPT-2 MLP (up, down).
    """
    L, h, s, V = num_layers, hidden_size, seq_len, vocab_size
    I = 4 * h if intermediate_size is None else intermediate_size
    head_dim = h // num_heads
    kv_dim = (num_kv_heads or num_heads) * head_dim  # width of K and V; smaller than h with GQA

    # Weights that take part in a matmul, per layer:
    attn = h * h + 2 * h * kv_dim + h * h  # q_proj (h -> h), k_proj and v_proj (h -> kv_dim), o_proj (h -> h)
    mlp = (3 if gated_mlp else 2) * h * I  # gate_proj and up_proj (h -> I), down_proj (I -> h)
    # Plus the LM head (h -> V). The input embedding is a table lookup (no FLOPs), and norms/biases are
    # elementwise, O(h) per token, so both are left out.
    n_matmul = L * (attn + mlp) + h * V

    # Each weight costs a multiply and an add per token in the forward pass (2 FLOPs), and twice that in the
    # backward pass (gradient w.r.t. the input and w.r.t. the weight): 2 + 4 = 6 FLOPs per weight per token.
    weight_flops = 6 * n_matmul

    # Attention itself has no weights: per layer and token, Q·K^T is s dot products of length h (2·s·h FLOPs)
    # and the weighted sum of V is another 2·s·h; forward 4·s·h, x3 with the backward pass = 12·s·h.
    # GQA does not change it (every query head still attends over s keys). Like PaLM and nanoGPT we do not
    # halve it for the causal mask, which over-counts slightly; keep that in mind when comparing to Megatron.
    attention_flops = 12 * L * h * s
    return weight_flops + attention_flops


def flops_per_token_of_model(model) -> Optional[float]:
    """The model's own ``flops_per_token()`` when it has one (a model the config cannot describe, e.g. a
    mixture of experts, whose tokens go through ``top_k`` experts only), else :func:`flops_per_token_from_config`
    of ``model.config``, or None when the model has no (usable) LlamaConfig-like config (then MFU is not
    reported)."""
    own = getattr(model, "flops_per_token", None)
    if callable(own):
        return own()
    config = getattr(model, "config", None)
    if config is None or not hasattr(config, "num_hidden_layers"):
        return None
    try:
        return flops_per_token_from_config(config)
    except (AttributeError, TypeError, ValueError):
        return None


def flops_per_token_from_config(config: Any, seq_len: Optional[int] = None) -> int:
    """``causal_lm_flops_per_token`` from a LlamaConfig-like object (duck-typed).

    Reads ``num_hidden_layers, hidden_size, num_attention_heads, vocab_size`` and, when present,
    ``intermediate_size, num_key_value_heads``. ``seq_len`` defaults to ``config.max_position_embeddings``;
    pass the training sequence length when it is shorter.
    """
    required = ["num_hidden_layers", "hidden_size", "num_attention_heads", "vocab_size"]
    missing = [name for name in required if getattr(config, name, None) is None]
    if seq_len is None:
        seq_len = getattr(config, "max_position_embeddings", None)
        if seq_len is None:
            missing.append("max_position_embeddings (or pass seq_len)")
    if missing:
        raise ValueError(f"config lacks {', '.join(missing)}; cannot estimate FLOPs per token")
    return causal_lm_flops_per_token(
        num_layers=config.num_hidden_layers,
        hidden_size=config.hidden_size,
        num_heads=config.num_attention_heads,
        seq_len=seq_len,
        vocab_size=config.vocab_size,
        intermediate_size=getattr(config, "intermediate_size", None),
        num_kv_heads=getattr(config, "num_key_value_heads", None),
    )


def mfu(tokens_per_second: float, flops_per_token: float, peak_flops: float) -> float:
    """Model FLOPs utilization as a fraction (0.4 = 40 %): achieved FLOP/s over the hardware's peak FLOP/s.

    Use matching scopes: tokens/s of one device with that device's peak, or global tokens/s with the sum.
    """
    if peak_flops <= 0:
        raise ValueError(f"peak_flops must be positive, got {peak_flops}")
    return tokens_per_second * flops_per_token / peak_flops


def batch_counts(inputs: Any, key: str = "input_ids") -> Tuple[int, int]:
    """``(samples, tokens)`` of a batch from its shape alone: ``(B, B·S)`` for a ``[B, S]`` tensor.

    ``inputs`` may be a dict (``inputs[key]``; without that key, samples come from its first value with a
    shape and tokens are 0), a list/tuple (its first element) or a tensor/array. Padding counts as tokens: counting only real tokens would need
    ``attention_mask.sum()``, a device sync every step.
    """
    tensor = inputs
    if isinstance(inputs, dict):
        tensor = inputs.get(key)
        if tensor is None:  # no token ids (e.g. a regression batch): count samples only
            first = next((v for v in inputs.values() if hasattr(v, "shape")), None)
            if first is None or not list(first.shape):
                raise ValueError("cannot count samples: the batch has no tensor with a shape")
            return int(first.shape[0]), 0
    elif isinstance(inputs, (list, tuple)):
        tensor = inputs[0] if inputs else None
    shape = list(getattr(tensor, "shape", None) or [])
    if not shape:
        raise ValueError("cannot count samples: the batch has no tensor with a shape")
    samples = int(shape[0])
    tokens = samples * int(shape[1]) if len(shape) >= 2 else samples
    return samples, tokens


def trained_tokens(inputs: Any):
    """The tokens of a batch a loss is taken on (``labels`` not :data:`IGNORE_INDEX`): an int for NumPy labels, a
    0-D int64 tensor counted where tensor labels are (no device read: :class:`ThroughputMeter` reads the sum at its
    report, a log step); None when the batch has no ``[batch, seq]`` labels. With padded fine-tuning samples this
    is what the step learned from; packing rows raises it toward the tokens counted by :func:`batch_counts`."""
    labels = inputs.get("labels") if isinstance(inputs, dict) else None
    if labels is None or len(getattr(labels, "shape", ())) < 2:
        return None
    if isinstance(labels, paddle.Tensor):
        return (labels != IGNORE_INDEX).astype("int64").sum()
    return int(np.count_nonzero(np.asarray(labels) != IGNORE_INDEX))


class ThroughputMeter:
    """Counts samples, tokens and steps between two reports and turns them into rates.

    Call ``update`` once per optimizer step with that step's micro-batches, and ``report`` at each log step.
    Counts come from batch shapes (``batch_counts``), so no device sync happens here. On GPU the wall time of
    an interval is still right because the interval ends at the log step, which reads the loss and so waits
    for the device; single steps in between may look fast or slow, their sum does not.
    """

    def __init__(self, clock: Callable[[], float] = time.perf_counter):
        self._clock = clock
        self.reset()

    def reset(self) -> None:
        """Start a new interval now."""
        self._start = self._clock()
        self.samples = 0
        self.tokens = 0
        self.trained_tokens = 0
        self.steps = 0

    def update(self, micro_batches: Sequence[Any], per_rank_to_global: int = 1) -> None:
        """Count one optimizer step: the samples and tokens of its micro-batches (a list of batches).

        ``per_rank_to_global`` scales this rank's counts to the whole run (the number of data-parallel
        ranks, each reading a different slice), so the rates are global; 1 keeps them per rank. Trained tokens
        (:func:`trained_tokens`) are scaled the same way: an estimate of the run's from this rank's, exact when
        the data ranks' batches train as many tokens.
        """
        for batch in micro_batches:
            samples, tokens = batch_counts(batch)
            self.samples += samples * per_rank_to_global
            self.tokens += tokens * per_rank_to_global
            counted = trained_tokens(batch)
            if counted is not None:  # a tensor stays one on the device until the report reads it
                self.trained_tokens = self.trained_tokens + counted * per_rank_to_global
        self.steps += 1

    def add(self, samples: int, tokens: int = 0, steps: int = 1) -> None:
        """Add counts directly (when they are known without a batch, e.g. from a packed-data loader)."""
        self.samples += samples
        self.tokens += tokens
        self.steps += steps

    def report(self, reset: bool = True, flops_per_token: Optional[float] = None,
               peak_flops: Optional[float] = None, num_devices: int = 1) -> Dict[str, float]:
        """Rates over the interval since the last reset; ``{}`` if no step was counted.

        Keys: ``samples_per_second, steps_per_second, step_time`` (seconds per step) and, when tokens were
        counted, ``tokens_per_second`` and, when the batches' labels were counted on the host,
        ``trained_tokens_per_second`` (the tokens a loss was taken on: padding and prompts excluded, so packed
        rows show what they save); with ``num_devices > 1`` also ``tokens_per_second_per_device``; with
        ``flops_per_token`` also ``tflops_per_device`` (model TFLOP/s of one device), and with ``peak_flops``
        (the peak FLOP/s of ONE device) also ``mfu`` (a fraction).

        ``num_devices`` is how many devices produced the counted tokens: 1 for per-rank counts, the world size
        (every tp/pp/sharding/dp device) when ``update`` scaled the counts to the whole run.
        """
        elapsed = self._clock() - self._start
        out: Dict[str, float] = {}
        if self.steps > 0 and elapsed > 0:
            out["samples_per_second"] = self.samples / elapsed
            out["steps_per_second"] = self.steps / elapsed
            out["step_time"] = elapsed / self.steps
            if self.tokens > 0:
                tps = self.tokens / elapsed
                out["tokens_per_second"] = tps
                trained = int(self.trained_tokens)  # the one read of a device count: at the log step
                if trained > 0:
                    out["trained_tokens_per_second"] = trained / elapsed
                per_device = tps / num_devices
                if num_devices > 1:
                    out["tokens_per_second_per_device"] = per_device
                if flops_per_token:
                    out["tflops_per_device"] = per_device * flops_per_token / 1e12
                    if peak_flops:
                        out["mfu"] = mfu(per_device, flops_per_token, peak_flops)
        if reset:
            self.reset()
        return out


class TokenCounter:
    """PaddleNLP's ``count_trained_tokens``: this rank's ``input_ids`` tokens, all and those that are not
    ``pad_token_id``. The non-pad count is summed on the device and read only by :meth:`totals`."""

    def __init__(self, pad_token_id: int) -> None:
        self.pad_token_id = pad_token_id
        self._effective = paddle.zeros([], dtype="int64")
        self._all = 0

    def update(self, micro_batches: Sequence[Any]) -> None:
        for batch in micro_batches:
            ids = batch.get("input_ids") if isinstance(batch, dict) else None
            if ids is None:
                continue
            ids = paddle.to_tensor(ids) if isinstance(ids, np.ndarray) else ids
            self._effective = self._effective + (ids != self.pad_token_id).astype("int64").sum()
            self._all += int(np.prod(ids.shape))

    def totals(self) -> Tuple[int, int]:
        """``(non-pad tokens, all tokens)`` counted so far on this rank (one device read)."""
        return int(self._effective), self._all
