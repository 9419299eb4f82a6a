"""The library's entry-point error handling: how a script ends on bad input, an interruption or a fault.

* Bad *options* never reach here: ``PdArgumentParser`` ends them as argparse does (usage, ``error: argument
  --<option>: ...``, exit 2) on every rank, before training (see :mod:`paddletrainer.argparser`).
* ``friendly_errors`` / ``main_guard`` wrap a script's ``main`` for what is found later: ``ValueError``,
  ``CheckpointError``, ``NonFiniteLossError`` and ``ReplicaDivergenceError`` print ``error: <message>`` and exit
  :data:`ERROR_EXIT_CODE` (2); ``TrainingInterrupted`` prints its line and exits 128 + signal. No traceback
  unless ``PADDLETRAINER_TRACEBACK=1``; any other exception (a bug) keeps its traceback.
* ``TrainingInterrupted``: raised after a signal-triggered stop checkpoint (``runtime.RobustnessCallback``).

``CheckpointError``, ``NonFiniteLossError`` and ``ReplicaDivergenceError`` are defined here, with no import of the
package (so this module, ``runtime`` and ``python -m paddletrainer.launch`` stay free of the trainer and the
checkpoint machinery); ``paddletrainer.checkpoint`` and ``paddletrainer.trainer`` re-export them under their
public names.
"""
from __future__ import annotations

import functools
import os
import signal
import sys
from typing import Any, Callable, Optional

__all__ = ["ERROR_EXIT_CODE", "TRACEBACK_ENV", "CheckpointError", "NonFiniteLossError", "ReplicaDivergenceError",
           "TrainingInterrupted", "friendly_errors", "main_guard", "signal_name"]

ERROR_EXIT_CODE = 2  # bad input / configuration, as argparse does
TRACEBACK_ENV = "PADDLETRAINER_TRACEBACK"


class CheckpointError(RuntimeError):
    """Base class of the checkpoint errors (a missing, incomplete, corrupt or mismatched checkpoint)."""


class NonFiniteLossError(RuntimeError):
    """Raised (on every rank alike) when the loss or gradient norm is NaN/inf under ``nan_inf_policy=error``."""


class ReplicaDivergenceError(RuntimeError):
    """Raised (on every rank of the replica group alike) when the data-parallel/sharding replicas' weights differ
    at a ``replica_check_steps`` check (see :mod:`paddletrainer.runtime.replica_check`).

    Attributes: ``step``, ``ranks`` (the global ranks that differ from the majority), ``parameter`` (the first
    differing parameter's name); None/empty when built from a message alone (``rollback`` re-raises that way).
    """

    def __init__(self, message: str, *, step: Optional[int] = None, ranks=(), parameter: Optional[str] = None):
        super().__init__(message)
        self.step = step
        self.ranks = list(ranks)
        self.parameter = parameter


class TrainingInterrupted(SystemExit):
    """Training stopped on a signal after a checkpoint was saved on every rank.

    A ``SystemExit``: uncaught, the process exits with ``code`` = 128 + signal number and no traceback.
    Attributes: ``signum``, ``step``, ``checkpoint`` (the published directory or None), ``message``.
    """

    def __init__(self, signum: int, step: int, checkpoint: Optional[str] = None):
        self.signum = int(signum)
        self.step = int(step)
        self.checkpoint = checkpoint
        name = signal_name(self.signum)
        if checkpoint:
            where = f"checkpoint saved to {checkpoint} (resume with --resume_from_checkpoint {checkpoint})"
        else:
            where = "no checkpoint was saved"
        self.message = f"training interrupted by {name} at step {self.step}; {where}"
        super().__init__(128 + self.signum)

    def __str__(self) -> str:
        return self.message

    def __reduce__(self):
        return (type(self), (self.signum, self.step, self.checkpoint))


def signal_name(signum: int) -> str:
    """``SIGTERM`` for 15; ``signal N`` for a number that names no signal."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


# What a wrapped main reports as one "error: ..." line (bad input or state the user can fix), not as a bug.
_USER_ERROR_TYPES = (ValueError, CheckpointError, NonFiniteLossError, ReplicaDivergenceError)


def friendly_errors(fn: Callable) -> Callable:
    """Decorate a script's ``main``: user-facing errors become one ``error: ...`` line and exit code 2;
    ``TrainingInterrupted`` prints its line and exits 128 + signal. ``PADDLETRAINER_TRACEBACK=1`` re-raises
    (full traceback). Other exceptions (bugs) propagate unchanged."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except TrainingInterrupted as e:
            if os.environ.get(TRACEBACK_ENV, "") not in ("", "0"):
                raise
            sys.stderr.write(f"interrupted: {e.message}\n")
            sys.stderr.flush()
            sys.exit(e.code)
        except _USER_ERROR_TYPES as e:
            if os.environ.get(TRACEBACK_ENV, "") not in ("", "0"):
                raise
            sys.stderr.write(f"error: {e}\n")
            sys.stderr.flush()
            sys.exit(ERROR_EXIT_CODE)

    return wrapper


def main_guard(fn: Callable, *args: Any, **kwargs: Any):
    """Run ``fn(*args, **kwargs)`` under :func:`friendly_errors`: ``if __name__ == "__main__": main_guard(main)``."""
    return friendly_errors(fn)(*args, **kwargs)
