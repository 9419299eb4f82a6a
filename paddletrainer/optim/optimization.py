"""Learning-rate schedules and optimizer construction.

Every schedule is a pure *factor* function ``step -> multiplier of the peak learning rate``, wrapped in
``paddle.optimizer.lr.LambdaDecay``. Keeping the math in plain functions makes it testable without Paddle
and lets checkpoints restore a scheduler by its step alone.

Schedules (names as in PaddleNLP's ``lr_scheduler_type``), with ``w`` warmup steps and ``T`` total steps:

    warmup (all but "constant"):  factor = step / w                          for step < w
    linear:       factor = (T - step) / (T - w)                                   -> 0 at T
    cosine:       factor = 0.5 * (1 + cos(pi * 2 * num_cycles * progress))        progress = (step - w) / (T - w)
    polynomial:   lr = (lr0 - lr_end) * (1 - progress) ** power + lr_end        -> lr_end at T
    constant / constant_with_warmup: factor = 1 after warmup

``min_learning_rate`` (0 by default, so PaddleNLP's curves are unchanged) is a floor for linear and cosine:
``lr = min_lr + (lr0 - min_lr) * factor``, the convention of PaddleNLP's LLM pretraining scripts.

``optim="adamw"`` builds :class:`AdamW`: Paddle's AdamW, bit-identical in results and state, whose step skips
Paddle's per-parameter Python (see the class).
"""
from __future__ import annotations

import math
from functools import partial
from typing import Callable, Iterable, List, Optional

import paddle
from paddle import _C_ops
from paddle.base import framework
from paddle.base.layer_helper import LayerHelper
from paddle.distributed.auto_parallel.auto_dp_utils import in_auto_dp_mode
from paddle.distributed.auto_parallel.fully_shard_fusion import get_fsdp_context
from paddle.optimizer import optimizer as _paddle_optimizer

from ..trainer_utils import OptimizerNames, SchedulerType

# GroupShardedStage3's name for the stand-in parameter holding a sliced parameter's local slice.
STAGE3_SLICE_PREFIX = "slice@"


# --------------------------------------------------------------------------------------- schedules
def _warmup(step: int, warmup_steps: int) -> Optional[float]:
    """The linear warmup factor, or None once warmup is over."""
    if step < warmup_steps:
        return float(step) / float(max(1, warmup_steps))
    return None


def _progress(step: int, warmup_steps: int, total_steps: int) -> float:
    """Fraction of the decay phase done, clamped to [0, 1]."""
    return min(1.0, float(step - warmup_steps) / float(max(1, total_steps - warmup_steps)))


def constant_factor(step: int) -> float:
    return 1.0


def constant_with_warmup_factor(step: int, warmup_steps: int) -> float:
    w = _warmup(step, warmup_steps)
    return 1.0 if w is None else w


def linear_factor(step: int, warmup_steps: int, total_steps: int, floor: float = 0.0) -> float:
    w = _warmup(step, warmup_steps)
    if w is not None:
        return w
    decay = max(0.0, 1.0 - _progress(step, warmup_steps, total_steps))
    return floor + (1.0 - floor) * decay


def cosine_factor(step: int, warmup_steps: int, total_steps: int, num_cycles: float = 0.5, floor: float = 0.0) -> float:
    w = _warmup(step, warmup_steps)
    if w is not None:
        return w
    progress = _progress(step, warmup_steps, total_steps)
    decay = max(0.0, 0.5 * (1.0 + math.cos(math.pi * float(num_cycles) * 2.0 * progress)))
    return floor + (1.0 - floor) * decay


def polynomial_factor(step: int, warmup_steps: int, total_steps: int, lr_init: float, lr_end: float, power: float) -> float:
    w = _warmup(step, warmup_steps)
    if w is not None:
        return w
    if step > total_steps:
        return lr_end / lr_init
    remaining = 1.0 - _progress(step, warmup_steps, total_steps)
    return ((lr_init - lr_end) * remaining**power + lr_end) / lr_init


