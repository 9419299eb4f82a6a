"""A wall-clock bound for a block of test code that could hang (a blocking open of a FIFO, a runaway walk)."""
from __future__ import annotations

import contextlib
import signal


@contextlib.contextmanager
def within(seconds: int):
    """Raise TimeoutError in the block after ``seconds`` (a blocking open of a FIFO is interrupted by SIGALRM)."""
    def expire(*_):
        raise TimeoutError(f"still blocked after {seconds} s")
    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
