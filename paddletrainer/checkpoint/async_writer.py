"""One background writer thread per process.

Why a thread and not a process: the tensors are already host numpy copies when a job is submitted, and
file writes release the GIL, so a thread overlaps I/O with the next training steps without pickling
gigabytes into another process. At most one save is in flight: ``submit`` waits for the previous one,
which bounds the host memory used by snapshots to one checkpoint.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Optional


class AsyncWriter:
    def __init__(self) -> None:
        self._thread: Optional[threading.Thread] = None
        self._result: Any = None
        self._error: Optional[BaseException] = None

    @property
    def busy(self) -> bool:
        return self._thread is not None

    def submit(self, fn: Callable[[], Any]) -> None:
        """Run ``fn`` in the background (after finishing the previous job; its errors surface here)."""
        self.wait()

        def run():
            try:
                self._result = fn()
            except BaseException as e:  # re-raised in the training thread by wait()
                self._error = e

        self._result, self._error = None, None
        # non-daemon: an interpreter exit still lets the write finish instead of leaving a torn file
        self._thread = threading.Thread(target=run, name="paddletrainer-ckpt-writer", daemon=False)
        self._thread.start()

    def wait(self) -> Any:
        """Block until the current job is done; return its result or raise its exception."""
        if self._thread is None:
            return None
        self._thread.join()
        self._thread = None
        err, self._error = self._error, None
        if err is not None:
            raise err
        return self._result
