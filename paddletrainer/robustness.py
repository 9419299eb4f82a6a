"""Robustness: interruptions, hangs and bad input end in a clear, clean state instead of lost work or a hang.

What this module gives the Trainer (and scripts), each small and independent:

``GracefulStop``
    SIGTERM/SIGINT handlers that only set a flag (the previous handlers come back on ``uninstall()`` or at the
    end of the ``with`` block). ``should_stop(topology)`` is asked once per optimizer step; in a multi-process
    run it is a MAX all-reduce of the flag over the whole world, so every rank stops at the *same* step — no
    rank leaves the loop alone while the others wait for it in a collective. A second signal while a stop is
    pending falls back to the previous handler (a second Ctrl-C kills at once).

``TrainingInterrupted``
    Raised after the stop checkpoint is published on every rank. It subclasses ``SystemExit`` on purpose:
    uncaught, Python exits with its ``code`` (128 + signal number: 143 for SIGTERM, 130 for SIGINT — what a
    shell reports for a process killed by that signal, so schedulers see "terminated") and prints **no
    traceback**; ``except Exception`` in user code does not swallow it. ``str(exc)`` is the one-line message
    (signal, step, checkpoint path, how to resume); the callback logs that line before raising.

``CollectiveWatchdog(timeout_seconds, rank)``
    A background thread. ``with watchdog.phase("optimizer", step=120):`` (or ``watchdog.enter(...)`` /
    ``watchdog.disarm()``) arms it; when one phase lasts longer than the timeout it writes one line to stderr
    (``rank 3 stuck in 'optimizer' at step 120 for 600s: a collective is probably waiting for a rank that died
    or diverged``), dumps every thread's stack (faulthandler) and ends the process with
    :data:`WATCHDOG_EXIT_CODE`, so ``paddle.distributed.launch`` tears the job down: a hang becomes an error.
    ``timeout_seconds=None`` costs nothing: no thread, ``phase()`` is a shared no-op context.
    Caveat: the thread needs the GIL; Paddle releases it inside its collectives and ``time.sleep`` does too,
    but a C extension that blocks while holding the GIL would also block the watchdog.

``RobustnessCallback(topology, collective_timeout_seconds)``
    Both of the above wired through ordinary Trainer events (so the trainer needs two lines, see
    ``docs/errors.md``): handlers installed at ``on_train_begin``; the watchdog re-armed at every event with the
    phase the loop is in (``data``, ``forward_backward``, ``optimizer``, ``stop_check``, ``log``, ``evaluate``,
    ``checkpoint_save``); at ``on_step_end`` the agreed stop sets ``should_save`` and ``should_training_stop``,
    and ``on_save`` then publishes the checkpoint (async saves included) and raises ``TrainingInterrupted``.

Input checks (each raises one ``ValueError`` naming the option, the value and what would be valid):
``check_model_for_layout`` (TP/PP asked of a model not built for it — before any process group exists),
``check_pipeline_split``, ``check_batch_keys`` (``remove_unused_columns=False`` with keys the forward does not
take; the callback runs it on the first training batch, in the main thread — not in the collator, because Paddle's
single-process DataLoader collates in a helper thread and an exception there leaves the loop waiting forever), ``check_dataset`` (empty data set), ``check_output_dir`` (a previous run's
checkpoints would be mixed with this run's).

``friendly_errors`` / ``main_guard`` / ``TrainingInterrupted``
    Defined in :mod:`paddletrainer.errors` (re-exported here).

This module imports ``checkpoint`` (for ``finish_pending_save``/``CheckpointError``) and ``data``; nothing in
``parallel`` or ``checkpoint`` imports it.
"""
from __future__ import annotations

import contextlib
import faulthandler
import logging
import os
import signal
import sys
import threading
import time
from typing import Callable, Iterable, Optional, Sequence

from .callbacks import TrainerCallback
# the entry-point error handling and TrainingInterrupted live in `errors`; importable from here as before
from .errors import ERROR_EXIT_CODE, TRACEBACK_ENV, TrainingInterrupted, friendly_errors, main_guard, signal_name
from .trainer_utils import has_length, requested_resume

