"""``MetricsCallback``: sends the Trainer's logs to the writers named by ``args.report_to``.

The Trainer installs one callback per ``report_to`` name (:func:`reporting_callbacks`), as PaddleNLP does:
``VisualDLCallback``, ``TensorBoardCallback``, ``WandbCallback`` (PaddleNLP's ``integrations`` classes, with
their attributes ``vdl_writer`` / ``tb_writer`` / ``_wandb``), or a ``MetricsCallback`` for ``jsonl``.
"""
from __future__ import annotations

import logging
import os
import weakref
from typing import Dict, List, Optional

from ..trainer_callback import TrainerCallback
from ..config.builders import MetricsConfig  # noqa: F401  (built by TrainingArguments: args.metrics_config)
from ..parallel.wrappers import unwrap_model
from ..trainer_utils import default_logdir
from .writers import (JsonlWriter, MetricsWriter, TensorBoardWriter, VisualDLWriter, WandbWriter, _is_number,
                      build_writers, writer_names)

logger = logging.getLogger(__name__)

__all__ = ["MetricsCallback", "VisualDLCallback", "TensorBoardCallback", "WandbCallback", "reporting_callbacks",
           "default_logging_dir", "rewrite_logs", "MetricsConfig"]


def default_logging_dir(output_dir: str) -> str:
    """``<output_dir>/runs/<Mon DD_HH-MM-SS>_<host>``: the PaddleNLP/HF default, one directory per run
    (``trainer_utils.default_logdir``, which ``TrainingArguments`` uses too)."""
    return os.path.join(output_dir or ".", default_logdir())


def rewrite_logs(logs: Dict[str, object]) -> Dict[str, object]:
    """Group keys for dashboards: ``eval_x -> eval/x``, ``test_x -> test/x``, anything else ``-> train/x``."""
    out = {}
    for key, value in logs.items():
        if key.startswith("eval_"):
            out["eval/" + key[len("eval_"):]] = value
        elif key.startswith("test_"):
            out["test/" + key[len("test_"):]] = value
        else:
            out["train/" + key] = value
    return out


def _close_writers(writers: List[MetricsWriter]) -> None:
    for writer in writers:
        writer.close()


class MetricsCallback(TrainerCallback):
    """Writes every numeric value of ``on_log`` to the writers of ``report_to``, on world rank 0 only.

    The gate is ``state.is_world_process_zero`` rather than ``args.should_log``: with ``log_on_each_node``
    ``should_log`` is true on one process per node, and a run must have exactly one writer.

    Args:
        report_to: writer names (see ``build_writers``); ``None`` reads ``args.report_to``.
        logging_dir: where the writers write; ``None`` reads ``args.logging_dir``, then falls back to
            ``default_logging_dir(args.output_dir)``.
        writers: ready-made writers to use instead of building them (tests, custom backends).
        every_rank: write on every process, not only on world rank 0 (per-rank files, ``metrics_output_path``).

    Logged once per run, at the first ``on_train_begin`` or ``on_log``: the training arguments as text
    ("args", from ``args.to_json_string()``) and hyper-parameters (``args.to_sanitized_dict()``) when args
    has them, and the model config as text ("model_config") when the model has ``.config``.
    """

    # PaddleNLP's integration callbacks close their writer at the end of train() (and reopen it if something
    # is logged afterwards); the generic callback only flushes, so evaluate() after train() stays in one file.
    close_at_train_end = False
    # PaddleNLP's per-backend callbacks name their writer class (INTEGRATION_TO_CALLBACK is keyed by its name)
    writer_class: Optional[type] = None

    def __init__(self, report_to=None, logging_dir: Optional[str] = None,
                 writers: Optional[List[MetricsWriter]] = None, every_rank: bool = False):
        self.report_to = report_to
        self.every_rank = every_rank
        self.logging_dir = logging_dir
        self.writers: Optional[List[MetricsWriter]] = list(writers) if writers is not None else None
        self._run_info_logged = False
        self._finalizer = None

    def _open(self, args, state, model=None) -> bool:
        """Build the writers if needed; return False on processes that must not write."""
        if not (self.every_rank or state.is_world_process_zero):
            return False
        if self.writers is None:
            config = args.metrics_config
            report_to = self.report_to if self.report_to is not None else writer_names(config.report_to)
            self.logging_dir = self.logging_dir or config.logging_dir
            run_name = config.run_name
            self.writers = build_writers(report_to, self.logging_dir, run_name=state.trial_name or run_name,
                                         run_group=run_name)
            # Closed by close(), or when this callback is garbage-collected, or at interpreter exit; the
            # finalizer holds the writers, not the callback, so a finished Trainer can be collected.
            self._finalizer = weakref.finalize(self, _close_writers, self.writers)
        if not self._run_info_logged:
            self._run_info_logged = True
            self._log_run_info(args, model)
        return bool(self.writers)

    def _log_run_info(self, args, model) -> None:
        texts = {}
        if hasattr(args, "to_json_string"):
            texts["args"] = args.to_json_string()
        config = getattr(unwrap_model(model), "config", None)
        if config is not None:
            texts["model_config"] = config.to_json_string() if hasattr(config, "to_json_string") else str(config)
        hparams = args.to_sanitized_dict() if hasattr(args, "to_sanitized_dict") else None
        for writer in self.writers:
            for tag, text in texts.items():
                writer.log_text(tag, text, step=0)
            if hparams:
                writer.log_hparams(hparams)
            writer.flush()

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self._open(args, state, model)

    def on_log(self, args, state, control, logs=None, model=None, **kwargs):
        # evaluate() without train() logs too, so the writers may first open here.
        if not logs or not self._open(args, state, model):
            return
        values = {tag: value for tag, value in rewrite_logs(logs).items() if _is_number(value)}
        skipped = sorted(set(logs) - {k for k in logs if _is_number(logs[k])})
        if skipped:
            logger.debug("Not a number, not written: %s", ", ".join(skipped))
        self._write(values, state.global_step)

    def write_scalars(self, values: Dict[str, float], args, state, model=None) -> None:
        """Write ``values`` under their own tags (no ``train/`` prefix) at the current step, on the processes
        this callback writes on (the start's ``startup/*`` seconds)."""
        if self._open(args, state, model):
            self._write(values, state.global_step)

    def _write(self, values: Dict[str, float], step: int) -> None:
        for writer in self.writers:
            writer.log_scalars(values, step)
            # Log steps are infrequent, so flushing each one keeps dashboards current at little cost.
            writer.flush()

    def on_train_end(self, args, state, control, **kwargs):
        if self.close_at_train_end:
            self.close()
            return
        # Flush, not close: evaluate()/predict() after train() belong to the same run and the same file
        # (reopening would start a second VisualDL record file). The writers close at process exit.
        for writer in self.writers or []:
            writer.flush()

    def close(self) -> None:
        """Close the writers (also done when the callback is collected, or at interpreter exit)."""
        if self._finalizer is not None:
            self._finalizer()  # runs at most once
        else:
            _close_writers(self.writers or [])
        self.writers = None


    def _only_writer(self):
        return self.writers[0] if self.writers else None


