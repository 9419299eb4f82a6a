"""The host copy an async save writes, taken while the next forward/backward runs.

Why the copy can wait: between a save and the next ``optimizer.step()`` the training loop writes
activations and gradients, never parameters, optimizer states or master weights (the step writes those
in place). So the save call only records *where* each of those tensors' bytes are; a background thread
copies them while the next step's forward/backward runs, and the Trainer waits for that copy right before
the next optimizer step (:meth:`HostSnapshot.wait_until_taken`, via ``Checkpointer.wait_for_snapshot``).
That is a contract on everything else the loop runs in between, callbacks included: code that writes
parameters, optimizer states or master weights in place there (an ``on_save`` callback that edits weights)
must call ``wait_for_snapshot`` first, or its values leak into the saved step.

What is copied in the save call instead, because the forward/backward does change it: model buffers
(BatchNorm statistics; sharding stage 2 broadcasts buffers in every forward) and anything that is not a
parameter or an optimizer state. RNG, LR scheduler, loss scaler and trainer state are serialised to bytes
in the call as well (see ``io``).

Where a tensor's bytes are:

* a host tensor: a zero-copy NumPy view (DLPack). The view holds the allocation, so sharding stage 3,
  which clears a slice's ``fw_storage`` while it gathers the full parameter in the forward and makes a
  new slice afterwards, cannot free the memory being copied; the step then writes the new slice.
* a device tensor (GPU): a device→host copy into pinned memory, queued on a side stream after an event
  recorded on the compute stream; the wait point makes the compute stream wait for the copy's event (no
  host stall), and the writer thread waits for that event before reading the pinned memory. This path
  cannot run on a CPU build, so no test here covers it (``paddletrainer-gpu-smoke`` saves asynchronously).

Host buffers are reused by the next async save when names, shapes and dtypes match: the first touch of
fresh memory (page faults) costs several times a copy into memory already mapped.

The host copy is a list of chunks (``COPY_CHUNK`` bytes at most; NumPy releases the GIL while it copies
one, so the training thread's Python keeps running). The writer thread starts on them at once; a training
thread that reaches the wait point before they are done copies the remaining chunks itself instead of
sleeping (two threads take chunks from one counter, so each chunk is copied once): when the forward/backward
was shorter than the copy, the rest finishes sooner, with the CPU time the waiting thread had.
"""

from __future__ import annotations

import itertools
import threading
from typing import Dict, List, Optional, Tuple

import numpy as np
import paddle

from .local_state import LocalTensor, host_array

Buffers = Dict[Tuple[str, str], np.ndarray]


class _DeviceCopy:
    """A device tensor's device→host copy into pinned memory on a side stream (GPU builds only)."""

    _side_stream = None

    def __init__(self, tensor, numel: int):
        if _DeviceCopy._side_stream is None:
            _DeviceCopy._side_stream = paddle.device.Stream()
        stream = _DeviceCopy._side_stream
        ready = paddle.device.Event()
        ready.record(paddle.device.current_stream())  # the step that produced the tensor is queued before
        stream.wait_event(ready)
        with paddle.device.stream_guard(stream):
            self.pinned = tensor.detach()._copy_to(paddle.CUDAPinnedPlace(), False)
        self.done = paddle.device.Event()
        self.done.record(stream)
        self.source = tensor  # kept alive until the copy is done: the caching allocator must not reuse it
        self.numel = numel

    def let_compute_wait(self) -> None:
        paddle.device.current_stream().wait_event(self.done)

    def array(self) -> np.ndarray:
        self.done.synchronize()
        self.source = None
        arr = host_array(self.pinned, copy=False)
        return arr.reshape(-1)[: self.numel] if arr.size != self.numel else arr


COPY_CHUNK = 8 << 20  # bytes per copy job: small enough to share the copy between two threads


