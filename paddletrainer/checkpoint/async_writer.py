"""One background writer thread per :class:`~.io.Checkpointer`, kept for the run.

Why a thread and not a process: the tensors are already host numpy copies (or views) when a job is
submitted, and file writes release the GIL, so a thread overlaps I/O with the next training steps without
pickling gigabytes into another process. At most one save is in flight: ``submit`` waits for the previous
one, which bounds the host memory used by snapshots to one checkpoint.

Why one long-lived thread: starting a thread waits until the new thread runs, which on a busy machine is a
scheduler slice (several ms) inside the save call the training thread waits for; handing a job to an idle
thread does not wait. Like the non-daemon thread this was, ``concurrent.futures`` joins its worker at
interpreter exit, so a write in flight still finishes instead of leaving a torn file.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Optional


class AsyncWriter:
    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="paddletrainer-ckpt-writer")
        self._job: Optional[Future] = None

    def submit(self, fn: Callable[[], Any]) -> None:
        """Run ``fn`` in the background (after finishing the previous job; its errors surface here)."""
        self.wait()
        self._job = self._pool.submit(fn)

    def wait(self) -> Any:
        """Block until the current job is done; return its result or raise its exception."""
        if self._job is None:
            return None
        job, self._job = self._job, None
        return job.result()
