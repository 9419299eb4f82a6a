"""Non-finite gradients in one optimizer step: unscaling, the one step-or-skip decision, the loss-scale update.

Why the Trainer does not call ``GradScaler.unscale_``/``step`` directly: Paddle's scaler checks only the
gradients of the rank it runs on, and only those in the optimizer's parameter list, before the parallel
wrappers have synchronised them. Under tp/pp/sharding some ranks would then skip a step others take, and the
loss scales would drift apart; under sharding stage 3 the slice gradients (filled in during the
synchronisation) would be stepped still scaled. So the order here is:

1. gradients are synchronised (``ParallelOptimizer.sync_gradients``);
2. :func:`unscale_gradients` divides every gradient this rank holds by the loss scale with the kernel
   ``GradScaler.unscale_`` uses (``check_finite_and_unscale``) and returns this rank's inf/NaN flag;
3. the global gradient norm folds that flag in before its reduction over tp, pp and sharding, so a
   non-finite norm — the same value on every rank — means "some gradient somewhere is non-finite";
4. :func:`nonfinite_action` turns that one value into STEP, SKIP or RAISE, identically on every rank;
5. :func:`update_loss_scale` runs Paddle's dynamic update (halve on overflow, grow after
   ``incr_every_n_steps`` good steps) with that global verdict.

A skipped step does not advance the learning-rate schedule (PaddleNLP's behaviour); the Trainer counts it in
``state.skipped_steps`` and logs it next to the loss scale (:func:`scaler_logs`).

Host reads (:class:`NonfiniteGuard`). Step 4 needs the verdict on the host only when the host must act on it
before the next update. Under the default ``nan_inf_policy="error"`` without a loss scaler it need not: the
run is going to stop, so the verdict stays on the device (the norms of the unchecked steps, folded into the first
non-finite step and its norm) and is read at the next logging, evaluation or save step and at the end of
``train()``, which then raise — before anything is evaluated or saved, and with the trainer state set back to
where it was after the last step whose gradients were finite (``global_step``, ``consumed_samples``, ``epoch``:
a ``save_state`` or checkpoint written after the error names that step and its data position). The updates in
between are applied and non-finite; they are discarded with the run. ``skip``, ``rollback`` and an fp16 loss
scaler read the verdict every step: a skip must leave weights, optimizer moments and the LR schedule untouched,
and Paddle's dygraph optimizers decide ``found_inf`` on the host themselves (``Optimizer._apply_optimize`` tests
``if found_inf:``; ``adamw_`` gets ``found_inf`` only under PIR), so a read-free skip would need our own
optimizer kernels.
"""
from __future__ import annotations

import math
from array import array
from collections import defaultdict
from typing import Dict, Optional

import paddle
from paddle import _legacy_C_ops

from ..errors import NonFiniteLossError
from ..paddle_contract import delays_loss_scaling

__all__ = ["STEP", "SKIP", "RAISE", "NonfiniteGuard", "nonfinite_action", "unscale_gradients", "update_loss_scale", "loss_scale",
           "scaler_logs", "delayed_loss_divisor"]

STEP, SKIP, RAISE = "step", "skip", "raise"
_NO_STEP = 2**62  # "no non-finite step" in the fold's minimum over step numbers


def nonfinite_action(norm_is_finite: bool, policy: str, scaler=None) -> str:
    """What this step does, from the global gradient norm: the single place ``nan_inf_policy`` is applied.

    * finite norm: STEP.
    * fp16 loss scaler with a scale above 1: SKIP under every policy. Scaled fp16 gradients overflow by
      design now and then; the scaler halves the scale and training goes on (PaddleNLP's behaviour).
    * otherwise (no scaler, or the scale is already <= 1, so scaling cannot be the cause): the policy
      decides — ``skip`` → SKIP, ``error`` → RAISE.

    The loss scale is read from the device only when the norm is non-finite.
    """
    if norm_is_finite:
        return STEP
    if scaler is not None and loss_scale(scaler) > 1.0:
        return SKIP
    if policy == "skip":
        return SKIP
    if policy in ("error", "rollback"):  # rollback: the Trainer's loop catches the error (see rollback.py)
        return RAISE
    raise ValueError(f"nan_inf_policy={policy!r} is not valid; choose one of: error, skip, rollback")