class VisualDLCallback(MetricsCallback):
    """PaddleNLP's ``integrations.VisualDLCallback``: VisualDL only, optionally with a given ``visualdl.LogWriter``.

    ``vdl_writer`` is the open writer (``.logdir``, ``.file_name``) from the first ``on_train_begin``/``on_log``
    until ``on_train_end`` closes it (None before and after), as in PaddleNLP. The Trainer's own
    ``report_to=visualdl`` callback passes ``close_at_train_end=False`` instead: ``evaluate()``/``predict()``
    after ``train()`` then write into the same record file, so a run is one file (PaddleNLP starts a second one).
    """

    close_at_train_end = True
    writer_class = VisualDLWriter

    def __init__(self, vdl_writer=None, close_at_train_end: bool = True):
        writers = None
        if vdl_writer is not None:
            writers = [VisualDLWriter(log_writer=vdl_writer)]
        super().__init__(report_to=self.writer_class.name, writers=writers)
        self.close_at_train_end = close_at_train_end

    @property
    def vdl_writer(self) -> Optional[VisualDLWriter]:
        return self._only_writer()


class TensorBoardCallback(MetricsCallback):
    """PaddleNLP's ``integrations.TensorBoardCallback``: TensorBoard event files in ``logging_dir`` (needs
    ``tensorboardX``), or through the given ``tensorboardX.SummaryWriter``. ``tb_writer`` (``.log_dir``) is
    open from the first ``on_train_begin``/``on_log`` until ``on_train_end`` closes it (None before and after)."""

    close_at_train_end = True
    writer_class = TensorBoardWriter

    def __init__(self, tb_writer=None):
        self.writer_class.require()  # fail at construction, like PaddleNLP
        writers = None
        if tb_writer is not None:
            writers = [TensorBoardWriter(summary_writer=tb_writer)]
        super().__init__(report_to=self.writer_class.name, writers=writers)

    @property
    def tb_writer(self):
        return self._only_writer()


class WandbCallback(MetricsCallback):
    """PaddleNLP's ``integrations.WandbCallback``: logs to Weights & Biases (needs ``wandb``).

    The run is named ``state.trial_name`` (else ``args.run_name``) and grouped under ``args.run_name``; the
    project is ``$WANDB_PROJECT``; ``WANDB_MODE=offline`` needs no account. ``_wandb`` is the ``wandb`` module
    and ``_initialized`` tells whether the run was started. Model artifacts (``WANDB_LOG_MODEL``) are not
    uploaded.
    """

    close_at_train_end = True
    writer_class = WandbWriter

    def __init__(self):
        self._wandb = self.writer_class.require()
        super().__init__(report_to=self.writer_class.name)

    @property
    def _initialized(self) -> bool:
        return bool(self.writers)


# report_to name -> the callback PaddleNLP installs for it; other names get a MetricsCallback of their own.
INTEGRATION_TO_CALLBACK = {cb.writer_class.name: cb for cb in (VisualDLCallback, TensorBoardCallback, WandbCallback)}


def reporting_callbacks(report_to) -> List[TrainerCallback]:
    """One callback per writer named by ``report_to``, in its order (PaddleNLP's
    ``get_reporting_integration_callbacks``); an unknown name raises ``ValueError`` listing the valid ones."""
    callbacks: List[TrainerCallback] = []
    for name in writer_names(report_to):
        if name == VisualDLWriter.name:  # the default: one record file per run, evaluate() after train() included
            callbacks.append(VisualDLCallback(close_at_train_end=False))
            continue
        factory = INTEGRATION_TO_CALLBACK.get(name)
        callbacks.append(factory() if factory is not None else MetricsCallback(report_to=name))
    return callbacks


def metrics_output_callbacks(metrics_output_path: Optional[str], rank: int) -> List[TrainerCallback]:
    """``metrics_output_path`` (PaddleNLP's option): every rank appends its logs as JSON lines to
    ``<metrics_output_path>/metrics_rank<rank>.json``; none without it."""
    if not metrics_output_path:
        return []
    path = os.path.join(metrics_output_path, f"metrics_rank{rank}.json")
    return [MetricsCallback(writers=[JsonlWriter(path)], every_rank=True)]