logger = logging.getLogger(__name__)

__all__ = [
    "WATCHDOG_EXIT_CODE",
    "ERROR_EXIT_CODE",
    "TRACEBACK_ENV",
    "TrainingInterrupted",
    "GracefulStop",
    "CollectiveWatchdog",
    "RobustnessCallback",
    "check_batch_keys",
    "check_dataset",
    "check_model_for_layout",
    "check_output_dir",
    "check_pipeline_split",
    "friendly_errors",
    "main_guard",
]

WATCHDOG_EXIT_CODE = 86  # distinct from 1 (Python error), 2 (usage error), 124 (coreutils timeout), 128+n (signals)


# ===================================================================================== interruption
class GracefulStop:
    """Turn SIGTERM/SIGINT into a flag the training loop checks once per optimizer step.

    Use as a context manager (or ``install()`` / ``uninstall()``). Handlers can only be installed from the
    main thread; elsewhere ``install()`` logs a warning and the flag can still be set with :meth:`request`.

    ``scope``: a code object (e.g. ``Trainer.train``'s). When a signal arrives while that code is no longer on
    the main thread's stack — ``train()`` left by an exception, so nobody will ever check the flag — the handler
    uninstalls itself and passes the signal to the previous handler, so Ctrl-C is never swallowed by a stale
    handler.
    """

    def __init__(self, signals: Sequence[int] = (signal.SIGTERM, signal.SIGINT), scope=None):
        self.signals = tuple(signals)
        self.scope = scope
        self.signum: int = 0  # the (first) signal received; 0 = none
        self._previous: dict = {}
        self._installed = False

    # -------------------------------------------------------------------------- handlers
    def install(self) -> "GracefulStop":
        if self._installed:
            return self
        if threading.current_thread() is not threading.main_thread():
            logger.warning("GracefulStop: not in the main thread, signal handlers not installed")
            return self
        for sig in self.signals:
            self._previous[sig] = signal.getsignal(sig)
            signal.signal(sig, self._handle)
        self._installed = True
        return self

    def uninstall(self) -> None:
        """Restore the handlers that were in place before :meth:`install`."""
        if not self._installed:
            return
        for sig, previous in self._previous.items():
            signal.signal(sig, previous if previous is not None else signal.SIG_DFL)
        self._previous.clear()
        self._installed = False

    def __enter__(self) -> "GracefulStop":
        return self.install()

    def __exit__(self, *exc) -> None:
        self.uninstall()

    @property
    def installed(self) -> bool:
        return self._installed

    def _in_scope(self, frame) -> bool:
        if self.scope is None:
            return True
        while frame is not None:
            if frame.f_code is self.scope:
                return True
            frame = frame.f_back
        return False

    def _handle(self, signum, frame) -> None:
        if self.signum or not self._in_scope(frame):
            # a second signal (the user insists), or a stale handler: behave as before we were installed
            previous = self._previous.get(signum, signal.SIG_DFL)
            self.uninstall()
            if callable(previous):
                previous(signum, frame)
            elif previous == signal.SIG_DFL:
                os.kill(os.getpid(), signum)
            return
        self.signum = signum
        # one line, async-signal-safe enough (no locks held by logging here)
        try:
            os.write(2, f"received {signal_name(signum)}: saving a checkpoint at the end of this step, then "
                        f"stopping (send it again to stop at once)\n".encode())
        except OSError:
            pass

    # -------------------------------------------------------------------------- the flag
    @property
    def requested(self) -> bool:
        """This process received a stop signal (or :meth:`request` was called)."""
        return bool(self.signum)

    def request(self, signum: int = signal.SIGTERM) -> None:
        """Ask for a stop as if ``signum`` had arrived (tests, callbacks, schedulers' pre-emption hooks)."""
        if not self.signum:
            self.signum = int(signum)

    def should_stop(self, topology=None) -> bool:
        """True on every rank iff any rank received a stop signal. Collective when the world has > 1 process:
        every rank must call it at the same point (the trainer: once per optimizer step)."""
        world = _world_size(topology)
        if world <= 1:
            return bool(self.signum)
        import paddle
        import paddle.distributed as dist

        flag = paddle.to_tensor([self.signum], dtype="int64")
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        agreed = int(flag.numpy()[0])
        if agreed and not self.signum:
            self.signum = agreed  # another rank got the signal: stop with it
        return bool(agreed)


