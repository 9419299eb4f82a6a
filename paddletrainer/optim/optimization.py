"""Optimizer construction (``create_optimizer``: the ``optim`` name → a Paddle optimizer over the trainable
parameters) and the weight-decay selection it applies (``no_decay_parameter_names``).

The LR schedules live in :mod:`.schedules` and ``optim="adamw"``'s optimizer in :mod:`.adamw`; both are
re-exported here, so ``paddletrainer.optim.optimization.get_scheduler`` / ``.AdamW`` keep importing.
"""
from __future__ import annotations

from typing import Iterable, List, Optional

import paddle

from ..trainer_utils import OptimizerNames
from .adamw import AdamW
from .schedules import (
    constant_factor,
    constant_with_warmup_factor,
    cosine_factor,
    get_scheduler,
    linear_factor,
    polynomial_factor,
    schedule_factor_fn,
)

__all__ = ["create_optimizer", "no_decay_parameter_names", "STAGE3_SLICE_PREFIX", "AdamW", "get_scheduler",
           "schedule_factor_fn", "constant_factor", "constant_with_warmup_factor", "linear_factor", "cosine_factor",
           "polynomial_factor"]

# GroupShardedStage3's name for the stand-in parameter holding a sliced parameter's local slice.
STAGE3_SLICE_PREFIX = "slice@"


def no_decay_parameter_names(model: paddle.nn.Layer) -> set:
    """Names (``param.name``) of parameters that weight decay must skip: biases and normalisation weights.

    Decaying a norm's scale or a bias pulls it toward 0, which is not regularisation but damage; every
    reference trainer excludes them. A layer counts as a norm when its class name contains "Norm"
    (LayerNorm, RMSNorm, BatchNorm, GroupNorm and the fused/parallel variants alike).
    """
    skip = set()
    for _, layer in model.named_sublayers(include_self=True):
        is_norm = "norm" in type(layer).__name__.lower()
        for pname, param in layer.named_parameters(include_sublayers=False):
            if is_norm or pname.endswith("bias") or pname == "b_0":
                skip.add(param.name)
    return skip


def _optimizer_class(name: str):
    """The Paddle optimizer class and the keyword names it takes, for an ``optim`` value."""
    name = OptimizerNames(name).value
    table = {
        "adamw": AdamW,
        "adam": paddle.optimizer.Adam,
        "sgd": paddle.optimizer.SGD,
        "momentum": paddle.optimizer.Momentum,
        "lamb": paddle.optimizer.Lamb,
        "adamax": paddle.optimizer.Adamax,
    }
    if name not in table:
        raise ValueError(f"optim={name!r} is not supported; valid: {', '.join(sorted(table))}")
    return name, table[name]


def create_optimizer(
    model: paddle.nn.Layer,
    lr_scheduler,
    *,
    optim: str = "adamw",
    weight_decay: float = 0.0,
    adam_beta1: float = 0.9,
    adam_beta2: float = 0.999,
    adam_epsilon: float = 1e-8,
    multi_precision: bool = False,
    parameters: Optional[Iterable] = None,
    grad_clip=None,
    parameter_groups: Optional[List] = None,
) -> paddle.optimizer.Optimizer:
    """Build the optimizer named by ``optim`` over ``model``'s trainable parameters.

    Weight decay is decoupled (AdamW-style) for ``adamw`` and applied to every parameter except biases and
    norm weights; for the other optimizers it is L2 regularisation on the same set. Gradient clipping is
    not attached here: the Trainer clips once, across all parallel groups, before ``step()``.
    ``parameter_groups`` (PaddleNLP's ``set_optimizer_grouped_parameters``): the parameters, or Paddle's
    parameter-group dicts, trained as given, weight decay on every one of them.
    """
    if parameter_groups is not None:
        return _optimizer_over_groups(optim, list(parameter_groups), lr_scheduler, weight_decay, adam_beta1,
                                      adam_beta2, adam_epsilon, multi_precision, grad_clip)
    name, cls = _optimizer_class(optim)
    params: List = [p for p in (parameters if parameters is not None else model.parameters()) if not p.stop_gradient]
    skip = no_decay_parameter_names(model)
    kwargs = dict(learning_rate=lr_scheduler, parameters=params, grad_clip=grad_clip)
    if name in ("adamw", "adam", "lamb"):
        kwargs.update(beta1=adam_beta1, beta2=adam_beta2, epsilon=adam_epsilon)
    if name in ("adamw", "adam", "momentum", "lamb", "sgd"):
        kwargs["multi_precision"] = multi_precision

    def decays(pname: str) -> bool:
        # sharding stage 3 hands the optimizer each sliced parameter's local slice as "slice@<name>"
        return pname.removeprefix(STAGE3_SLICE_PREFIX) not in skip

    if name == "adamw":
        kwargs.update(weight_decay=weight_decay, apply_decay_param_fun=decays)
    elif name == "lamb":
        kwargs.update(lamb_weight_decay=weight_decay, exclude_from_weight_decay_fn=lambda p: not decays(p.name))
    elif weight_decay > 0:
        # Classic optimizers only know a global L2 penalty; give the decayed and skipped params their own groups.
        decay = [p for p in params if p.name not in skip]
        no_decay = [p for p in params if p.name in skip]
        kwargs["parameters"] = [
            {"params": decay, "weight_decay": weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ]
    return cls(**kwargs)


def _optimizer_over_groups(optim, groups, lr_scheduler, weight_decay, beta1, beta2, epsilon, multi_precision,
                           grad_clip):
    """``optim`` over ``groups`` as given, every parameter decayed (PaddleNLP builds it with no
    ``apply_decay_param_fun`` when the parameters were set)."""
    if not groups:
        raise ValueError("set_optimizer_grouped_parameters: the parameter list is empty; pass the parameters "
                         "to train (or None for the model's trainable parameters)")
    name, cls = _optimizer_class(optim)
    kwargs = dict(learning_rate=lr_scheduler, parameters=groups, grad_clip=grad_clip)
    if name in ("adamw", "adam", "lamb"):
        kwargs.update(beta1=beta1, beta2=beta2, epsilon=epsilon)
    if name in ("adamw", "adam", "momentum", "lamb", "sgd"):
        kwargs["multi_precision"] = multi_precision
    if name == "lamb":
        kwargs["lamb_weight_decay"] = weight_decay
    elif name == "adamw" or weight_decay > 0:
        kwargs["weight_decay"] = weight_decay
    return cls(**kwargs)
