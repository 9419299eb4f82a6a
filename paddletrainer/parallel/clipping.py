"""The gradient clip a user's optimizer brings, applied across the parallel groups as one process applies it.

Paddle clips inside ``optimizer.step()``: with parameter groups, each group's ``grad_clip`` (the optimizer's
own unless the group names another) sees only that group's gradients, so a ``ClipGradByGlobalNorm`` there is a
*per-group* norm. PaddleNLP clips only that way (its Trainer builds ``ClipGradByGlobalNorm(max_grad_norm)`` into
the optimizer it creates; a user's optimizer brings its own clip, or none). Inside ``step()`` on a parallel
layout that clip would see only this rank's gradients (a tp shard, a pipeline stage, a stage-3 slice) and, on
GPU, Paddle swaps in its hybrid clip classes. So :func:`take_gradient_clip` lifts the clip off the optimizer
before the parallel wrappers see it, and :func:`clip_gradients` applies it after the gradient sync, each
group's squares summed over the ranks exactly as the global norm is (every parameter counted once).

Supported: ``ClipGradByGlobalNorm`` (per group, on every layout), ``ClipGradByValue`` (element-wise, the same
on every layout) and ``ClipGradByNorm`` (per tensor) where every gradient is whole on its rank (one process,
plain data parallel). Anything else is refused by name.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional

import paddle
import paddle.distributed as dist
from paddle.nn import ClipGradByGlobalNorm, ClipGradByNorm, ClipGradByValue

from .collectives import _check_group, _scale_in_place, _squares
from ..paddle_contract import optimizer_default_dict, optimizer_grad_clip, optimizer_param_groups

__all__ = ["GradientClip", "take_gradient_clip", "clip_gradients", "clip_named_gradients", "check_gradient_clip", "clip_grad_norm"]

_FILE = "paddletrainer/parallel/clipping.py"  # named by the private reads it makes through paddle_contract

SLICE_PREFIX = "slice@"  # sharding stage 3 names a parameter's local slice "slice@<name>"


@dataclass
class ClipGroup:
    """One parameter group's clip: ``members`` (parameter names; None: every parameter) and the Paddle clip."""

    clip: object
    members: Optional[frozenset] = None


@dataclass
class GradientClip:
    """The clip of an optimizer, per parameter group; ``groups`` empty: nothing is clipped (the norm is still
    measured). ``unclipped``: names of parameters marked ``need_clip = False`` (Paddle leaves them out)."""

    groups: List[ClipGroup] = field(default_factory=list)
    unclipped: frozenset = frozenset()

    @classmethod
    def global_norm(cls, max_norm: Optional[float]) -> "GradientClip":
        """One global-norm clip over every parameter (the Trainer's ``max_grad_norm``); None or <= 0: no clip."""
        if max_norm is None or max_norm <= 0:
            return cls()
        return cls([ClipGroup(ClipGradByGlobalNorm(float(max_norm)))])

    def describe(self) -> str:
        if not self.groups:
            return "no gradient clipping"
        return "; ".join(f"{_describe(g.clip)} over {'all parameters' if g.members is None else f'{len(g.members)} parameters'}"
                         for g in self.groups)


def _describe(clip) -> str:
    if isinstance(clip, ClipGradByGlobalNorm):
        return f"ClipGradByGlobalNorm({clip.clip_norm})"
    if isinstance(clip, ClipGradByValue):
        return f"ClipGradByValue({clip.min}, {clip.max})"
    if isinstance(clip, ClipGradByNorm):
        return f"ClipGradByNorm({clip.clip_norm})"
    return type(clip).__name__


def take_gradient_clip(optimizer) -> GradientClip:
    """Remove the optimizer's ``grad_clip`` (and every group's) and return it as a :class:`GradientClip`.

    Called once, before AMP decoration and the parallel wrappers: afterwards Paddle's ``step()`` clips nothing
    and no wrapper replaces the clip with its own class. Refuses clip classes it cannot apply on every layout.
    """
    own = optimizer_grad_clip(optimizer, _FILE)
    groups, unclipped = [], set()
    param_groups = optimizer_param_groups(optimizer, _FILE)
    if param_groups and isinstance(param_groups[0], dict):
        for group in param_groups:
            clip = group.get("grad_clip", own)
            names = frozenset(p.name for p in group["params"])
            unclipped.update(p.name for p in group["params"] if getattr(p, "need_clip", True) is False)
            if clip is not None:
                groups.append(ClipGroup(_supported(clip), names))
            group["grad_clip"] = None
    else:
        unclipped.update(p.name for p in (optimizer._parameter_list or []) if getattr(p, "need_clip", True) is False)
        if own is not None:
            groups.append(ClipGroup(_supported(own)))
    optimizer._grad_clip = None
    defaults = optimizer_default_dict(optimizer, _FILE)
    if defaults is not None:
        defaults["grad_clip"] = None  # groups added later must not bring the clip back
    return GradientClip(groups, frozenset(unclipped))


def _supported(clip):
    if isinstance(clip, (ClipGradByGlobalNorm, ClipGradByValue, ClipGradByNorm)):
        if isinstance(clip, ClipGradByGlobalNorm) and getattr(clip, "auto_skip_clip", False):
            raise ValueError("grad_clip: ClipGradByGlobalNorm(auto_skip_clip=True) is not supported (it reads the "
                             "norm on the host every step); use auto_skip_clip=False, which gives the same update")
        return clip
    raise ValueError(f"grad_clip: {type(clip).__name__} is not supported; use paddle.nn.ClipGradByGlobalNorm, "
                     "ClipGradByValue or ClipGradByNorm")


