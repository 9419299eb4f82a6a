"""Final metrics of a split (``train``/``eval``/``test``): display formatting, the console table and the JSON
files in ``output_dir``; :class:`TrainerResults`, the Trainer's reporting methods with PaddleNLP's names
(``metrics_format``, ``log_metrics``, ``save_metrics``, ``log_trained_tokens``)."""
from __future__ import annotations

import datetime
import json
import logging
import os
from typing import Any, Dict

from ..data.gather import sum_over_data_ranks

__all__ = ["TrainerResults", "format_metrics", "print_metrics", "save_metrics"]

logger = logging.getLogger("paddletrainer.trainer")  # the Trainer's logger: one place to configure or silence


def _runtime_text(seconds: float) -> str:
    """``H:MM:SS.cc`` (``1 day, H:MM:SS.cc`` past a day): whole seconds as a timedelta, then the hundredths."""
    return f"{datetime.timedelta(seconds=int(seconds))}.{int(abs(seconds - int(seconds)) * 100):02d}"


def format_metrics(metrics: Dict[str, float]) -> Dict[str, Any]:
    """Metrics as PaddleNLP displays them: memory keys (``*_mem_*``, bytes) in MB, runtimes as ``H:MM:SS.cc``,
    ``total_flos`` in GF, other floats rounded to 4 decimals."""
    out = {}
    for k, v in metrics.items():
        if "_mem_" in k:
            out[k] = f"{int(v) >> 20}MB"
        elif "_runtime" in k:
            out[k] = _runtime_text(v)
        elif k == "total_flos":
            out[k] = f"{int(v) >> 30}GF"
        elif isinstance(v, float):
            out[k] = round(v, 4)
        else:
            out[k] = v
    return out


def print_metrics(split: str, metrics: Dict[str, float]) -> None:
    """``metrics`` as an aligned table under ``***** <split> metrics *****`` (names left-, values right-aligned)."""
    print(f"***** {split} metrics *****")
    formatted = format_metrics(metrics)
    width = max((len(str(k)) for k in formatted), default=0)
    value_width = max((len(str(v)) for v in formatted.values()), default=0)
    for k in sorted(formatted):
        print(f"  {k:<{width}} = {str(formatted[k]):>{value_width}}")


def save_metrics(output_dir: str, split: str, metrics: Dict[str, float], combined: bool = True) -> None:
    """Write ``<split>_results.json`` (and merge into ``all_results.json``) in ``output_dir``."""
    os.makedirs(output_dir, exist_ok=True)
    with open(os.path.join(output_dir, f"{split}_results.json"), "w") as f:
        json.dump(metrics, f, indent=2, sort_keys=True)
    if combined:
        path = os.path.join(output_dir, "all_results.json")
        merged = {}
        if os.path.exists(path):
            with open(path) as f:
                merged = json.load(f)
        merged.update(metrics)
        with open(path, "w") as f:
            json.dump(merged, f, indent=2, sort_keys=True)


class TrainerResults:
    """The Trainer's reporting methods (PaddleNLP's names and signatures). ``Trainer`` inherits them; they use its
    ``args``, ``topology`` and the running state of its ``train()`` call (``_loop``)."""

    def metrics_format(self, metrics: Dict[str, float]) -> Dict[str, Any]:
        """Metrics as PaddleNLP displays them (memory in MB, runtimes as H:MM:SS.cc, total_flos in GF, floats to 4
        decimals); ``trainer_utils.metrics_format`` is this function."""
        return format_metrics(metrics)

    def log_metrics(self, split: str, metrics: Dict[str, float]) -> None:
        """Print ``metrics`` as an aligned table on the main process."""
        if self.args.should_log:
            print_metrics(split, metrics)

    def save_metrics(self, split: str, metrics: Dict[str, float], combined: bool = True) -> None:
        """Write ``<split>_results.json`` (and merge into ``all_results.json``) in output_dir."""
        if self.args.should_save:
            save_metrics(self.args.output_dir, split, metrics, combined)

    def log_trained_tokens(self) -> None:
        """Log the tokens trained so far in this ``train()`` over all data ranks (at each save and at the end;
        collective over the data group). Sets ``trained_effective_tokens`` and ``trained_tokens``."""
        if not self.args.count_trained_tokens:
            return
        effective, total = sum_over_data_ranks(list(self._loop.tokens.totals()), self.topology)
        self.trained_effective_tokens, self.trained_tokens = int(effective), int(total)
        if self.args.should_log:
            logger.info("Update to now, trained_effective_tokens: %d, trained_tokens: %d",
                        self.trained_effective_tokens, self.trained_tokens)
