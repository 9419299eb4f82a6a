"""Arithmetic a layout planner starts from: what a layout costs per rank, before anything is launched."""
from .memory_model import StateBytes, state_bytes_per_rank

__all__ = ["StateBytes", "state_bytes_per_rank"]
