"""paddletrainer: a PaddlePaddle-native trainer with 4D hybrid parallelism.

The public API mirrors ``paddlenlp.trainer``: a script written for PaddleNLP's Trainer runs after changing
its import to ``from paddletrainer import ...``. Importing this package never imports paddlenlp; the
public names are resolved on first use (PEP 562), so ``import paddletrainer`` stays cheap and a submodule
can be imported on its own. Paddle is not a declared dependency (pick the CPU or the CUDA build): the first
``import paddle`` after this import says how to install it when it is missing (``runtime.paddle_requirement``).
"""
import logging
from typing import TYPE_CHECKING

from .lazy_exports import lazy_attributes
from .runtime import paddle_requirement

__version__ = "0.1.0"  # the package's one version string (pyproject.toml reads it)
paddle_requirement.install()

# The package logger (PaddleNLP code patches ``paddlenlp.trainer.logger``); every module logs below it.
logger = logging.getLogger(__name__)

# public name -> submodule that defines it
_EXPORTS = {
    "PdArgumentParser": "argparser",
    "strtobool": "argparser",
    "TrainingArguments": "training_args",
    "AutoTrainingArguments": "auto_training_args",
    "Trainer": "trainer",
    "CallbackHandler": "trainer_callback",
    "DefaultFlowCallback": "trainer_callback",
    "EarlyStoppingCallback": "trainer_callback",
    "PrinterCallback": "trainer_callback",
    "ProgressCallback": "trainer_callback",
    "TrainerCallback": "trainer_callback",
    "TrainerControl": "trainer_callback",
    "TrainerState": "trainer_callback",
    "DataCollatorWithPadding": "data.collate",
    "GlobalBatchSampler": "data.sampling",
    "default_data_collator": "data.collate",
    "TensorBoardCallback": "integrations",
    "VisualDLCallback": "integrations",
    "WandbCallback": "integrations",
    "get_scheduler": "optim.schedules",
    "EvalPrediction": "trainer_utils",
    "IntervalStrategy": "trainer_utils",
    "OptimizerNames": "trainer_utils",
    "PredictionOutput": "trainer_utils",
    "SchedulerType": "trainer_utils",
    "ShardingOption": "trainer_utils",
    "TrainOutput": "trainer_utils",
    "find_batch_size": "trainer_utils",
    "get_last_checkpoint": "trainer_utils",
    "set_seed": "runtime.seeding",
    "speed_metrics": "trainer_utils",
}


if TYPE_CHECKING:  # the same names for type checkers and editors' go-to-definition (never executed)
    from .argparser import PdArgumentParser, strtobool
    from .auto_training_args import AutoTrainingArguments
    from .data.collate import DataCollatorWithPadding, default_data_collator
    from .data.sampling import GlobalBatchSampler
    from .integrations import TensorBoardCallback, VisualDLCallback, WandbCallback
    from .optim.schedules import get_scheduler
    from .runtime.seeding import set_seed
    from .trainer import Trainer
    from .trainer_callback import (CallbackHandler, DefaultFlowCallback, EarlyStoppingCallback,
                                   PrinterCallback, ProgressCallback, TrainerCallback, TrainerControl, TrainerState)
    from .trainer_utils import (EvalPrediction, IntervalStrategy, OptimizerNames, PredictionOutput,
                                SchedulerType, ShardingOption, TrainOutput, find_batch_size, get_last_checkpoint, speed_metrics)
    from .training_args import TrainingArguments

__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_attributes(globals(), _EXPORTS)
