"""Packed sequences' document masks in PaddleNLP's Llama and Qwen2 where Paddle has no FlashMask kernel.

PaddleNLP 3.0.0b4's zero-padding data packs several documents into one row, with ``position_ids`` restarting per
document and the document mask as either FlashMask's ``attn_mask_startend_row_indices`` or a block-diagonal
``attention_mask``. Off a CUDA device neither reaches the attention as a mask everywhere:

* without ``use_flash_attention`` the models' math attention (``scaled_dot_product_attention`` of
  ``llama/modeling.py`` and ``qwen2/modeling.py``) ignores ``attn_mask_startend_row_indices`` and attends
  causally across documents;
* with it, ``fusion_ops.fusion_flash_attention`` calls ``flashmask_attention`` (a GPU kernel only) for the
  indices, and Paddle's CPU ``scaled_dot_product_attention`` drops a 4-D ``attention_mask``;
* under context parallel ``RingFlashAttention`` takes no mask at all.

:func:`install_packed_attention` wraps each attention layer's ``attn_func`` (the function the layer calls, with
the same arguments): a call with document ends runs :class:`.flashmask.FlashMaskAttention` (or, under cp, the ring
attention with the document mask), a flash-path call with a 4-D additive mask runs math attention with that mask,
and every other call goes to PaddleNLP's function unchanged. The output then takes PaddleNLP's own last steps (the
sep reshard back to the local sequence, the sequence-parallel or ``[b, s, h·d]`` reshape).

Under sep PaddleNLP's Llama applies rope at the sequence index (``arange(seq_length)``), which equals rope at the
batch's ``position_ids`` only where a query and every key it sees have the same ``position - index``: packed
documents do, preference rows (the rejected response's positions restart after the prompt, which it sees) do not.
For those the sequence cut keeps ``position_ids`` whole (``sequence_cut.documents_of_batch``); a forward pre-hook
on the attention layer notes them for the call in progress, and the wrapper turns q and k by rope at
``position - index`` before attending (rope at ``a`` then at ``b`` is rope at ``a + b``, from the layer's own
cos/sin table). Installed per model,
only where tensors are not on a CUDA device (GPU builds keep PaddleNLP's kernels), undone by
:func:`remove_packed_attention`; :func:`assumptions` fails if PaddleNLP changes what the wrapper relies on.
"""
from __future__ import annotations

import inspect
import math
import sys
import threading

import paddle
import paddle.nn.functional as F

from ..device import on_cuda_device
from .cpu.paddle_checks import Assumption
from .flashmask import flashmask_attention
from .ring_attention import RingAttention

__all__ = ["ATTENTION_LAYERS", "assumptions", "install_packed_attention", "remove_packed_attention"]

# PaddleNLP's attention layers whose ``attn_func`` the wrapper takes, by class name, and the module defining it
ATTENTION_LAYERS = {"LlamaAttention": "paddlenlp.transformers.llama.modeling",
                    "Qwen2Attention": "paddlenlp.transformers.qwen2.modeling"}
# the arguments of each module's scaled_dot_product_attention the wrapper reads by name
_READ = ("query_states", "config", "key_states", "value_states", "attention_mask", "output_attentions",
         "attn_mask_startend_row_indices", "sequence_parallel")
_ORIGINAL = "_paddletrainer_original_attn_func"
_HOOKS = "_paddletrainer_position_hooks"
_CALL = threading.local()  # .positions: (whole position_ids, rotary layer, rotate_half) of the attention call running


def _dense_masked_attention(query, key, value, additive_mask):
    """Math attention with an additive ``[b, 1, s, s]`` mask (``[b, s, h, d]`` in and out; GQA repeated)."""
    groups = query.shape[2] // key.shape[2]
    q, k, v = (paddle.transpose(t, [0, 2, 1, 3]) for t in (query, key, value))
    if groups > 1:
        k, v = (paddle.repeat_interleave(t, groups, axis=1) for t in (k, v))
    scores = paddle.matmul(q, k, transpose_y=True) * (1.0 / math.sqrt(query.shape[-1]))
    with paddle.amp.auto_cast(False):
        probs = F.softmax(scores.astype("float32") + additive_mask.astype("float32"), axis=-1)
    return paddle.transpose(paddle.matmul(probs.astype(q.dtype), v), [0, 2, 1, 3])