def schedule_factor_fn(
    name: str,
    *,
    learning_rate: float,
    num_warmup_steps: int,
    num_training_steps: int,
    num_cycles: float = 0.5,
    lr_end: float = 1e-7,
    power: float = 1.0,
    min_learning_rate: float = 0.0,
) -> Callable[[int], float]:
    """The factor function of schedule ``name`` (a ``SchedulerType`` value)."""
    name = SchedulerType(name).value
    floor = min_learning_rate / learning_rate if learning_rate > 0 else 0.0
    if name == "constant":
        return constant_factor
    if name == "constant_with_warmup":
        return partial(constant_with_warmup_factor, warmup_steps=num_warmup_steps)
    if name == "linear":
        return partial(linear_factor, warmup_steps=num_warmup_steps, total_steps=num_training_steps, floor=floor)
    if name == "cosine":
        return partial(
            cosine_factor, warmup_steps=num_warmup_steps, total_steps=num_training_steps, num_cycles=num_cycles, floor=floor
        )
    if name == "polynomial":
        if not learning_rate > lr_end:
            raise ValueError(f"lr_end={lr_end} must be smaller than learning_rate={learning_rate} for 'polynomial'")
        return partial(
            polynomial_factor,
            warmup_steps=num_warmup_steps,
            total_steps=num_training_steps,
            lr_init=learning_rate,
            lr_end=lr_end,
            power=power,
        )
    raise ValueError(f"lr_scheduler_type={name!r} has no schedule here")  # unreachable: SchedulerType validated it


def get_scheduler(
    name: str,
    learning_rate: float,
    num_warmup_steps: int = 0,
    num_training_steps: int = 0,
    num_cycles: float = 0.5,
    lr_end: float = 1e-7,
    power: float = 1.0,
    min_learning_rate: float = 0.0,
) -> paddle.optimizer.lr.LRScheduler:
    """Build a Paddle LR scheduler by name (PaddleNLP's ``get_scheduler`` signature, plus ``min_learning_rate``)."""
    factor = schedule_factor_fn(
        name,
        learning_rate=learning_rate,
        num_warmup_steps=num_warmup_steps,
        num_training_steps=num_training_steps,
        num_cycles=num_cycles,
        lr_end=lr_end,
        power=power,
        min_learning_rate=min_learning_rate,
    )
    return paddle.optimizer.lr.LambdaDecay(learning_rate, factor)


# --------------------------------------------------------------------------------------- optimizers
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


