"""``paddlenlp.trainer.integrations``: the reporting callbacks, re-exported from :mod:`paddletrainer.metrics`.

``report_to`` installs them (one per name, in order): ``visualdl`` → :class:`VisualDLCallback`, ``tensorboard``
→ :class:`TensorBoardCallback` (needs ``tensorboardX``), ``wandb`` → :class:`WandbCallback` (needs ``wandb``).
"""
from .metrics.callback import (INTEGRATION_TO_CALLBACK, TensorBoardCallback, VisualDLCallback, WandbCallback,
                               reporting_callbacks)

# PaddleNLP's name for reporting_callbacks.
get_reporting_integration_callbacks = reporting_callbacks

__all__ = ["VisualDLCallback", "TensorBoardCallback", "WandbCallback", "INTEGRATION_TO_CALLBACK",
           "get_reporting_integration_callbacks"]