def _finish(out, arguments):
    """PaddleNLP's last steps of its attention functions: sep's reshard back to this rank's sequence, then the
    sequence-parallel ``[b·s, h·d]`` or the ``[b, s, h·d]`` shape; ``(out, None)`` when attentions are asked."""
    reshard = arguments.get("reshard_layer")
    if reshard is not None:
        out = reshard(out, split_axis=1, concat_axis=2)
    batch, length = out.shape[0], out.shape[1]
    out = out.reshape([batch * length, -1] if arguments.get("sequence_parallel") else [batch, length, -1])
    return (out, None) if arguments.get("output_attentions") else out


def _documents_attention(arguments, ends):
    query, key, value = (arguments[name] for name in ("query_states", "key_states", "value_states"))
    config = arguments["config"]
    if getattr(config, "context_parallel_degree", 1) > 1:
        return RingAttention.apply(query, key, value, is_causal=True, startend_row_indices=ends)
    return flashmask_attention(query, key, value, ends)


def _note_whole_positions(layer, args, kwargs):
    """Forward pre-hook: ``position_ids`` of the whole sequence (kept whole by the sep cut) noted for this call."""
    positions = inspect.signature(layer.forward).bind(*args, **kwargs).arguments.get("position_ids")
    whole = (getattr(layer, "reshard_layer", None) is not None and positions is not None
             and int(positions.shape[-1]) == int(layer.config.seq_length))
    if whole and (layer.config.use_fused_rope or layer.config.use_long_sequence_strategies or not layer.config.rope):
        raise ValueError("sep_parallel_degree: position_ids that restart inside what a token attends to need the "
                         "model's plain rope (rope=True, use_fused_rope=False, use_long_sequence_strategies=False)")
    module = sys.modules[type(layer).__module__]
    _CALL.positions = (positions, layer.rotary_emb, module.rotate_half) if whole else None


def _forget_positions(layer, args, output):
    _CALL.positions = None


def _turned_to_positions(query, key, value, noted):
    """``query``/``key`` (``[b, s, h, d]``, rope at the index) turned by rope at ``position - index``."""
    positions, rotary, rotate_half = noted
    length = query.shape[1]
    shift = positions.reshape([-1, length]).astype("int64") - paddle.arange(length, dtype="int64").unsqueeze(0)
    cos_table, sin_table = (t.reshape([t.shape[1], t.shape[-1]]) for t in rotary(value, seq_len=length))
    cos = paddle.gather(cos_table, shift.abs().reshape([-1])).reshape([shift.shape[0], length, 1, -1])
    sin = paddle.gather(sin_table, shift.abs().reshape([-1])).reshape([shift.shape[0], length, 1, -1])
    sin = sin * paddle.sign(shift.astype(sin.dtype)).unsqueeze([2, 3])  # sin(-x) = -sin(x)
    return tuple(t * cos + rotate_half(t) * sin for t in (query, key))