def check_gradient_clip(clip: GradientClip, *, whole_gradients: bool) -> None:
    """Refuse ``ClipGradByNorm`` where a rank holds only part of a gradient (tp shards, sharding slices or
    owners, pipeline stages are fine only for whole tensors): its per-tensor norm would be a part's norm."""
    if whole_gradients:
        return
    for group in clip.groups:
        if isinstance(group.clip, ClipGradByNorm):
            raise ValueError("grad_clip: ClipGradByNorm (a per-tensor norm) is supported in one process and plain "
                             "data parallel only; use ClipGradByGlobalNorm on this layout")


def _group_of(name: str, groups: List[ClipGroup]) -> Optional[int]:
    name = name[len(SLICE_PREFIX):] if name.startswith(SLICE_PREFIX) else name
    for index, group in enumerate(groups):
        if group.members is None or name in group.members:
            return index
    return None


def clip_gradients(optimizer, topology, clip: GradientClip, nonfinite=None):
    """Apply ``clip`` to the synchronised gradients of ``optimizer`` (a ``ParallelOptimizer``); return the
    global norm of every gradient before clipping (float32 scalar tensor, unread). Synchronises first unless this
    step's gradients already are; :func:`clip_named_gradients` on the optimizer's ``named_counted_gradients()``.
    """
    optimizer.sync_gradients()
    return clip_named_gradients(optimizer.named_counted_gradients(), topology, clip, nonfinite)


@paddle.no_grad()
def clip_named_gradients(entries, topology, clip: GradientClip, nonfinite=None):
    """Apply ``clip`` to ``entries``, a ``ParallelOptimizer``'s ``named_counted_gradients()`` after its sync;
    return the global norm of every gradient before clipping (float32 scalar tensor, unread).

    The squares of the whole model and of each global-norm group are summed on this rank into one vector and
    added over the hybrid check group with a single all-reduce, so each group's norm equals one process's (a
    group of every parameter uses the whole model's sum).
    ``nonfinite``: as in :func:`~.collectives.global_grad_norm` (poisons every norm on every rank).
    """
    groups = clip.groups
    member = [_group_of(name, groups) if name not in clip.unclipped else None for name, _, _ in entries]
    # each global-norm group's place in the vector of square sums; 0 is the whole model's, which a group of every
    # parameter (the Trainer's max_grad_norm, an optimizer without groups) shares instead of summing them again
    slot = {}
    for index, clip_group in enumerate(groups):
        if isinstance(clip_group.clip, ClipGradByGlobalNorm):
            whole = clip_group.members is None and not clip.unclipped
            slot[index] = 0 if whole else 1 + sum(1 for s in slot.values() if s)
    sums = [[] for _ in range(1 + max(slot.values(), default=0))]
    for (_, grad, counted), index in zip(entries, member):
        if not counted:
            continue
        square = _squares(grad)
        sums[0].append(square)
        if slot.get(index):
            sums[slot[index]].append(square)
    parts = [paddle.add_n(s) if len(s) > 1 else s[0] if s else paddle.zeros([1], "float32") for s in sums]
    vector = parts[0] if len(parts) == 1 else paddle.concat(parts)
    if nonfinite is not None:
        vector = paddle.where(nonfinite.reshape([1]), paddle.full_like(vector, float("inf")), vector)
    group = _check_group(topology)
    if group is not None:
        dist.all_reduce(vector, group=group)
    norms = paddle.sqrt(vector)
    coefs = {}
    for index, clip_group in enumerate(groups):
        if isinstance(clip_group.clip, ClipGradByGlobalNorm):
            limit = paddle.full([], float(clip_group.clip.clip_norm), dtype="float32")
            coefs[index] = limit / paddle.maximum(norms[slot[index]], limit)
    cast_cache = {index: {paddle.float32: coef} for index, coef in coefs.items()}
    for (_, grad, _), index in zip(entries, member):
        if index is None:
            continue
        paddle_clip = groups[index].clip
        if index in coefs:
            _scale_in_place(grad, coefs[index], cast_cache[index])
        elif isinstance(paddle_clip, ClipGradByValue):
            grad.clip_(paddle_clip.min, paddle_clip.max)
        else:  # ClipGradByNorm: whole gradients only (check_gradient_clip)
            limit = float(paddle_clip.clip_norm)
            norm = paddle.sqrt(_squares(grad)).reshape([])
            grad.multiply_((limit / paddle.maximum(norm, paddle.full([], limit, "float32"))).astype(grad.dtype))
    return norms[0]


def clip_grad_norm(model, optimizer, topology, max_norm: float | None, nonfinite=None):
    """Clip the synchronised gradients to ``max_norm`` by global norm; return the pre-clip norm.

    The arithmetic is that of ``paddle.nn.ClipGradByGlobalNorm``: every gradient is multiplied by
    ``max_norm / max(norm, max_norm)`` (so nothing changes when the norm is below ``max_norm``), scaled
    unconditionally rather than after a host read of the norm. ``max_norm`` None or <= 0 only measures. Call before
    ``optimizer.step()``; it is :func:`clip_gradients` with one global-norm group of every parameter.
    ``model`` is accepted for symmetry with the training step; the optimizer knows the parameters.
    ``nonfinite``: see :func:`~.collectives.global_grad_norm`.
    """
    del model
    return clip_gradients(optimizer, topology, GradientClip.global_norm(max_norm), nonfinite)