class HostSnapshot:
    """Host arrays of ``{file: {file key: LocalTensor}}``, complete once :meth:`take` has run.

    ``deferred=False`` (sync save): arrays are views of the tensors' own memory, nothing is copied (the
    caller writes before anything changes them). ``deferred=True``: see the module docstring; ``buffers``
    are the previous async snapshot's host arrays, reused where name, shape and dtype match.
    """

    def __init__(self, tensors: Dict[str, Dict[str, LocalTensor]], deferred: bool,
                 buffers: Optional[Buffers] = None):
        device: Dict[Tuple[str, str], _DeviceCopy] = {}
        self.arrays: Dict[str, Dict[str, np.ndarray]] = {f: {} for f in tensors}
        self._used: Buffers = {}  # host buffers of this snapshot, handed to the next one by take()
        self._jobs: List[Tuple[np.ndarray, np.ndarray]] = []  # (destination bytes, source bytes) chunks
        buffers = buffers or {}
        for fname, by_key in tensors.items():
            for fkey, lt in by_key.items():
                if not deferred:
                    self.arrays[fname][fkey] = lt.host_array(copy=False)
                elif lt.forward_may_write:
                    self.arrays[fname][fkey] = lt.host_array(copy=True)
                elif _on_device(lt.tensor):
                    device[(fname, fkey)] = _DeviceCopy(lt.tensor, lt.placement.local_numel)
                else:
                    view = lt.host_array(copy=False)
                    buf = buffers.get((fname, fkey))
                    if buf is None or buf.shape != view.shape or buf.dtype != view.dtype:
                        buf = np.empty(view.shape, dtype=view.dtype)  # mapped on first write, by the copy
                    self.arrays[fname][fkey] = self._used[(fname, fkey)] = buf
                    src, dst = _bytes_of(view), _bytes_of(buf)
                    self._jobs.extend((dst[lo: lo + COPY_CHUNK], src[lo: lo + COPY_CHUNK])
                                      for lo in range(0, max(src.nbytes, 1), COPY_CHUNK))
        self._device = tuple(device.items())  # read by both threads, never changed
        self._next = itertools.count()  # the next job to start; next() is atomic under the GIL
        self._lock = threading.Lock()
        self._left = len(self._jobs)  # jobs not finished yet (under the lock)
        self._error: Optional[BaseException] = None
        self._taken = threading.Event()
        if not self._jobs:
            self._taken.set()

    def _copy_jobs(self) -> None:
        """Copy chunks until none is left to start (either thread); never raises (see :meth:`take`)."""
        jobs = self._jobs  # take() drops self._jobs once an error sets the event; this thread may still index
        while not self._taken.is_set():
            i = next(self._next)
            if i >= len(jobs):
                return
            dst, src = jobs[i]
            try:
                _copy_chunk(dst, src)
            except BaseException as e:  # noqa: BLE001 - stops both threads; raised by take(), in the writer
                self._error = self._error or e
                self._taken.set()
                return
            with self._lock:
                self._left -= 1
                if self._left == 0:
                    self._taken.set()

    def take(self) -> Buffers:
        """Copy what is still only referenced (writer thread); returns the host buffers for reuse.

        Raises the first copy error of either thread; the taken event is then already set, so the
        training thread never waits forever (the error surfaces when the save is finished).
        """
        self._copy_jobs()
        self._taken.wait()  # the training thread may still be copying its last chunk
        self._jobs = []  # drop the references to the tensors' memory
        if self._error is not None:
            raise self._error
        for (fname, fkey), copy in self._device:
            self.arrays[fname][fkey] = copy.array()
        return self._used

    def wait_until_taken(self) -> None:
        """Block until every host tensor is copied, copying the chunks nobody has started yet; queue the
        compute stream behind the device copies."""
        for _, copy in self._device:
            copy.let_compute_wait()
        self._copy_jobs()
        self._taken.wait()


def _copy_chunk(dst: np.ndarray, src: np.ndarray) -> None:
    """One copy job (NumPy releases the GIL for it); tests slow it down to watch the threads share the copy."""
    np.copyto(dst, src)


def _bytes_of(arr: np.ndarray) -> np.ndarray:
    """The flat bytes of a C-contiguous array (a view)."""
    return arr.reshape(-1).view(np.uint8)


def _on_device(t) -> bool:
    return not (t.place.is_cpu_place() or t.place.is_cuda_pinned_place())
