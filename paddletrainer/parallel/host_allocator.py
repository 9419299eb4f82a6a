"""Host memory that stage 3 frees goes back to the system: glibc's mmap threshold held at its default.

Paddle's CPU build allocates every tensor with ``posix_memalign``. glibc serves a request of at least its mmap
threshold (128 KiB by default) with its own ``mmap`` and unmaps it on free, but it raises the threshold to the
size of every such block freed (up to 32 MiB), so that later requests below it come from the heap, which keeps
freed memory resident for reuse. Stage 3 is the pattern that defeats this: once the unsliced model is freed at
wrapping, the threshold sits at the largest weight matrix, and every gathered parameter, gradient and slice of
the same size class is carved from a heap whose holes (between the slices that live on) are never returned.
On the 168M Llama on 2 CPU ranks that slack was ~330 MiB of the peak (docs/benchmarks.md, "Sharding stage 3").

:func:`hold_mmap_threshold` sets the threshold explicitly (``mallopt(M_MMAP_THRESHOLD)``), which also turns
the dynamic raise off: a tensor of 128 KiB or more is then resident only while it is alive. It must come before
the model is built: glibc maps only what its heap cannot serve, so a heap grown by the unsliced model would go
on serving the gathered tensors from its holes (``init_topology`` holds it when the layout has stage 3).
:func:`return_free_heap` hands the heap's free pages back (``malloc_trim``), for a model built before that. The cost is a fresh mapping (and its page
faults) per such tensor. Neither changes a value computed. Other C libraries have neither call: there
:func:`hold_mmap_threshold` returns False and the memory behaves as that library decides.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools

__all__ = ["hold_mmap_threshold", "return_free_heap", "MMAP_THRESHOLD_BYTES"]

MMAP_THRESHOLD_BYTES = 128 * 1024  # glibc's own default, kept from rising
_M_MMAP_THRESHOLD = -3  # malloc.h


@functools.lru_cache(maxsize=1)
def _glibc():
    """The process's C library if it is glibc (it has ``mallopt`` and ``malloc_trim``), else None."""
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    libc = ctypes.CDLL(name)
    if not (hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim")):
        return None
    return libc


def hold_mmap_threshold(threshold: int = MMAP_THRESHOLD_BYTES) -> bool:
    """Serve every allocation of ``threshold`` bytes or more by its own mapping from now on, in this process.

    Returns True when set; False when the C library is not glibc (nothing changed)."""
    if threshold <= 0:
        raise ValueError(f"hold_mmap_threshold: threshold must be a positive byte count, got {threshold}")
    libc = _glibc()
    if libc is None:
        return False
    if libc.mallopt(ctypes.c_int(_M_MMAP_THRESHOLD), ctypes.c_int(threshold)) != 1:
        raise OSError(f"mallopt(M_MMAP_THRESHOLD, {threshold}) failed")
    return True


def return_free_heap() -> bool:
    """Give the heap's free pages back to the system now (``malloc_trim(0)``). False when not glibc."""
    libc = _glibc()
    if libc is None:
        return False
    libc.malloc_trim(ctypes.c_size_t(0))
    return True
