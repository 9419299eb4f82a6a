"""Post-training on the Trainer with PaddleNLP's ``paddlenlp.trl`` names: supervised fine-tuning
(``SFTTrainer``/``SFTConfig``) and direct preference optimisation (``DPOTrainer``/``DPOConfig``, the
``DPOCriterion``, and the preference-pair data helpers ``run_dpo.py`` imports), and the model and data arguments
of ``run_finetune.py`` (``ModelConfig``/``DataConfig``)."""
from .dpo_config import DPOConfig, DPODataArgument, DPOModelArgument, DPOTrainingArguments
from .dpo_criterion import DPOCriterion
from .dpo_trainer import DPOTrainer, disable_dropout_in_model
from .preference_data import check_preference_data, preference_collate_fn, preprocess_preference_data
from .script_configs import DataConfig, ModelConfig
from .sft import DataCollatorForSeq2Seq, SFTConfig, SFTTrainer
from .trl_utils import calculate_effective_tokens

__all__ = [
    "DPOConfig", "DPOCriterion", "DPODataArgument", "DPOModelArgument", "DPOTrainer", "DPOTrainingArguments",
    "DataCollatorForSeq2Seq", "DataConfig", "ModelConfig", "SFTConfig", "SFTTrainer", "calculate_effective_tokens",
    "check_preference_data", "disable_dropout_in_model", "preference_collate_fn", "preprocess_preference_data",
]
