"""``optim="adamw"``: :class:`AdamW`, Paddle's AdamW, bit-identical in results and state, whose dygraph step skips
Paddle's per-parameter Python (see the class)."""
from __future__ import annotations

from typing import List, Optional

import paddle
from paddle import _C_ops
from paddle.base import framework
from paddle.base.layer_helper import LayerHelper
from paddle.distributed.auto_parallel.auto_dp_utils import in_auto_dp_mode
from paddle.distributed.auto_parallel.fully_shard_fusion import get_fsdp_context
from paddle.optimizer import optimizer as _paddle_optimizer

from ..paddle_contract import auto_sharded

__all__ = ["AdamW"]


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
        if (getattr(param, "regularizer", None) is not None or auto_sharded(param)
                or not isinstance(param_lr, (int, float)) or param_lr != 1.0
                or (self._multi_precision and self._is_dtype_fp16_or_bf16(param.dtype))):
            return None
        decays = self._apply_decay_param_fun
        return decays is None or bool(decays(param.name))

