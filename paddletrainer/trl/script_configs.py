"""The model and data arguments of PaddleNLP's ``llm/run_finetune.py`` under their ``paddlenlp.trl`` names
(``ModelConfig``, ``DataConfig``), with PaddleNLP 3.0.0b4's fields and defaults, so the script's
``PdArgumentParser((..., ModelConfig, ..., DataConfig, SFTConfig))`` parses the same configs here. They are read
by the script (model loading, LoRA, data conversion, zero padding), not by the Trainer.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

__all__ = ["DataConfig", "ModelConfig"]


def _help(text: str) -> dict:
    return {"help": text}


@dataclass
class ModelConfig:
    """The model to fine-tune and how: loading, quantization, and the parameter-efficient methods (LoRA and its
    variants, VeRA, LoKr, prefix tuning, ReFT), NEFTune, FlashMask and the long-sequence RoPE strategies."""

    model_name_or_path: str = field(default=None, metadata=_help("Pretrained model name or local directory."))
    tokenizer_name_or_path: Optional[str] = field(default=None, metadata=_help("Tokenizer, if not the model's."))
    use_fast_layer_norm: bool = field(default=False, metadata=_help("Fast layer norm (GPT-3)."))
    fuse_attention_qkv: bool = field(default=None, metadata=_help("Fuse the attention q/k/v projections."))
    fuse_attention_ffn: bool = field(default=None, metadata=_help("Fuse the MLP's gate and up projections."))
    hidden_dropout_prob: float = field(default=0.1, metadata=_help("Hidden dropout probability."))
    attention_probs_dropout_prob: float = field(default=0.1, metadata=_help("Attention dropout probability."))
    continue_training: bool = field(default=True, metadata=_help(
        "Start from the weights at model_name_or_path (false: a randomly initialised model of its config)."))
    weight_quantize_algo: str = field(default=None, metadata=_help(
        "Weight quantization: nf4, fp4, weight_only_int4 or weight_only_int8."))
    weight_blocksize: int = field(default=64, metadata=_help("Block size of nf4/fp4 weight quantization."))
    weight_double_quant: bool = field(default=False, metadata=_help("Quantize the nf4/fp4 scales again."))
    weight_double_quant_block_size: int = field(default=256, metadata=_help("Block size of the scales' quantization."))
    lora: bool = field(default=False, metadata=_help("Train LoRA adapters instead of the weights."))
    lora_path: str = field(default=None, metadata=_help("A LoRA state dict to start from."))
    lora_rank: int = field(default=8, metadata=_help("LoRA rank."))
    use_quick_lora: bool = field(default=False, metadata=_help("Quick LoRA (only with lora_dropout 0)."))
    rslora: bool = field(default=False, metadata=_help("Rank-stabilised LoRA."))
    lora_plus_scale: float = field(default=1.0, metadata=_help("LoRA+ learning-rate scale of B."))
    pissa: bool = field(default=False, metadata=_help("PiSSA initialisation of the adapters."))
    lora_use_mixer: bool = field(default=False, metadata=_help("MosLoRA mixer."))
    use_mora: bool = field(default=False, metadata=_help("MoRA high-rank updating."))
    vera: bool = field(default=False, metadata=_help("Train VeRA adapters."))
    vera_rank: int = field(default=8, metadata=_help("VeRA rank."))
    lokr: bool = field(default=False, metadata=_help("Train LoKr adapters."))
    lokr_path: str = field(default=None, metadata=_help("A LoKr state dict and config to start from."))
    lokr_dim: int = field(default=8, metadata=_help("LoKr adapter dimension."))
    prefix_tuning: bool = field(default=False, metadata=_help("Prefix tuning."))
    prefix_path: str = field(default=None, metadata=_help("A prefix state dict to start from."))
    num_prefix_tokens: int = field(default=128, metadata=_help("Number of prefix tokens."))
    reft: bool = field(default=False, metadata=_help("Representation fine-tuning (ReFT)."))
    from_aistudio: bool = field(default=False, metadata=_help("Load the model from AI Studio."))
    save_to_aistudio: bool = field(default=False, metadata=_help("Upload the trained model to AI Studio."))
    aistudio_repo_id: str = field(default=None, metadata=_help("AI Studio repository id."))
    aistudio_repo_private: bool = field(default=True, metadata=_help("Create a private AI Studio repository."))
    aistudio_repo_license: str = field(default="Apache License 2.0", metadata=_help("AI Studio repository licence."))
    aistudio_token: str = field(default=None, metadata=_help("AI Studio token."))
    neftune: bool = field(default=False, metadata=_help("NEFTune: noise on the input embeddings in training."))
    neftune_noise_alpha: float = field(default=5.0, metadata=_help("NEFTune noise alpha."))
    flash_mask: bool = field(default=False, metadata=_help(
        "FlashMask row indices instead of dense masks (with zero padding and flash attention)."))
    use_long_sequence_strategies: bool = field(default=False, metadata=_help("Extend the context (RoPE scaling)."))
    rope_scaling_factor: float = field(default=1.0, metadata=_help("RoPE extension factor."))
    strategy_type: str = field(default=None, metadata=_help("Long-sequence strategy type."))
    strategy_name: str = field(default=None, metadata=_help("Long-sequence strategy name."))


@dataclass
class DataConfig:
    """Where the fine-tuning data is and how it becomes model inputs: lengths, zero padding (several examples
    packed in one row, greedily with ``greedy_zero_padding``), chat template, evaluation by generation."""

    dataset_name_or_path: str = field(default=None, metadata=_help(
        "A directory with train.json/dev.json (or train/ and dev/ folders of JSON files), or a dataset name."))
    task_name: str = field(default=None, metadata=_help("A more specific task of the dataset."))
    zero_padding: bool = field(default=False, metadata=_help("Pack examples into rows of max_length."))
    greedy_zero_padding: bool = field(default=False, metadata=_help(
        "Pack greedily (with zero_padding): fill each row from the whole buffer of examples."))
    pad_to_multiple_of: int = field(default=None, metadata=_help("Pad each batch to a multiple of this length."))
    src_length: int = field(default=1024, metadata=_help("Maximum length of the source (prompt) tokens."))
    max_length: int = field(default=2048, metadata=_help(
        "Maximum length of an example's tokens, and of a packed row with zero_padding."))
    eval_with_do_generation: bool = field(default=False, metadata=_help("Evaluate by generating the answers."))
    save_generation_output: bool = field(default=False, metadata=_help(
        "Write the generated answers to a file (with eval_with_do_generation)."))
    lazy: bool = field(default=False, metadata=_help("An iterable dataset instead of a map-style one."))
    chat_template: str = field(default=None, metadata=_help(
        "chat_template.json for multi-round conversations: a file, a directory holding it, or "
        "model_name_or_path for the model's own; none: no template."))
    pad_to_max_length: bool = field(default=False, metadata=_help("Pad every input to max_length."))
    autoregressive: bool = field(default=False, metadata=_help("Autoregressive mode."))
    use_pose_convert: bool = field(default=False, metadata=_help("PoSE data conversion."))
