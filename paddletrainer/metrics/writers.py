"""Metric writers: one small class per backend behind one interface (the shape of accelerate's trackers).

``build_writers(report_to, logdir)`` turns the ``report_to`` argument into writer objects. Only the process
that owns the run's logs should build them (``MetricsCallback`` does that on world rank 0).

Backends: ``visualdl`` (a requirement), ``jsonl`` (standard library), ``tensorboard`` (``tensorboardX``) and
``wandb``. The last two are optional (the package extras ``tensorboard`` and ``wandb``): their library is
imported when such a writer is created, and a missing one fails with a one-line hint naming the extra.

Each writer class carries its own facts (``name``: its ``report_to`` value; ``library``: the optional library it
needs; ``in_all``: whether ``report_to=all`` includes it; ``for_run``: how the Trainer builds it); ``WRITERS`` and
the reporting callbacks' table (``metrics.callback.INTEGRATION_TO_CALLBACK``) are derived from the classes.
"""
from __future__ import annotations

import json
import math
import numbers
import os
import importlib
import importlib.util
import time
from typing import Any, Dict, Iterable, List, Optional, Union

from ..trainer_utils import normalize_report_to

__all__ = ["MetricsWriter", "VisualDLWriter", "JsonlWriter", "TensorBoardWriter", "WandbWriter", "build_writers",
           "WRITERS", "JSONL_FILE_NAME", "import_backend", "writer_names", "check_report_to"]

JSONL_FILE_NAME = "metrics.jsonl"


def _is_number(value: Any) -> bool:
    # numbers.Number covers int, float, bool and numpy scalars; a paddle Tensor is not one, on purpose:
    # turning a device tensor into a float would force a device sync inside the writer.
    return isinstance(value, numbers.Number) and not isinstance(value, complex)


def import_backend(module: str, pip_name: str, report_to: str):
    """Import an optional writer library, or fail with one line saying how to install it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(_install_hint(report_to, pip_name)) from exc


def _install_hint(report_to: str, pip_name: str) -> str:
    # the extra of the same name (pyproject.toml) installs the library with the version it needs
    return f"report_to={report_to} needs the {pip_name!r} package: pip install \"paddletrainer[{report_to}]\""


def _scalar_hparams(hparams: Dict[str, Any]) -> Dict[str, Any]:
    """Hyper-parameters as int/float/str values (other types, and bools, as their string)."""
    return {k: (v if isinstance(v, (int, float, str)) and not isinstance(v, bool) else str(v))
            for k, v in hparams.items()}


class MetricsWriter:
    """The writer interface. Subclasses override what their backend supports; the base methods do nothing."""

    name = "base"  # the report_to value that selects this writer
    library: Optional[str] = None  # the optional library (module = pip name = extra's library) it imports
    in_all = True  # report_to=all includes it (when its library is installed)

    @classmethod
    def for_run(cls, logdir: str, run_name: Optional[str] = None, run_group: Optional[str] = None) -> "MetricsWriter":
        """The writer ``report_to=<name>`` opens in ``logdir`` (``run_name``/``run_group`` where the backend
        names runs)."""
        return cls(logdir)

    @classmethod
    def require(cls):
        """Import this writer's optional library (returned), or fail with one line naming the extra to install."""
        return import_backend(cls.library, cls.library, cls.name) if cls.library else None

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


class _SummaryWriter(MetricsWriter):
    """A backend whose writer has ``add_scalar(tag, value, step)`` / ``add_text(tag, text, step)`` /
    ``flush()`` / ``close()`` (VisualDL's ``LogWriter`` and tensorboardX's ``SummaryWriter``), kept in ``_writer``."""

    def log_scalars(self, values, step):
        for tag, value in values.items():
            if _is_number(value):
                self._writer.add_scalar(tag, float(value), int(step))

    def log_text(self, tag, text, step=0):
        self._writer.add_text(tag, str(text), int(step))

    def flush(self):
        self._writer.flush()

    def close(self):
        self._writer.close()


class VisualDLWriter(_SummaryWriter):
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

    @property
    def file_name(self) -> str:
        """The record file's path (PaddleNLP code reads ``vdl_writer.file_name`` to open a ``LogReader``)."""
        return self.file_path

    def log_hparams(self, hparams):
        self._writer.add_hparams(_scalar_hparams(hparams), metrics_list=[])


class JsonlWriter(MetricsWriter):
    """Appends one JSON object per line to ``path``; easy to read with pandas, jq or a few lines of Python.

    Records: scalars ``{"step": 3, "time": <unix s>, "train/loss": 2.1, ...}``; text
    ``{"step": 0, "time": ..., "tag": "args", "text": "..."}``; hyper-parameters
    ``{"step": 0, "time": ..., "hparams": {...}}``. Non-finite numbers (NaN, inf) are written as ``null`` so
    every line stays strict JSON.
    """

    name = "jsonl"

    @classmethod
    def for_run(cls, logdir, run_name=None, run_group=None):
        return cls(os.path.join(logdir, JSONL_FILE_NAME))

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