class AdamW(paddle.optimizer.AdamW):
    """``paddle.optimizer.AdamW`` with a dygraph ``step`` that skips Paddle's generic per-parameter Python.

    Paddle's ``Optimizer.step`` builds the update through its static-graph-shaped machinery (program guards,
    a regularization pass, four accumulator lookups, a decay check and a learning-rate tensor per parameter,
    then one ``_C_ops.adamw_`` call each). This step makes the very same ``_C_ops.adamw_`` call per parameter
    with the arguments Paddle passes — same kernel, same accumulators and state names, so the results and
    checkpoints are bit-identical on every device — after the same set-up (accumulators created on first use,
    the learning-rate tensor refreshed from the schedule). A parameter's decay choice
    (``apply_decay_param_fun``) is asked once and remembered. Whatever this step does not reproduce takes
    Paddle's own ``step``: parameter groups, ``grad_clip``, regularizers, per-parameter learning rates (a
    Tensor one included), ``lr_ratio``, amsgrad, tensor-valued hyper-parameters, a named optimizer, fused state
    storage or tensor fusion, a parameter carrying ``main_grad``, a ``_param_groups`` that is not the
    ``_parameter_list``, a GradScaler's ``found_inf``, fp16/bf16 parameters with fp32 master weights,
    auto-parallel, to_static.

    Per-parameter facts (the decay choice, a regularizer, ``optimize_attr["learning_rate"]``, a master weight)
    are read at a parameter's first step and cached by parameter name: set them before training starts; a
    change made later is not seen (build a new optimizer instead).
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._direct_facts: dict = {}  # param name -> with_decay, or None: needs Paddle's step

    @paddle.no_grad()
    def step(self) -> None:
        params = self._direct_parameters()
        if params is None:
            return super().step()
        updates = [(p, g) for p, g in ((p, p._grad_ivar()) for p in params) if g is not None]
        # like Paddle: accumulators for the parameters that have a gradient, on first use
        new = [p for p, _ in updates if p.name not in self._already_create_accumulator]
        if new:
            self._create_accumulators(paddle.static.default_main_program().global_block(), new)
        if self.helper is None:  # Paddle's step makes the helper that creates the learning-rate tensor
            self.helper = LayerHelper(self.__class__.__name__)
        self._create_global_learning_rate()
        lr = self._global_learning_rate()
        acc, facts = self._accumulators, self._direct_facts
        m1, m2 = acc[self._moment1_acc_str], acc[self._moment2_acc_str]
        b1, b2 = acc[self._beta1_pow_acc_str], acc[self._beta2_pow_acc_str]
        for param, grad in updates:
            if not param._is_initialized():
                continue
            key = param.name
            _C_ops.adamw_(param, grad, lr, m1[key], m2[key], None, b1[key], b2[key], None, None,
                          self._beta1, self._beta2, self._epsilon, 1.0, self._weight_decay,
                          facts[key], self._lazy_mode, 1000, False, False, False)
        paddle.base.core._set_warmup(False)  # as at the end of Paddle's optimization pass

    def _direct_parameters(self) -> Optional[List]:
        """The trainable parameters when this step reproduces Paddle's dygraph AdamW exactly, else None."""
        params, groups = self._parameter_list, self._param_groups
        # Paddle 3.3.1's AdamW.step reads _parameter_list and _grad_ivar() only, Optimizer.step reads _param_groups
        # and main_grad: where those could differ (stage 3 reassigns _parameter_list alone, mixed precision and
        # tensor fusion keep the gradient in main_grad), Paddle's own step decides.
        if (not params or isinstance(params[0], dict) or not framework.in_dygraph_mode()
                or paddle.base.dygraph.base.in_to_static_mode() or _paddle_optimizer.g_shard_bypass_dygraph_optimizer
                or self._grad_clip is not None or self.regularization is not None or self._lr_ratio is not None
                or self._amsgrad or self._name is not None or self._use_fusion_storage
                or getattr(self, "enable_tensor_fusion", False)
                or self._get_auxiliary_var("found_inf") is not None
                or not all(isinstance(v, float) for v in (self._beta1, self._beta2, self._epsilon, self._weight_decay))
                or not isinstance(self._learning_rate, (float, paddle.optimizer.lr.LRScheduler))
                or in_auto_dp_mode() or get_fsdp_context() is not None):
            return None
        if groups is not params and (len(groups) != len(params) or any(a is not b for a, b in zip(groups, params))):
            return None
        trainable = [p for p in params if not p.stop_gradient]
        facts = self._direct_facts
        for param in trainable:
            if param.name not in facts:
                facts[param.name] = self._param_facts(param)
            if facts[param.name] is None:
                return None
        if any(hasattr(p, "main_grad") and p.main_grad is not None for p in trainable):  # set per step, not cached
            return None
        return trainable

    def _param_facts(self, param):
        """``with_decay`` as Paddle's ``_append_optimize_op`` decides it, or None when the parameter carries
        something only Paddle's step applies: a regularizer, its own learning rate, auto-sharding, or an fp32
        master weight (fp16/bf16 under ``multi_precision``: Paddle's CPU build has no fp16/bf16 AdamW kernel, so
        that path cannot be checked here and stays Paddle's). A Tensor learning rate is that parameter's learning
        rate itself in Paddle (``_create_param_lr``), whatever its value: only the number 1 means the global one."""
        param_lr = (getattr(param, "optimize_attr", None) or {}).get("learning_rate", 1.0)
        if (getattr(param, "regularizer", None) is not None or hasattr(param, "_need_shard_auto")
                or not isinstance(param_lr, (int, float)) or param_lr != 1.0
                or (self._multi_precision and self._is_dtype_fp16_or_bf16(param.dtype))):
            return None
        decays = self._apply_decay_param_fun
        return decays is None or bool(decays(param.name))


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
) -> paddle.optimizer.Optimizer:
    """Build the optimizer named by ``optim`` over ``model``'s trainable parameters.

    Weight decay is decoupled (AdamW-style) for ``adamw`` and applied to every parameter except biases and
    norm weights; for the other optimizers it is L2 regularisation on the same set. Gradient clipping is
    not attached here: the Trainer clips once, across all parallel groups, before ``step()``.
    """
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
