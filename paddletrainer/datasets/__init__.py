"""Reusable datasets for the examples (numpy only; no paddlenlp import)."""
from .pretrain import PretrainTokenDataset, resolve_prefix

__all__ = ["PretrainTokenDataset", "resolve_prefix"]