def _error_message(step: int, norm) -> str:
    return (f"step {step}: gradient norm is {norm} (loss or grads are NaN/inf); "
            "set nan_inf_policy='skip' to skip such steps")


class NonfiniteGuard:
    """Applies :func:`nonfinite_action` to each step's global norm, reading it on the host only when needed.

    ``reads_every_step`` is False for ``nan_inf_policy="error"`` without a loss scaler (the default): then
    :meth:`decide` keeps the step's norm, unread, and always says STEP, and :meth:`raise_if_seen` (called by
    the Trainer at logging/evaluation/save steps and at the end) looks at the norms kept since the last check;
    see the module docstring. A step costs no device op: the kept norms are folded into a device record of the
    first non-finite step and its norm only every ``FOLD_EVERY`` steps (about 15 small ops) and at the check, so
    at most ``FOLD_EVERY`` scalar tensors are held. To set the state back to the step before the first
    non-finite one, :meth:`decide` also keeps the state's data position before each step since the last check
    (host values, 16 bytes a step; no device read).
    """

    FOLD_EVERY = 32

    def __init__(self, policy: str, scaler=None):
        nonfinite_action(False, policy, None)  # validates the policy name
        self.policy = policy
        self.scaler = scaler
        self.reads_every_step = scaler is not None or policy != "error"
        self._first_step = None  # int64 [] on the device: the first step with a non-finite norm, -1 for none
        self._first_norm = None
        self._pending = []  # the norms (unread) of the last unchecked steps, not yet folded
        # the unchecked steps: the first one's number and, per step, consumed_samples / epoch (NaN: None) before it
        self._unchecked_from = None
        self._consumed_before = array("q")
        self._epoch_before = array("d")

    @paddle.no_grad()
    def decide(self, norm: paddle.Tensor, state) -> str:
        """STEP or SKIP for the step after ``state.global_step`` (the ``TrainerState`` before the step counts it),
        whose global gradient norm is ``norm``; raises for RAISE."""
        step = state.global_step + 1
        if not self.reads_every_step:
            self._remember_position(step, state)
            self._pending.append(norm)
            if len(self._pending) >= self.FOLD_EVERY:
                self._fold()
            return STEP
        value = float(norm)  # the one read per step of skip / rollback / fp16
        action = nonfinite_action(math.isfinite(value), self.policy, self.scaler)
        if action == RAISE:
            raise NonFiniteLossError(_error_message(step, value))
        return action

    def raise_if_seen(self, state) -> None:
        """Raise :class:`NonFiniteLossError` if a step since the last call had a non-finite norm (one host read).

        The state is first set back to where it stood before that step (``global_step``, ``consumed_samples``,
        ``epoch``): the later updates were non-finite.
        """
        self._fold()
        if self._first_step is None:
            return
        step = int(self._first_step)
        if step < 0:
            self._forget_positions()
            return
        norm = float(self._first_norm)
        self._first_step = None
        index = step - self._unchecked_from
        epoch = self._epoch_before[index]
        state.global_step = step - 1
        state.consumed_samples = int(self._consumed_before[index])
        state.epoch = None if math.isnan(epoch) else epoch
        self._forget_positions()
        raise NonFiniteLossError(_error_message(step, norm))

    @paddle.no_grad()
    def _fold(self) -> None:
        """Fold the kept norms into the device record (first non-finite step, its norm); nothing is read."""
        if not self._pending:
            return
        if self._first_step is None:
            self._first_step = paddle.full([], -1, dtype="int64")
            self._first_norm = paddle.zeros([], dtype="float32")
        norms = paddle.stack(self._pending)
        # the kept norms are those of the last unchecked steps, whose positions are remembered one per step
        last = self._unchecked_from + len(self._consumed_before)
        steps = paddle.arange(last - len(self._pending), last, dtype="int64")
        no_step = paddle.full_like(steps, _NO_STEP)
        first = paddle.where(paddle.isfinite(norms), no_step, steps).min()  # _NO_STEP when every norm is finite
        newly = paddle.logical_and(first < _NO_STEP, self._first_step < 0)
        # the norm of step `first` (steps are distinct: the sum has one term, NaN and inf included)
        first_norm = paddle.where(steps == first, norms, paddle.zeros_like(norms)).sum()
        self._first_step = paddle.where(newly, first, self._first_step)
        self._first_norm = paddle.where(newly, first_norm, self._first_norm)
        self._pending = []

    def _remember_position(self, step: int, state) -> None:
        if self._unchecked_from is None:
            self._unchecked_from = step
        # once per step, in order: a step's position (and its kept norm) is found by its distance from the first
        assert step == self._unchecked_from + len(self._consumed_before), (step, self._unchecked_from)
        self._consumed_before.append(int(state.consumed_samples))
        self._epoch_before.append(math.nan if state.epoch is None else float(state.epoch))

    def _forget_positions(self) -> None:
        self._unchecked_from = None
        del self._consumed_before[:], self._epoch_before[:]


