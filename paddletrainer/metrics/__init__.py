"""Metrics: writers (VisualDL, JSONL), the callback that feeds them, throughput/FLOPs/MFU, timers, memory."""
from .callback import (MetricsCallback, TensorBoardCallback, VisualDLCallback, WandbCallback, default_logging_dir,
                       metrics_output_callbacks, reporting_callbacks, rewrite_logs)
from .process_memory import MemoryTracker, current_rss_bytes, memory_logs, peak_memory_bytes
from .throughput import (ThroughputMeter, TokenCounter, batch_counts, causal_lm_flops_per_token, flops_per_token_from_config,
                         flops_per_token_of_model, mfu, trained_tokens)
from .timers import PHASES, PhaseTimers
from .writers import JsonlWriter, MetricsWriter, TensorBoardWriter, VisualDLWriter, WandbWriter, build_writers

__all__ = [
    "MetricsWriter", "VisualDLWriter", "JsonlWriter", "TensorBoardWriter", "WandbWriter", "build_writers",
    "MetricsCallback", "VisualDLCallback", "TensorBoardCallback", "WandbCallback", "reporting_callbacks",
    "metrics_output_callbacks",
    "default_logging_dir", "rewrite_logs",
    "causal_lm_flops_per_token", "flops_per_token_from_config", "flops_per_token_of_model", "mfu", "batch_counts",
    "ThroughputMeter", "TokenCounter", "trained_tokens",
    "PhaseTimers", "PHASES", "peak_memory_bytes", "memory_logs", "current_rss_bytes", "MemoryTracker",
]
