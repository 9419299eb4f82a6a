"""The Trainer's optimizer and learning-rate schedule, built from the arguments unless the user gave their own.

A mixin of :class:`~paddletrainer.trainer.Trainer` (like ``trainer_data.TrainerData``): the methods use the
Trainer's ``args``, ``model``, ``amp``, ``optimizer``, ``lr_scheduler`` and ``optimizer_grouped_parameters``.
PaddleNLP's override points live here: ``create_optimizer``, ``create_scheduler``,
``create_optimizer_and_scheduler`` and ``set_optimizer_grouped_parameters``.
"""
from __future__ import annotations

from .optim.optimization import create_optimizer
from .optim.schedules import get_scheduler

__all__ = ["TrainerOptimizer"]


class TrainerOptimizer:
    """``create_optimizer``/``create_scheduler`` from the arguments and the parameters they train."""

    def set_optimizer_grouped_parameters(self, optimizer_grouped_parameters=None):
        """The parameters (or Paddle parameter-group dicts) the optimizer ``create_optimizer`` builds trains,
        as in PaddleNLP: weight decay then applies to every one of them (no bias/norm exception). None: the
        model's trainable parameters, biases and norm weights undecayed."""
        self.optimizer_grouped_parameters = optimizer_grouped_parameters

    def create_optimizer(self, lr_scheduler=None):
        """AdamW (or ``args.optim``) with weight decay skipped for biases and norm weights, or over the
        parameters ``set_optimizer_grouped_parameters`` gave."""
        if self.optimizer is None:
            args = self.args
            self._optimizer_built_here = True
            self.optimizer = create_optimizer(
                self.model, lr_scheduler if lr_scheduler is not None else args.learning_rate, optim=args.optim,
                weight_decay=args.weight_decay, adam_beta1=args.adam_beta1, adam_beta2=args.adam_beta2,
                adam_epsilon=args.adam_epsilon, multi_precision=self.amp.enabled and self.amp.level == "O2",
                parameter_groups=self.optimizer_grouped_parameters)
        return self.optimizer

    def create_scheduler(self, num_training_steps: int):
        """The ``lr_scheduler_type`` schedule over ``num_training_steps`` with warmup."""
        if self.lr_scheduler is None:
            args = self.args
            decay_steps = args.schedule_decay_steps(num_training_steps)
            self.lr_scheduler = get_scheduler(  # + num_cycles, lr_end, power, min_learning_rate, lr_scheduler_kwargs
                args.lr_scheduler_type, learning_rate=args.learning_rate, num_training_steps=decay_steps,
                num_warmup_steps=args.get_warmup_steps(num_training_steps), **args.scheduler_arguments())
        return self.lr_scheduler

    def create_optimizer_and_scheduler(self, num_training_steps: int):
        """The schedule, then the optimizer stepping along it."""
        self.create_scheduler(num_training_steps)
        self.create_optimizer(self.lr_scheduler)
