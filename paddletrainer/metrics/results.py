"""Final metrics of a split (``train``/``eval``/``test``): display formatting, the console table and the JSON
files in ``output_dir`` (the bodies of PaddleNLP's ``Trainer.metrics_format``/``log_metrics``/``save_metrics``)."""
from __future__ import annotations

import json
import os
import time
from typing import Any, Dict

__all__ = ["format_metrics", "print_metrics", "save_metrics"]


def format_metrics(metrics: Dict[str, float]) -> Dict[str, Any]:
    """Metrics rounded for display (floats to 4 decimals; runtimes as h:mm:ss)."""
    out = {}
    for k, v in metrics.items():
        if k.endswith("_runtime"):
            out[k] = time.strftime("%H:%M:%S", time.gmtime(v)) + f".{int((v % 1) * 100):02d}"
        elif isinstance(v, float):
            out[k] = round(v, 4)
        else:
            out[k] = v
    return out


def print_metrics(split: str, metrics: Dict[str, float]) -> None:
    """``metrics`` as an aligned table under ``***** <split> metrics *****``."""
    print(f"***** {split} metrics *****")
    formatted = format_metrics(metrics)
    width = max((len(k) for k in formatted), default=0)
    for k in sorted(formatted):
        print(f"  {k:<{width}} = {formatted[k]}")


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
