"""Hugging Face ``TrainingArguments`` options that PaddleNLP 3.0.0b4 lacks, with their Hugging Face meaning.

``HFOptions`` is a keyword-only base of ``TrainingArguments`` (so ``TrainingArguments("out")`` still takes
``output_dir`` first). Each option either acts through the subsystem that owns the behaviour or is a name-level
translation done here at construction:

* ``data_seed``: the seed of the training data order (the sampler's shuffle); None uses ``seed``.
* ``log_level`` / ``log_level_replica``: the ``paddletrainer`` logger's level on the main process / on the other
  processes (``passive`` leaves it as it is); ``get_process_log_level()`` as in HF, applied by the Trainer.
* ``logging_nan_inf_filter``: a non-finite step loss (``nan_inf_policy`` skip/rollback) is replaced in the logged
  loss by the mean of the other steps since the last log (on the device, no host read).
* ``lr_scheduler_kwargs``: the schedule's own arguments (``num_cycles``, ``lr_end``, ``power``,
  ``min_learning_rate``), overriding the options of those names.
* ``save_only_model``: checkpoints hold the weights without the optimizer/scheduler/scaler states (PaddleNLP's
  ``ignore_save_lr_and_optim``); they cannot be resumed, only loaded with ``ignore_load_lr_and_optim``.
* ``save_safetensors``: True is what paddletrainer always does; False (pickles) is refused.
* ``use_cpu``: train on the CPU even with an accelerator (``device="cpu"``; the Trainer sets the device).
* PyTorch-only options are refused by name with the Paddle equivalent (``REFUSED_TORCH_OPTIONS``).

Only this module and ``training_args`` know these names.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Dict, Optional

from .arg_checks import check_scheduler_kwargs

__all__ = ["HFOptions", "LOG_LEVELS", "REFUSED_TORCH_OPTIONS", "SCHEDULER_KWARGS"]

#: HF's level names; ``passive`` (-1) leaves the logger's level unchanged
LOG_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR,
              "critical": logging.CRITICAL, "passive": -1}
#: the keys ``lr_scheduler_kwargs`` may set (the arguments of ``optim.schedules.get_scheduler`` beyond the steps)
SCHEDULER_KWARGS = ("num_cycles", "lr_end", "power", "min_learning_rate")
#: PyTorch-only options: refused when set, with what to use instead
REFUSED_TORCH_OPTIONS = {
    "use_ipex": "Intel Extension for PyTorch has no Paddle counterpart here; drop it",
    "use_mps_device": "Paddle has no Apple MPS backend; use device=cpu (or use_cpu=True)",
    "jit_mode_eval": "PyTorch's TorchScript; Paddle's counterpart is paddle.jit.to_static on the exported model "
                     "(Trainer.export_model), not evaluation inside training",
    "per_gpu_train_batch_size": "use per_device_train_batch_size (deprecated in Hugging Face too)",
    "per_gpu_eval_batch_size": "use per_device_eval_batch_size (deprecated in Hugging Face too)",
}


def _help(text: str) -> Dict[str, str]:
    return {"help": text}


@dataclass(kw_only=True)
class HFOptions:
    """The Hugging Face options (see the module docstring); ``TrainingArguments`` calls ``_apply_hf_options``."""

    data_seed: Optional[int] = field(default=None, metadata=_help(
        "Hugging Face: seed of the training data order (the sampler's shuffle); None: seed."))
    log_level: str = field(default="passive", metadata=_help(
        "Hugging Face: level of the paddletrainer logger on the main process: debug, info, warning, error, "
        "critical or passive (leave it)."))
    log_level_replica: str = field(default="warning", metadata=_help(
        "Hugging Face: the same on the other processes."))
    logging_nan_inf_filter: bool = field(default=True, metadata=_help(
        "Hugging Face: a nan/inf step loss counts as the mean of the other steps in the logged loss."))
    lr_scheduler_kwargs: Optional[Dict[str, Any]] = field(default=None, metadata=_help(
        "Hugging Face: the schedule's arguments as a JSON object (num_cycles, lr_end, power, min_learning_rate)."))
    save_only_model: bool = field(default=False, metadata=_help(
        "Hugging Face: checkpoints without optimizer/scheduler state (PaddleNLP's ignore_save_lr_and_optim); "
        "they cannot be resumed."))
    save_safetensors: bool = field(default=True, metadata=_help(
        "Hugging Face: write safetensors (always, here; False is refused: paddletrainer never writes pickles)."))
    use_cpu: bool = field(default=False, metadata=_help(
        "Hugging Face: train on the CPU even when an accelerator is available (device=cpu)."))
    use_ipex: bool = field(default=False, metadata=_help("PyTorch only: refused when True."))
    use_mps_device: bool = field(default=False, metadata=_help("PyTorch only: refused when True."))
    jit_mode_eval: bool = field(default=False, metadata=_help("PyTorch only: refused when True."))
    per_gpu_train_batch_size: Optional[int] = field(default=None, metadata=_help(
        "Deprecated PyTorch name: refused; use per_device_train_batch_size."))
    per_gpu_eval_batch_size: Optional[int] = field(default=None, metadata=_help(
        "Deprecated PyTorch name: refused; use per_device_eval_batch_size."))

    def _apply_hf_options(self) -> None:
        """Check the HF options and translate the name-level ones (``save_only_model``, ``use_cpu``)."""
        for option, instead in REFUSED_TORCH_OPTIONS.items():
            value = getattr(self, option)
            if value not in (None, False):
                raise ValueError(f"{option}={value!r} is not supported by paddletrainer: {instead}")
        for option in ("log_level", "log_level_replica"):
            if getattr(self, option) not in LOG_LEVELS:
                raise ValueError(f"{option}={getattr(self, option)!r} is not valid; choose one of: "
                                 f"{', '.join(LOG_LEVELS)}")
        if self.lr_scheduler_kwargs is not None:
            check_scheduler_kwargs(self.lr_scheduler_kwargs, SCHEDULER_KWARGS)
        if not self.save_safetensors:
            raise ValueError("save_safetensors=False is not supported by paddletrainer: checkpoints are always "
                             "safetensors (pickles are never written); drop the option")
        if self.save_only_model:
            self.ignore_save_lr_and_optim = True
        if self.use_cpu:
            if self.device not in ("gpu", "cpu"):  # "gpu" is the default: only another explicit device conflicts
                raise ValueError(f"use_cpu=True contradicts device={self.device!r}: drop one of them")
            self.device = "cpu"

    def get_process_log_level(self) -> int:
        """The ``paddletrainer`` logger level for this process (HF's method): ``log_level`` where ``should_log``,
        else ``log_level_replica``; ``passive`` keeps the logger's current level."""
        level = LOG_LEVELS[self.log_level if self.should_log else self.log_level_replica]
        return logging.getLogger("paddletrainer").getEffectiveLevel() if level == -1 else level

    def scheduler_arguments(self) -> Dict[str, Any]:
        """``num_cycles``, ``lr_end``, ``power``, ``min_learning_rate`` for the schedule, with
        ``lr_scheduler_kwargs`` applied."""
        return {**{k: getattr(self, k) for k in SCHEDULER_KWARGS}, **(self.lr_scheduler_kwargs or {})}
