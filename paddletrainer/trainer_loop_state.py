"""What one ``Trainer.train()`` call carries from step to step: :class:`LoopState` (a fresh one per call) and its
:class:`LossTracker`, instead of attributes the loop would create on the Trainer."""
from __future__ import annotations

import dataclasses
from typing import Callable, List, Optional

import paddle

from .metrics import ThroughputMeter, TokenCounter
from .optim.overflow import NonfiniteGuard
from .parallel import collectives
from .runtime.replica_check import ReplicaCheck
from .runtime.rollback import Rollback

__all__ = ["LoopState", "LossTracker"]


class LossTracker:
    """The training loss the loop logs: ``add`` each applied step's loss (summed on the device, no host read per
    step); ``reduce_and_reset`` at a logging step (one all-reduce over the data group, one host read); ``total``:
    the sum of every reduced interval, for the run's mean loss (``train_loss``)."""

    def __init__(self) -> None:
        self._sum = paddle.zeros([], dtype="float32")  # Σ step losses since the last reduction, on the device
        self.steps = 0  # the steps in that sum
        self.total = 0.0  # Σ of the reduced sums (each a mean over the data ranks)

    def add(self, step_loss: paddle.Tensor, replace_nonfinite: bool = False) -> None:
        """Count one step's loss. ``replace_nonfinite`` (HF's ``logging_nan_inf_filter``): a nan/inf step counts
        as the mean of the steps since the last reduction, computed on the device."""
        if replace_nonfinite:
            mean = (self._sum / max(self.steps, 1)).astype(step_loss.dtype)
            step_loss = paddle.where(paddle.isfinite(step_loss), step_loss, mean)
        self._sum += step_loss
        self.steps += 1

    def reduce_and_reset(self, topology) -> float:
        """The sum since the last reduction, averaged over the data ranks (collective over the data group) and
        added to :attr:`total`; the interval starts again, empty."""
        value = float(collectives.mean_over_data_group(self._sum, topology))
        self._sum = paddle.zeros([], dtype="float32")
        self.steps = 0
        self.total += value
        return value

    def discard(self) -> None:
        """Forget the steps since the last reduction, unlogged (a rollback discards them)."""
        self._sum.zero_()
        self.steps = 0


@dataclasses.dataclass
class LoopState:
    """One ``train()`` call's running state; :meth:`start` builds it after the model is wrapped."""

    # (trainer, micro-batches) -> the step's loss, grads summed; chosen once per layout. The Trainer's method as a
    # plain function, never bound: a bound method would make Trainer -> _loop -> Trainer a reference cycle, and the
    # Trainer (model, optimizer, loader and writer threads) would outlive the script's last reference to it.
    forward_backward: Callable
    global_batch: int  # samples per optimizer step over all data ranks (args.global_batch_size)
    accumulation: int  # micro-batches per optimizer step (gradient_accumulation_steps)
    flops_per_token: Optional[float]  # for the logged TFLOP/s and MFU
    meter: ThroughputMeter  # samples/tokens/steps since the last log
    losses: LossTracker
    nonfinite: NonfiniteGuard  # nan_inf_policy's verdict on each step's global gradient norm
    rollback: Optional[Rollback]  # nan_inf_policy=rollback (and replica divergence); None: raise
    replicas: ReplicaCheck
    tokens: TokenCounter  # count_trained_tokens
    grad_norm: Optional[paddle.Tensor] = None  # the last step's global norm, unread until it is logged
    applied_steps: int = 0  # optimizer steps taken in this call (a rollback sets global_step back, not this)
    # the weights of the step's micro-batches not yet run (optim.loss.micro_batch_weights); None: PaddleNLP's mean
    loss_weights: Optional[List[paddle.Tensor]] = None

    def next_loss_weight(self) -> Optional[paddle.Tensor]:
        """The weight of the micro-batch about to run (``training_step``), taken from :attr:`loss_weights`."""
        return self.loss_weights.pop(0) if self.loss_weights else None

    @classmethod
    def start(cls, args, topology, model_wrapped, scaler, global_step: int, forward_backward: Callable,
              flops_per_token) -> "LoopState":
        """A fresh state for a ``train()`` call starting at ``global_step`` (the replica check's group is built
        here: collective)."""
        meter, losses = ThroughputMeter(), LossTracker()
        nonfinite = NonfiniteGuard(args.nan_inf_policy, scaler)
        rollback_config = args.rollback_config
        rollback = Rollback(rollback_config) if rollback_config is not None else None
        replicas = ReplicaCheck(args.replica_check_config, topology, model_wrapped, global_step)
        return cls(forward_backward=forward_backward, global_batch=args.global_batch_size, accumulation=args.gradient_accumulation_steps,
                   flops_per_token=flops_per_token, meter=meter, losses=losses, nonfinite=nonfinite,
                   rollback=rollback, replicas=replicas, tokens=TokenCounter(args.pad_token_id))
