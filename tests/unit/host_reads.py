"""``HostReadCounter``: a Trainer callback that counts device→host reads per optimizer step.

Shared by tests/unit/test_no_host_reads_between_logging_steps.py and the pp2 worker
(tests/distributed/workers/host_reads_worker.py). While installed it wraps the ``paddle.Tensor`` methods through
which Python gets a tensor's value (``numpy``, ``item``, ``tolist``, ``__float__``, ``__int__``, ``__bool__``,
``__index__``, ``__array__``, ``__format__``, ``cpu``); on a GPU each of them waits for the device queue to drain.
On this CPU build every tensor is a host tensor, so every such call is counted, as the GPU would count it.

A read is attributed to the step that is running: from ``on_step_begin`` of step N up to ``on_step_begin`` of
step N+1, so step N's logging (after its ``on_step_end``) counts for step N. ``on_log`` records which steps logged.
Reads from inside the model's own code go to ``model_reads`` instead (see ``MODEL_CODE``).
"""
from __future__ import annotations

import traceback
from collections import defaultdict

import paddle

from paddletrainer import TrainerCallback

#: reads made inside the model's own code (e.g. PaddleNLP's Llama loss tests ``if count == 0``) are the model's,
#: not the training loop's: they are kept apart in ``model_reads``
MODEL_CODE = "/paddlenlp/transformers/"
READ_METHODS = ("numpy", "item", "tolist", "__float__", "__int__", "__bool__", "__index__", "__array__",
                "__format__", "cpu")


class HostReadCounter(TrainerCallback):
    """Counts reads per step (``reads[step]``: one short stack per read) and records ``logged_steps``."""

    def __init__(self):
        self.reads = defaultdict(list)
        self.model_reads = defaultdict(list)
        self.logged_steps = set()
        self.step = 0  # reads before the first step (setup) go to step 0
        self._originals = {}
        self._inside = False

    # -- patching -------------------------------------------------------------------------------------
    def install(self) -> "HostReadCounter":
        for name in READ_METHODS:
            original = getattr(paddle.Tensor, name, None)
            if original is None:
                continue
            self._originals[name] = original
            setattr(paddle.Tensor, name, self._wrap(name, original))
        return self

    def uninstall(self) -> None:
        for name, original in self._originals.items():
            setattr(paddle.Tensor, name, original)
        self._originals.clear()

    def _wrap(self, name, original):
        counter = self

        def read(tensor, *args, **kwargs):
            if counter._inside:  # float() calling numpy() is one read, not two
                return original(tensor, *args, **kwargs)
            counter._inside = True
            try:
                stack = traceback.extract_stack()[:-1]
                where = " <- ".join(f"{f.filename.rsplit('/', 2)[-1]}:{f.lineno} {f.name}" for f in stack[::-1][:4])
                in_model = any(MODEL_CODE in f.filename for f in stack)
                (counter.model_reads if in_model else counter.reads)[counter.step].append(f"Tensor.{name} at {where}")
                return original(tensor, *args, **kwargs)
            finally:
                counter._inside = False

        read.__name__ = name
        return read

    # -- attribution ----------------------------------------------------------------------------------
    def on_step_begin(self, args, state, control, **kwargs):
        self.step = state.global_step + 1

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "loss" in logs:
            self.logged_steps.add(state.global_step)

    def reads_outside_logging_steps(self, max_steps: int, first: int = 1) -> dict:
        """``{step: [read, ...]}`` for every step first..max_steps that did not log and read anything (outside
        the model's code)."""
        return {s: self.reads[s] for s in range(first, max_steps + 1) if s not in self.logged_steps and self.reads[s]}