def _packed_attn_func(original):
    """``original`` (a layer's ``attn_func``) with the packed-sequence cases computed here (see module)."""
    signature = inspect.signature(original)

    def attn_func(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        arguments = bound.arguments
        noted = getattr(_CALL, "positions", None)
        if noted is not None and arguments.get("reshard_layer") is not None:
            arguments["query_states"], arguments["key_states"] = _turned_to_positions(
                arguments["query_states"], arguments["key_states"], arguments["value_states"], noted)
            args, kwargs = bound.args, bound.kwargs
        ends = arguments.get("attn_mask_startend_row_indices")
        if ends is not None:
            return _finish(_documents_attention(arguments, ends), arguments)
        mask = arguments.get("attention_mask")
        if mask is not None and getattr(arguments["config"], "use_flash_attention", False):
            out = _dense_masked_attention(arguments["query_states"], arguments["key_states"],
                                          arguments["value_states"], mask)
            return _finish(out, arguments)
        return original(*args, **kwargs)

    attn_func.__wrapped_paddlenlp__ = original
    return attn_func


def _attention_layers(model):
    return [layer for layer in model.sublayers(include_self=True)
            if type(layer).__name__ in ATTENTION_LAYERS and hasattr(layer, "attn_func")]


def install_packed_attention(model) -> int:
    """Wrap every PaddleNLP Llama/Qwen2 attention layer of ``model`` (see module) unless tensors go to a CUDA
    device; returns how many layers were wrapped (0 on a CUDA device, idempotent)."""
    if on_cuda_device():
        return 0
    count = 0
    for layer in _attention_layers(model):
        if getattr(layer, _ORIGINAL, None) is None:
            setattr(layer, _ORIGINAL, layer.attn_func)
            layer.attn_func = _packed_attn_func(layer.attn_func)
            setattr(layer, _HOOKS, (layer.register_forward_pre_hook(_note_whole_positions, with_kwargs=True),
                                    layer.register_forward_post_hook(_forget_positions)))
        count += 1
    return count


def remove_packed_attention(model) -> None:
    """Give every layer :func:`install_packed_attention` wrapped its PaddleNLP ``attn_func`` back."""
    for layer in _attention_layers(model):
        original = getattr(layer, _ORIGINAL, None)
        if original is not None:
            layer.attn_func = original
            setattr(layer, _ORIGINAL, None)
            for hook in getattr(layer, _HOOKS, ()):
                hook.remove()
            setattr(layer, _HOOKS, ())


def assumptions() -> list:
    """What the wrapper relies on in PaddleNLP, for its modules already imported (a model of theirs exists only
    then, so a run without one pays no PaddleNLP import for this check): each module's attention function takes
    the arguments the wrapper reads by name, the layers call it through ``self.attn_func``, Llama's sep path
    applies rope at the index with ``rotary_emb``'s table, and Llama's flash path
    sends the document ends to ``flashmask_attention`` and its cp path to ``RingFlashAttention`` (the calls
    replaced here)."""
    found = []
    for layer, module in ATTENTION_LAYERS.items():
        if module not in sys.modules:
            continue
        found.append(Assumption(
            lambda module=module: set(_READ) <= set(inspect.signature(sys.modules[module].scaled_dot_product_attention)
                                                    .parameters),
            f"{module}.scaled_dot_product_attention no longer takes {', '.join(_READ)}"))
        found.append(Assumption(
            lambda layer=layer, module=module: "self.attn_func = scaled_dot_product_attention"
            in inspect.getsource(getattr(sys.modules[module], layer).__init__),
            f"{module}.{layer} no longer calls scaled_dot_product_attention through self.attn_func"))
    llama = ATTENTION_LAYERS["LlamaAttention"]
    if llama in sys.modules:
        found.append(Assumption(
            lambda: callable(getattr(sys.modules[llama], "rotate_half", None)) and all(
                line in inspect.getsource(sys.modules[llama].LlamaAttention.forward)
                for line in ("position_ids = paddle.arange(seq_length",
                             "self.rotary_emb(value_states, seq_len=kv_seq_len)",
                             "apply_rotary_pos_emb(query_states, key_states, cos, sin, position_ids)")),
            f"{llama}.LlamaAttention.forward no longer applies rope at arange(seq_length) under sep with "
            f"self.rotary_emb's table and rotate_half (the turn to whole position_ids relies on it)"))
    fusion = "paddlenlp.transformers.llama.fusion_ops"
    if fusion in sys.modules:
        found.append(Assumption(
            lambda: all(call in inspect.getsource(sys.modules[fusion])
                        for call in ("F.flashmask_attention", "RingFlashAttention.apply", "reshard_layer(")),
            f"{fusion}.fusion_flash_attention no longer calls flashmask_attention, RingFlashAttention.apply and the "
            f"sep reshard_layer"))
    return found