def _world_size(topology) -> int:
    if topology is not None:
        return int(getattr(topology, "world_size", 1))
    try:
        import paddle.distributed as dist

        return dist.get_world_size() if dist.is_initialized() else 1
    except Exception:  # pragma: no cover - paddle without distributed
        return 1


# ===================================================================================== watchdog
class CollectiveWatchdog:
    """Ends a process whose current phase runs longer than ``timeout_seconds`` (a hang becomes an error).

    ``phase(name, step)`` is a context manager; ``enter(name, step)`` re-arms the timer with a new phase and
    ``disarm()`` stops timing (for event-driven use). ``timeout_seconds=None`` disables everything at zero cost.
    ``on_timeout`` replaces the default action (message, stack dump, ``os._exit``) — for tests.
    """

    _NULL = contextlib.nullcontext()

    def __init__(self, timeout_seconds: Optional[float], rank: int = 0, *, exit_code: int = WATCHDOG_EXIT_CODE,
                 on_timeout: Optional[Callable[[str], None]] = None, stream=None):
        if timeout_seconds is not None and (isinstance(timeout_seconds, bool) or timeout_seconds <= 0):
            raise ValueError(f"collective_timeout_seconds={timeout_seconds!r} is invalid: must be a positive number "
                             "or None (no watchdog)")
        self.timeout = timeout_seconds
        self.rank = rank
        self.exit_code = exit_code
        self._on_timeout = on_timeout
        self._stream = stream
        self._cond = threading.Condition()
        self._phase: Optional[str] = None
        self._step: Optional[int] = None
        self._started_at = 0.0
        self._deadline: Optional[float] = None
        self._closed = False
        self._thread: Optional[threading.Thread] = None
        self.fired: Optional[str] = None  # the message, once it fired (with a custom on_timeout)

    @property
    def enabled(self) -> bool:
        return self.timeout is not None

    # -------------------------------------------------------------------------- arming
    def enter(self, name: str, step: Optional[int] = None) -> None:
        """Start timing phase ``name`` (at ``step``) now; replaces the current phase."""
        if self.timeout is None:
            return
        with self._cond:
            self._ensure_thread()
            self._phase, self._step = name, step
            self._started_at = time.monotonic()
            self._deadline = self._started_at + self.timeout
            self._cond.notify()

    def disarm(self) -> None:
        if self.timeout is None:
            return
        with self._cond:
            self._phase, self._deadline = None, None
            self._cond.notify()

    def phase(self, name: str, step: Optional[int] = None):
        """``with watchdog.phase("optimizer", step=n):`` — times the block; a no-op context when disabled."""
        if self.timeout is None:
            return self._NULL
        return self._phase_context(name, step)

    @contextlib.contextmanager
    def _phase_context(self, name, step):
        outer = (self._phase, self._step) if self._deadline is not None else None
        self.enter(name, step)
        try:
            yield self
        finally:
            if outer is not None and outer[0] is not None:
                self.enter(*outer)  # nested use: back to the enclosing phase, timer restarted
            else:
                self.disarm()

    def close(self) -> None:
        """Stop the thread (idempotent)."""
        if self._thread is None:
            return
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join(timeout=5)
        self._thread = None

    def __enter__(self) -> "CollectiveWatchdog":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -------------------------------------------------------------------------- the thread
    def _ensure_thread(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._closed = False
            self._thread = threading.Thread(target=self._run, name=f"paddletrainer-watchdog-rank{self.rank}",
                                            daemon=True)
            self._thread.start()

    def _run(self) -> None:
        with self._cond:
            while not self._closed:
                if self._deadline is None:
                    self._cond.wait()
                    continue
                remaining = self._deadline - time.monotonic()
                if remaining > 0:
                    self._cond.wait(remaining)
                    continue
                message = self._message(time.monotonic() - self._started_at)
                self._deadline = None
                break
            else:
                return
        self._fire(message)

    def _message(self, elapsed: float) -> str:
        step = f" at step {self._step}" if self._step is not None else ""
        return (f"rank {self.rank} stuck in '{self._phase}'{step} for {elapsed:.0f}s "
                f"(collective_timeout_seconds={self.timeout:g}): a collective is probably waiting for a rank "
                f"that died or diverged")

    def _fire(self, message: str) -> None:
        self.fired = message
        if self._on_timeout is not None:
            self._on_timeout(message)
            return
        stream = self._stream or sys.stderr
        try:
            stream.write(message + "\n")
            stream.flush()
            faulthandler.dump_traceback(file=stream, all_threads=True)
            stream.flush()
        except Exception:  # a broken stderr must not keep a hung process alive
            pass
        os._exit(self.exit_code)


# ===================================================================================== trainer hook
class RobustnessCallback(TrainerCallback):
    """``GracefulStop`` + ``CollectiveWatchdog`` driven by Trainer events (see the module docstring).

    Args:
        topology: the Trainer's ``Topology`` (``world_size`` and ``rank`` are read).
        collective_timeout_seconds: ``args.collective_timeout_seconds`` (None: no watchdog).
        handle_signals: install the SIGTERM/SIGINT handlers during ``train()`` (default True).
        popped_keys: batch keys the trainer removes before calling the model (its ``label_names`` when a
            ``criterion`` is used); with ``remove_unused_columns=False`` the first training batch's other keys must
            be ``forward`` parameters (:func:`check_batch_keys`).
    """

    def __init__(self, topology=None, collective_timeout_seconds: Optional[float] = None, handle_signals: bool = True,
                 popped_keys: Sequence[str] = ()):
        self.topology = topology
        self.popped_keys = tuple(popped_keys)
        self._keys_checked = False
        rank = int(getattr(topology, "rank", 0) or 0)
        self.stopper = GracefulStop() if handle_signals else None
        self.watchdog = CollectiveWatchdog(collective_timeout_seconds, rank)
        self._training = False
        self._stopping = False

    # -------------------------------------------------------------------------- helpers
    @staticmethod
    def _next_step(state) -> int:
        return int(state.global_step) + 1

    def _after_step_phase(self, control) -> str:
        if control.should_log:
            return "log"
        if control.should_evaluate:
            return "evaluate"
        if control.should_save:
            return "checkpoint_save"
        return "data"

    # -------------------------------------------------------------------------- events
    def on_train_begin(self, args, state, control, **kwargs):
        self._training, self._stopping = True, False
        if self.stopper is not None:
            self.stopper.uninstall()  # a previous train() of this trainer that ended in an exception
            self.stopper.signum = 0
            self.stopper.scope = _calling_train_code()
            self.stopper.install()
        self.watchdog.enter("data", self._next_step(state))

    def on_load_data_end(self, args, state, control, inputs=None, model=None, **kwargs):
        if not self._keys_checked and not getattr(args, "remove_unused_columns", True) and isinstance(inputs, dict) \
                and model is not None:
            check_batch_keys(model, inputs.keys(), self.popped_keys)
        self._keys_checked = True

    def on_step_begin(self, args, state, control, **kwargs):
        self.watchdog.enter("forward_backward", self._next_step(state))

    def on_substep_end(self, args, state, control, **kwargs):
        self.watchdog.enter("forward_backward", self._next_step(state))

    def on_optimizer_begin(self, args, state, control, **kwargs):
        self.watchdog.enter("optimizer", self._next_step(state))

    def on_step_end(self, args, state, control, **kwargs):
        # every rank reaches this point once per optimizer step: the place for the collective stop check
        self.watchdog.enter("stop_check", state.global_step)
        if self.stopper is not None and self.stopper.should_stop(self.topology):
            self._stopping = True
            control.should_save = True
            control.should_training_stop = True
        self.watchdog.enter(self._after_step_phase(control), state.global_step)
        return control

    def on_log(self, args, state, control, **kwargs):
        if self._training:
            self.watchdog.enter(self._after_step_phase(control), state.global_step)

    def on_prediction_step(self, args, state, control, **kwargs):
        self.watchdog.enter("evaluate", state.global_step)

    def on_evaluate(self, args, state, control, **kwargs):
        if self._training:
            self.watchdog.enter("checkpoint_save" if control.should_save else "data", state.global_step)
        else:
            self.watchdog.disarm()

    def on_predict(self, args, state, control, **kwargs):
        if not self._training:
            self.watchdog.disarm()

    def on_save(self, args, state, control, **kwargs):
        if self._stopping:
            from . import checkpoint as ckpt

            ckpt.finish_pending_save()  # an async save is published (collectively) before we leave
            self._finish()
            checkpoint = os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
            exc = TrainingInterrupted(self.stopper.signum, state.global_step, checkpoint)
            logger.warning("%s", exc.message)
            raise exc
        self.watchdog.enter("data", self._next_step(state))

    def on_epoch_end(self, args, state, control, **kwargs):
        self.watchdog.enter("epoch_end", state.global_step)

    def on_train_end(self, args, state, control, **kwargs):
        self._finish()

    def _finish(self) -> None:
        self._training = False
        self.watchdog.disarm()
        if self.stopper is not None:
            self.stopper.uninstall()


def _calling_train_code():
    """The code object of the ``train`` method up the stack (the Trainer's loop), or None."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "train" and hasattr(frame.f_locals.get("self"), "callback_handler"):
            return frame.f_code
        frame = frame.f_back
    return None


# ===================================================================================== input checks
_TP_LAYER_NAMES = ("ColumnParallelLinear", "RowParallelLinear", "VocabParallelEmbedding", "ParallelCrossEntropy",
                   "ColumnSequenceParallelLinear", "RowSequenceParallelLinear")


def check_pipeline_split(num_layers: int, pp_degree: int, option: str = "num_hidden_layers") -> None:
    """Every pipeline stage needs at least one layer: ``num_layers >= pp_degree``. Call it before building a
    ``...Pipe`` model (Paddle's own check is an assertion deep inside ``PipelineLayer``)."""
    if pp_degree > 1 and num_layers < pp_degree:
        raise ValueError(
            f"{option}={num_layers} cannot be split over pipeline_parallel_degree={pp_degree} stages: every stage "
            f"needs at least one layer; use pipeline_parallel_degree <= {max(num_layers, 1)} or a deeper model")


def check_model_for_layout(model, degrees) -> None:
    """Refuse a model that is not built for the requested tensor/pipeline parallel layout.

    ``degrees``: ``args.parallel_degrees`` (``tp``/``pp`` attributes). Needs no process group, so the Trainer
    calls it before ``init_topology``. Checks:

    * pp > 1: the model is a ``PipelineLayer`` with ``pp`` stages, each holding at least one layer;
    * tp > 1: the model has tensor-parallel layers (``ColumnParallelLinear`` ...), and a PaddleNLP config's
      ``tensor_parallel_degree`` equals tp.
    """
    tp, pp = int(getattr(degrees, "tp", 1)), int(getattr(degrees, "pp", 1))
    name = type(model).__name__
    if pp > 1:
        from paddle.distributed.fleet.meta_parallel import PipelineLayer

        if not isinstance(model, PipelineLayer):
            raise ValueError(
                f"pipeline_parallel_degree={pp} needs a PipelineLayer model (e.g. LlamaForCausalLMPipe), but "
                f"{name} is a plain paddle.nn.Layer; build the ...Pipe variant of the model or use "
                f"pipeline_parallel_degree=1")
        stages = getattr(model, "_num_stages", None)
        if stages is not None and int(stages) != pp:
            raise ValueError(
                f"pipeline_parallel_degree={pp} but the {name} was built for {stages} stages; build it after the "
                f"training arguments (its num_stages must equal pipeline_parallel_degree)")
        parts = list(getattr(model, "segment_parts", None) or [])
        empty = [i for i in range(len(parts) - 1) if parts[i + 1] <= parts[i]]
        if empty:
            raise ValueError(
                f"pipeline_parallel_degree={pp}: {name} has {parts[-1] if parts else 0} layers split as "
                f"{parts}, which leaves stage(s) {empty} empty; every stage needs at least one layer")
    config = getattr(model, "config", None)
    if tp > 1:
        config_tp = getattr(config, "tensor_parallel_degree", None) if config is not None else None
        if config_tp is not None and int(config_tp) != tp:
            raise ValueError(
                f"tensor_parallel_degree={tp} but {name}.config.tensor_parallel_degree={config_tp}; set "
                f"config.tensor_parallel_degree = training_args.tensor_parallel_degree (and tensor_parallel_rank) "
                f"before building the model")
        if not _has_tp_layers(model):
            raise ValueError(
                f"tensor_parallel_degree={tp} needs a model built for tensor parallel (ColumnParallelLinear / "
                f"RowParallelLinear / VocabParallelEmbedding layers, e.g. a PaddleNLP model whose config has "
                f"tensor_parallel_degree={tp}), but {name} has none; use tensor_parallel_degree=1 or such a model")


def _has_tp_layers(model) -> bool:
    return any(type(m).__name__ in _TP_LAYER_NAMES for m in model.sublayers(include_self=True))


def check_batch_keys(model, keys: Iterable[str], popped: Sequence[str] = ()) -> None:
    """Raise when a batch holds keys ``model.forward`` does not accept (``remove_unused_columns=False``).

    ``popped``: keys the trainer removes before calling the model (the label names when a criterion is used).
    Models whose forward takes ``**kwargs`` and ``PipelineLayer`` models (they take one packed input) pass.
    """
    from .data import forward_argument_names

    try:
        from paddle.distributed.fleet.meta_parallel import PipelineLayer
    except ImportError:  # pragma: no cover
        PipelineLayer = ()
    if isinstance(model, PipelineLayer):
        return
    allowed = forward_argument_names(model)
    if allowed is None:
        return
    unexpected = sorted(set(keys) - set(allowed) - set(popped))
    if unexpected:
        params = ", ".join(n for n in allowed_in_order(model))
        raise ValueError(
            f"remove_unused_columns=False passes every batch key to the model, but {type(model).__name__}.forward"
            f"({params}) does not accept {unexpected}; drop or rename those columns, or set "
            f"remove_unused_columns=True to drop them automatically")


def allowed_in_order(model) -> list:
    import inspect

    return [n for n, p in inspect.signature(model.forward).parameters.items()
            if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]


def check_dataset(dataset, option: str = "train_dataset") -> None:
    """An empty map-style data set is an error naming the option (iterable data sets cannot be checked)."""
    if dataset is None or not has_length(dataset):  # paddle.io.IterableDataset.__len__ raises RuntimeError
        return
    if len(dataset) == 0:
        raise ValueError(f"{option} is empty (0 samples): there is nothing to "
                         f"{'train on' if option.startswith('train') else 'evaluate'}; check the data path and split")


def check_output_dir(args, resume_from_checkpoint=None) -> None:
    """Refuse to train into an ``output_dir`` that holds a previous run's checkpoints.

    Raises when ``args.do_train`` is set, ``overwrite_output_dir`` is False, no ``resume_from_checkpoint`` is
    given (argument or ``args.resume_from_checkpoint``) and ``output_dir`` has ``checkpoint-*`` directories —
    the new run's checkpoints would be interleaved with (and rotated against) the old ones.
    """
    if not getattr(args, "do_train", False) or getattr(args, "overwrite_output_dir", False):
        return
    resume = resume_from_checkpoint if resume_from_checkpoint is not None else getattr(args, "resume_from_checkpoint", None)
    if requested_resume(resume) is not None:
        return
    out = getattr(args, "output_dir", None)
    if not out or not os.path.isdir(out):
        return
    from .checkpoint import layout as L

    found = sorted((n for n in os.listdir(out) if L.parse_checkpoint_step(n) is not None),
                   key=lambda n: L.parse_checkpoint_step(n))
    if found:
        shown = ", ".join(found[-3:]) + (f" (+{len(found) - 3} more)" if len(found) > 3 else "")
        raise ValueError(
            f"output_dir={out!r} already holds checkpoints of a previous run ({shown}); pass "
            f"--resume_from_checkpoint true to continue it, --overwrite_output_dir to train over it, or choose "
            f"another output_dir")
