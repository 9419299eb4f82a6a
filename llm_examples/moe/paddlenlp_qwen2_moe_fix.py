"""Make PaddleNLP 3.0.0b4's Qwen2-MoE run, with true gradients, under Paddle 3.3.1: two methods of
``paddlenlp.transformers.moe_gate.PretrainedMoEGate`` replaced in memory by :func:`install` (nothing in
site-packages is edited).

1. ``_priority`` fails (``moe_gate.py:239``). It computes ``paddle.cumsum(expert_mask, axis=0) * expert_mask
   - 1`` on an int32 one-hot mask; Paddle 3.3.1's ``cumsum`` of int32 returns int64 and Paddle 3.x refuses
   to multiply int64 by int32 ("Type promotion only support calculations between floating-point numbers
   ... x: int64, y: int32"). Every Qwen2-MoE forward goes through it (the dropless gate computes each
   token's slot in its expert's buffer there), on any device. :func:`priority` computes the same dispatch
   mask (each token's slot among the tokens routed to the same expert, all first choices before all second
   choices; slots at or beyond ``capacity`` dropped) with every integer in int64 and returns it as int32,
   the dtype of the original.

2. ``topkgating`` leaks a gradient (``moe_gate.py:574``). It returns ``dispatch_mask =
   combine_weights.cast(paddle.bool)`` without ``stop_gradient`` (its ``top1gating`` has ``.detach()`` there,
   ``top2gating`` and ``topkgating`` do not), and ``MoELayer.forward`` casts that mask back to float and
   multiplies the tokens by it (``moe_layer.py:257``). Paddle 3.3.1 differentiates a float -> bool -> float
   cast: the backward casts the incoming gradient to bool and back, i.e. 1.0 wherever it is nonzero. So the
   router receives a constant +1 per (token, routed expert, slot) that is no gradient of the loss, is
   larger than the true gradient on a tiny model and does not scale with the loss. It reaches the gate and
   every parameter upstream of the last MoE layer's gate; under expert parallel (each rank's loss a mean
   over its own tokens, the dense gradients averaged over ranks) it shrinks by 1/ep relative to one process,
   which is the "0.5x" of issue #29 (see docs/paddlenlp_compat.md). :func:`topkgating` returns PaddleNLP's
   result with the dispatch mask detached; the router keeps its true gradient through the combine weights.

Why the checks: the fix replaces PaddleNLP's methods, so it must only replace the methods it was written
against. :func:`check_expected_paddlenlp` compares each method's source with its PaddleNLP 3.0.0b4
fingerprint and raises (naming this file) on any other version, so an upgrade that fixed or changed them is
not silently overridden.
"""
from __future__ import annotations

import hashlib
import inspect

import paddle
import paddle.nn.functional as F

__all__ = ["priority", "topkgating", "install", "uninstall", "is_installed", "check_expected_paddlenlp",
           "EXPECTED_SOURCE_SHA256"]

THIS_FILE = "llm_examples/moe/paddlenlp_qwen2_moe_fix.py"
# sha256 of inspect.getsource(PretrainedMoEGate.<name>) in PaddleNLP 3.0.0b4: the methods this file replaces.
EXPECTED_SOURCE_SHA256 = {
    "_priority": "4af00db5d1cd6ec459dbef4222c05b4b9f333f92a67df0eb60d4140322387e00",
    "topkgating": "6849d2d86a54d1daf0ef918808c379a65823baeff442cd4ee8d9b7f438899649",
}
# PaddleNLP's own methods, kept by install() (topkgating calls the original).
_ORIGINALS = {}


def priority(self, topk_idx: paddle.Tensor, capacity: int) -> paddle.Tensor:
    """``[tokens, experts, capacity]`` int32 one-hot of each token's slot in each expert it routes to.

    ``topk_idx`` is ``[tokens, top_k]`` (expert ids). Slots are given in the order "every token's 1st choice,
    then every token's 2nd choice, ...", each expert counting its own tokens from 0; a slot ``>= capacity``
    (a dropped token) and an expert a token does not route to get an all-zero row.
    """
    tokens, top_k = int(topk_idx.shape[0]), int(topk_idx.shape[1])
    choice_major = paddle.transpose(topk_idx, [1, 0]).reshape([-1])  # [top_k * tokens]
    routed = F.one_hot(choice_major, self.num_experts).astype("int64")  # [top_k * tokens, experts]
    # running count per expert, minus one where routed; -1 where not routed (all integers in int64)
    slot = (paddle.cumsum(routed, axis=0) - 1) * routed - (1 - routed)
    # a token routes to an expert in at most one of its choices: the max over choices is that slot (or -1)
    slot = slot.reshape([top_k, tokens, self.num_experts]).max(axis=0)  # [tokens, experts]
    kept = paddle.logical_and(slot >= 0, slot < capacity)
    one_hot = F.one_hot(paddle.where(kept, slot, paddle.zeros_like(slot)), capacity).astype("int64")
    return (one_hot * kept.astype("int64").unsqueeze(-1)).astype("int32")


def topkgating(self, gates: paddle.Tensor):
    """PaddleNLP's ``topkgating`` with its dispatch mask (third result) detached: the mask only selects
    tokens, so no gradient may flow through it (see module, item 2)."""
    capacity, combine_weights, dispatch_mask, exp_counts, l_aux, l_zloss = _ORIGINALS["topkgating"](self, gates)
    return capacity, combine_weights, dispatch_mask.detach(), exp_counts, l_aux, l_zloss


_REPLACEMENTS = {"_priority": priority, "topkgating": topkgating}


def _gate_class():
    from paddlenlp.transformers.moe_gate import PretrainedMoEGate

    return PretrainedMoEGate


def _source_sha256(func) -> str:
    return hashlib.sha256(inspect.getsource(func).encode()).hexdigest()


def is_installed() -> bool:
    """True once :func:`install` replaced both methods of ``PretrainedMoEGate`` in this process."""
    gate = _gate_class()
    return all(getattr(gate, name) is fix for name, fix in _REPLACEMENTS.items())


def check_expected_paddlenlp() -> None:
    """Raise ``RuntimeError`` unless each method not yet replaced is PaddleNLP 3.0.0b4's (the one fixed here)."""
    gate = _gate_class()
    for name, fix in _REPLACEMENTS.items():
        current = getattr(gate, name)
        if current is fix:
            continue
        found = _source_sha256(current)
        if found != EXPECTED_SOURCE_SHA256[name]:
            import paddlenlp

            raise RuntimeError(
                f"{THIS_FILE}: paddlenlp.transformers.moe_gate.PretrainedMoEGate.{name} is not the PaddleNLP "
                f"3.0.0b4 method this fix replaces (installed PaddleNLP {paddlenlp.__version__}, source sha256 "
                f"{found[:12]}); check whether the fix is still needed before updating EXPECTED_SOURCE_SHA256")


def install() -> None:
    """Replace ``PretrainedMoEGate._priority`` and ``.topkgating`` (idempotent), after checking both are the
    methods this fix was written for."""
    check_expected_paddlenlp()
    gate = _gate_class()
    for name, fix in _REPLACEMENTS.items():
        if getattr(gate, name) is not fix:
            _ORIGINALS[name] = getattr(gate, name)
            setattr(gate, name, fix)


def uninstall() -> None:
    """Put PaddleNLP's own methods back (tests compare the model with and without the fix)."""
    gate = _gate_class()
    for name, original in _ORIGINALS.items():
        setattr(gate, name, original)