@paddle.no_grad()
def unscale_gradients(scaler, grads, divisor: float = 1.0) -> Optional[paddle.Tensor]:
    """Divide ``grads`` in place by ``loss scale × divisor``; return this rank's inf/NaN flag (bool [1]).

    ``grads``: every gradient this rank holds after synchronisation (a ``ParallelOptimizer``'s
    ``named_counted_gradients``' gradients, stage-3 slices included). ``divisor`` > 1 is pipeline ``enable_delay_scale_loss``:
    the micro-batch losses were not divided by the accumulation steps, so the gradients are, here.
    Returns None (and touches nothing) without a scaler and with ``divisor`` 1.
    """
    if scaler is None and divisor == 1.0:
        return None
    if scaler is not None and not scaler.is_enable():
        # GradScaler.scale() turns itself off when it first runs outside an fp16 auto_cast.
        raise RuntimeError("the fp16 loss scaler was disabled by Paddle (was the forward outside auto_cast?); "
                           "refusing to step with unscaled fp16 gradients")
    factor = paddle.to_tensor([float(divisor)], dtype="float32")
    if scaler is not None:
        factor = scaler._scale * factor
    found = paddle.zeros([1], dtype="bool")
    by_dtype = defaultdict(list)
    for grad in grads:
        by_dtype[grad.dtype].append(grad)
    for same_dtype in by_dtype.values():
        found_here = paddle.zeros([1], dtype="bool")
        _legacy_C_ops.check_finite_and_unscale(same_dtype, factor, same_dtype, found_here)
        found = paddle.logical_or(found, found_here)
    return found


def update_loss_scale(scaler, found_inf: bool) -> None:
    """Paddle's dynamic loss-scale update with the job-wide verdict ``found_inf``.

    ``GradScaler.update`` reads the verdict of the last ``GradScaler.step`` from ``_cache_found_inf``; the
    Trainer steps the optimizer itself (see the module docstring), so it leaves the verdict there first.
    """
    if scaler is None:
        return
    scaler._cache_found_inf = bool(found_inf)
    scaler.update()


def loss_scale(scaler) -> float:
    """The current loss scale (a device read)."""
    return float(scaler._scale)


def scaler_logs(scaler, skipped_steps: int) -> Dict[str, float]:
    """``loss_scale`` and ``skipped_steps`` for the training log (only ``skipped_steps`` without a scaler,
    and only once a step was skipped)."""
    logs: Dict[str, float] = {}
    if scaler is not None:
        logs["loss_scale"] = loss_scale(scaler)
    if scaler is not None or skipped_steps:
        logs["skipped_steps"] = int(skipped_steps)
    return logs


def delayed_loss_divisor(model) -> float:
    """``accumulate_steps`` for a ``PipelineParallel`` model with ``enable_delay_scale_loss``, else 1.

    With that option Paddle's 1F1B schedule does not divide the micro-batch losses by the accumulation
    steps; its own ``train_batch`` divides the gradients before the step. The Trainer drives the schedule
    itself (``forward_backward_pipeline``), so it divides them here.
    """
    if not delays_loss_scaling(model):
        return 1.0
    steps = int(getattr(model, "accumulate_steps", 1))
    return float(steps) if steps > 1 else 1.0
