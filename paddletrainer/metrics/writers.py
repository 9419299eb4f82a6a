"""Metric writers: one small class per backend behind one interface (the shape of accelerate's trackers).

``build_writers(report_to, logdir)`` turns the ``report_to`` argument into writer objects. Only the process
that owns the run's logs should build them (``MetricsCallback`` does that on world rank 0).
"""
from __future__ import annotations

import json
import math
import numbers
import os
import time
from typing import Any, Dict, Iterable, List, Optional, Union

__all__ = ["MetricsWriter", "VisualDLWriter", "JsonlWriter", "build_writers", "WRITERS", "JSONL_FILE_NAME"]

JSONL_FILE_NAME = "metrics.jsonl"


def _is_number(value: Any) -> bool:
    # numbers.Number covers int, float, bool and numpy scalars; a paddle Tensor is not one, on purpose:
    # turning a device tensor into a float would force a device sync inside the writer.
    return isinstance(value, numbers.Number) and not isinstance(value, complex)


class MetricsWriter:
    """The writer interface. Subclasses override what their backend supports; the base methods do nothing."""

    name = "base"

    def log_scalars(self, values: Dict[str, float], step: int) -> None:
        """Record each ``tag -> number`` in ``values`` at ``step``."""

    def log_text(self, tag: str, text: str, step: int = 0) -> None:
        """Record a block of text (training arguments, a model config) under ``tag``."""

    def log_hparams(self, hparams: Dict[str, Any]) -> None:
        """Record the run's hyper-parameters once."""

    def flush(self) -> None:
        """Make what was written so far visible to readers."""

    def close(self) -> None:
        """Flush and release the backend; the writer is not used afterwards."""


class VisualDLWriter(MetricsWriter):
    """Writes to a VisualDL log directory (``visualdl --logdir <parent>`` shows it as one run).

    Scalars are stored as float32 by VisualDL. Hyper-parameters of type bool are written as strings:
    VisualDL 2.5.3 rejects bools in ``add_hparams`` (the crash PaddleNLP 3.0.0b4's VisualDLCallback hits).
    """

    name = "visualdl"

    def __init__(self, logdir: Optional[str] = None, log_writer=None):
        """Open a ``visualdl.LogWriter`` in ``logdir``, or wrap the given ``log_writer``."""
        if log_writer is None:
            from visualdl import LogWriter  # imported here so paddletrainer works without visualdl installed

            os.makedirs(logdir, exist_ok=True)
            log_writer = LogWriter(logdir=logdir)
        self.logdir = log_writer.logdir
        # The vdlrecords.*.log file (what visualdl.LogReader(file_path=) reads); taken now because the
        # LogWriter forgets it once closed.
        self.file_path = os.path.join(self.logdir, log_writer.file_name)
        self._writer = log_writer

    def log_scalars(self, values, step):
        for tag, value in values.items():
            if _is_number(value):
                self._writer.add_scalar(tag, float(value), int(step))

    def log_text(self, tag, text, step=0):
        self._writer.add_text(tag, str(text), int(step))

    def log_hparams(self, hparams):
        clean = {}
        for key, value in hparams.items():
            if isinstance(value, bool) or not isinstance(value, (int, float, str)):
                value = str(value)
            clean[key] = value
        self._writer.add_hparams(clean, metrics_list=[])

    def flush(self):
        self._writer.flush()

    def close(self):
        self._writer.close()


class JsonlWriter(MetricsWriter):
    """Appends one JSON object per line to ``path``; easy to read with pandas, jq or a few lines of Python.

    Records: scalars ``{"step": 3, "time": <unix s>, "train/loss": 2.1, ...}``; text
    ``{"step": 0, "time": ..., "tag": "args", "text": "..."}``; hyper-parameters
    ``{"step": 0, "time": ..., "hparams": {...}}``. Non-finite numbers (NaN, inf) are written as ``null`` so
    every line stays strict JSON.
    """

    name = "jsonl"

    def __init__(self, path: str):
        parent = os.path.dirname(path)
        if parent:
            os.makedirs(parent, exist_ok=True)
        self.path = path
        self._file = open(path, "a", encoding="utf-8")

    def _write(self, record: Dict[str, Any]) -> None:
        self._file.write(json.dumps(record, ensure_ascii=False, allow_nan=False) + "\n")

    def log_scalars(self, values, step):
        record: Dict[str, Any] = {"step": int(step), "time": round(time.time(), 3)}
        for tag, value in values.items():
            if _is_number(value):
                value = float(value)
                record[tag] = value if math.isfinite(value) else None
        self._write(record)

    def log_text(self, tag, text, step=0):
        self._write({"step": int(step), "time": round(time.time(), 3), "tag": tag, "text": str(text)})

    def log_hparams(self, hparams):
        # default=str keeps objects that JSON cannot encode (enums, paths) readable instead of failing.
        clean = json.loads(json.dumps(hparams, default=str))
        self._write({"step": 0, "time": round(time.time(), 3), "hparams": clean})

    def flush(self):
        self._file.flush()

    def close(self):
        if not self._file.closed:
            self._file.close()


# name -> factory(logdir). "all" means every entry here; "none" means no writer.
WRITERS = {
    "visualdl": lambda logdir: VisualDLWriter(logdir),
    "jsonl": lambda logdir: JsonlWriter(os.path.join(logdir, JSONL_FILE_NAME)),
}


def _names(report_to: Union[None, str, Iterable[str]]) -> List[str]:
    if report_to is None:
        return ["visualdl"]  # PaddleNLP's default report_to
    items = [report_to] if isinstance(report_to, str) else list(report_to)
    names: List[str] = []
    for item in items:
        # "visualdl,jsonl" is accepted too: it is what a CLI or YAML value often looks like.
        for name in str(item).replace(",", " ").split():
            name = name.lower()
            if name == "all":
                names.extend(WRITERS)
            elif name != "none" and name not in WRITERS:
                valid = ", ".join(sorted([*WRITERS, "all", "none"]))
                raise ValueError(f"report_to: unknown writer {name!r}; valid values are {valid}")
            elif name != "none":
                names.append(name)
    return list(dict.fromkeys(names))  # drop duplicates, keep the order


def build_writers(report_to: Union[None, str, Iterable[str]], logdir: Optional[str]) -> List[MetricsWriter]:
    """Create the writers named by ``report_to`` ("visualdl", "jsonl", "all", "none", or a list of them).

    ``None`` means PaddleNLP's default, "visualdl". Names are validated before any writer is created, so an
    unknown name raises ``ValueError`` (listing the valid ones) without leaving files behind.
    """
    names = _names(report_to)
    if names and not logdir:
        raise ValueError(f"report_to={report_to!r} needs a logging directory")
    return [WRITERS[name](logdir) for name in names]