class TensorBoardWriter(_SummaryWriter):
    """Writes TensorBoard event files in ``logdir`` with ``tensorboardX`` (``tensorboard --logdir <logdir>``).

    Hyper-parameters go to the same directory (TensorBoard's HParams tab), not to a per-call sub-run.
    """

    name = "tensorboard"
    library = "tensorboardX"

    def __init__(self, logdir: Optional[str] = None, summary_writer=None):
        """Open a ``tensorboardX.SummaryWriter`` in ``logdir``, or wrap the given ``summary_writer``."""
        self.require()
        if summary_writer is None:
            from tensorboardX import SummaryWriter

            os.makedirs(logdir, exist_ok=True)
            summary_writer = SummaryWriter(logdir=logdir)
        self.log_dir = summary_writer.logdir
        self._writer = summary_writer

    def log_hparams(self, hparams):
        from tensorboardX.summary import hparams as hparams_summary

        for summary in hparams_summary(_scalar_hparams(hparams), {}):
            self._writer._get_file_writer().add_summary(summary)


class WandbWriter(MetricsWriter):
    """Logs to Weights & Biases: one ``wandb`` run named ``name`` in group ``group``, files under ``logdir``.

    The project is ``$WANDB_PROJECT`` (default "paddletrainer"); ``WANDB_MODE=offline`` works without an
    account. Scalars are plotted against ``train/global_step`` (the trainer's step, logged with every row);
    hyper-parameters go to the run config.
    """

    name = "wandb"
    library = "wandb"
    in_all = False  # a W&B run needs an account or WANDB_MODE=offline, so it is only started when named

    @classmethod
    def for_run(cls, logdir, run_name=None, run_group=None):
        return cls(logdir, name=run_name, group=run_group)

    def __init__(self, logdir: str, name: Optional[str] = None, group: Optional[str] = None):
        self.wandb = self.require()
        os.makedirs(logdir, exist_ok=True)
        if self.wandb.run is None:
            self.wandb.init(project=os.getenv("WANDB_PROJECT", "paddletrainer"), name=name, group=group, dir=logdir)
        self.run = self.wandb.run
        # The trainer's step is a logged value, not W&B's own step: W&B refuses a step lower than one it has
        # committed, and evaluate() after train() logs at the same step again.
        self.run.define_metric(self.STEP_KEY)
        self.run.define_metric("*", step_metric=self.STEP_KEY, step_sync=True)

    STEP_KEY = "train/global_step"

    def log_scalars(self, values, step):
        row = {tag: float(v) for tag, v in values.items() if _is_number(v)}
        row[self.STEP_KEY] = int(step)
        self.run.log(row)

    def log_text(self, tag, text, step=0):
        self.run.summary[tag] = str(text)

    def log_hparams(self, hparams):
        self.run.config.update(_scalar_hparams(hparams), allow_val_change=True)

    def close(self):
        if self.wandb.run is self.run:
            self.run.finish()


# report_to name -> writer class; "all" means every writer with ``in_all`` whose library is installed, "none" no
# writer.
WRITERS = {cls.name: cls for cls in (VisualDLWriter, JsonlWriter, TensorBoardWriter, WandbWriter)}


def writer_names(report_to: Union[None, str, Iterable[str]]) -> List[str]:
    """The validated writer names of a ``report_to`` value, in order, without duplicates ("all" expanded)."""
    names: List[str] = []
    for item in normalize_report_to(report_to):
        # "visualdl,jsonl" is accepted too: it is what a CLI or YAML value often looks like.
        for name in str(item).replace(",", " ").split():
            name = name.lower()
            if name == "all":
                names.extend(n for n, cls in WRITERS.items()
                             if cls.in_all and (cls.library is None or importlib.util.find_spec(cls.library)))
            elif name != "none" and name not in WRITERS:
                valid = ", ".join(sorted([*WRITERS, "all", "none"]))
                raise ValueError(f"report_to: unknown writer {name!r}; valid values are {valid}")
            elif name != "none":
                names.append(name)
    return list(dict.fromkeys(names))  # drop duplicates, keep the order


def check_report_to(report_to: Union[None, str, Iterable[str]]) -> None:
    """Fail now, with one line, on an unknown writer name or a named writer whose library is not installed —
    so the Trainer can check ``report_to`` before any process group exists (the writers open much later)."""
    for name in writer_names(report_to):
        library = WRITERS[name].library
        if library is not None and importlib.util.find_spec(library) is None:
            raise ImportError(_install_hint(name, library))


def build_writers(report_to: Union[None, str, Iterable[str]], logdir: Optional[str], run_name: Optional[str] = None,
                  run_group: Optional[str] = None) -> List[MetricsWriter]:
    """Create the writers named by ``report_to`` ("visualdl", "jsonl", "tensorboard", "wandb", "all", "none",
    or a list of them).

    ``None`` means PaddleNLP's default, "visualdl". Names are validated before any writer is created, so an
    unknown name raises ``ValueError`` (listing the valid ones) without leaving files behind. ``run_name`` and
    ``run_group`` name the run where the backend has such a notion (W&B).
    """
    names = writer_names(report_to)
    if names and not logdir:
        raise ValueError(f"report_to={report_to!r} needs a logging directory")
    return [WRITERS[name].for_run(logdir, run_name=run_name, run_group=run_group) for name in names]
