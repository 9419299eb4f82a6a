"""Data parallel (plain, outside hybrid layouts) with one copy of the gradients, and the ``no_sync`` context.

``paddle.DataParallel`` is not used: its C++ reducer allocates fused buffers the size of every gradient and
copies the gradients into them for the all-reduce and back, so each rank holds the gradients twice. Here (as
PyTorch DDP's ``gradient_as_bucket_view``) every trainable parameter's ``.grad`` is a view of a flat bucket:
backward accumulates into the buckets in place, and each bucket's all-reduce is launched (``sync_op=False``)
from a backward hook as soon as its last gradient is ready, so the communication overlaps the rest of the
backward pass (on GPU; gloo's CPU all-reduce runs in the calling thread, between the backward's kernels, as
Paddle's reducer does there). :meth:`GradientBuffers.sync` (``ParallelOptimizer.sync_gradients``) launches
what is left and waits. What Paddle's wrapper did besides is kept: the parameters and buffers are broadcast
from rank 0 at wrapping, the gradients are the mean over the dp ranks (each bucket scaled by 1/dp, then
summed, as Paddle's reducer does), ``no_sync`` skips the reduction of the backward passes inside it, and with
``find_unused_parameters`` a parameter that no rank used in the step keeps no gradient (the optimizer skips
it, as after a single process's backward).
"""
from __future__ import annotations

import contextlib
import weakref

import paddle
import paddle.distributed as dist

from .expert import broadcast_initial_state, is_expert
from .optimizer import ParallelOptimizer, flat_parameters
from .sharding import is_stage2_model, stage2_no_sync

__all__ = ["GradientBuffers", "apply_data_parallel", "gradient_buffers", "no_sync", "LocalOptimizer"]

MIB = 1 << 20
# paddle.DataParallel's defaults: the first bucket (the last parameters, whose gradients come first) is small
# so that the first all-reduce starts early; the others 25 MiB
FIRST_BUCKET_BYTES, BUCKET_BYTES = 1 * MIB, 25 * MIB
_ATTRIBUTE = "_paddletrainer_gradient_buffers"


class _Bucket:
    """One flat buffer of one dtype; ``slots``: ``(param, start, stop, address)``, each ``param.grad`` a view of
    ``buffer[start:stop]`` that begins at ``address``. (No view is kept: ``clear_gradient(False)`` on the
    parameter would free the storage of the tensor it was linked from.)"""

    __slots__ = ("buffer", "slots", "ready", "pending")

    def __init__(self, dtype, params):
        self.buffer = paddle.zeros([sum(int(p.numel()) for p in params)], dtype=dtype)
        base, size = self.buffer.data_ptr(), self.buffer.element_size()
        self.slots, start = [], 0
        for p in params:
            stop = start + int(p.numel())
            self.slots.append((p, start, stop, base + start * size))
            start = stop
        self.ready = [False] * len(params)
        self.pending = len(params)

    def view(self, slot):
        param, start, stop, _ = slot
        view = self.buffer._slice(start, stop)
        view.get_tensor()._set_dims(param.shape)
        return view

    def relink(self) -> None:
        """Make every parameter's ``.grad`` its view again (the values in the bucket stand)."""
        for slot in self.slots:
            grad = slot[0].grad
            if grad is None or grad.data_ptr() != slot[3]:
                slot[0]._copy_gradient_from(self.view(slot))

    def reset(self) -> None:
        self.ready = [False] * len(self.slots)
        self.pending = len(self.slots)


def _assign_buckets(params, first_bytes: int, bytes_per_bucket: int) -> list:
    """Parameters in reverse order (the order backward produces their gradients), cut per dtype into buckets
    of at least the cap (the first one opened: ``first_bytes``); returns the parameter lists, launch order."""
    buckets, open_by_dtype = [], {}
    for p in reversed(params):
        index = open_by_dtype.get(p.dtype)
        if index is None:
            index = open_by_dtype[p.dtype] = len(buckets)
            buckets.append([0, p.dtype, []])
        bucket = buckets[index]
        bucket[2].append(p)
        bucket[0] += int(p.numel()) * p.element_size()
        if bucket[0] >= (first_bytes if index == 0 else bytes_per_bucket):
            del open_by_dtype[p.dtype]
    return [(dtype, members) for _, dtype, members in buckets]


class GradientBuffers:
    """The gradients of ``model``'s trainable parameters as views of flat per-dtype buckets, all-reduced
    bucket by bucket during backward; see the module docstring.

    Buckets are launched strictly in their order, so every rank issues the same collectives in the same order
    even when a parameter gets no gradient on some rank (its bucket waits for :meth:`sync`). A bucket is
    reduced once per round: a forward pass that starts while a round is under way (a second backward without
    ``no_sync``) finishes it first, so the next backward reduces again (the mean of each backward's gradients,
    as ``paddle.DataParallel`` gives). Keep the views intact: clear with :meth:`zero`; a gradient found outside
    its view (``clear_gradient(True)`` makes the next backward *replace* it) is copied into it by the hook.
    """

    def __init__(self, model, *, group=None, degree: int, find_unused_parameters: bool = False,
                 first_bucket_bytes: int = FIRST_BUCKET_BYTES, bucket_bytes: int = BUCKET_BYTES,
                 leave_out_experts: bool = False):
        self._group = group
        self._scale = 1.0 / degree
        self._find_unused = find_unused_parameters
        # under expert parallel the expert parameters are reduced over their own (edp) group at step time
        # (expert.ExpertGradients); without it every rank holds every expert and they are reduced like the rest
        params = [p for p in model.parameters() if not p.stop_gradient and not (leave_out_experts and is_expert(p))]
        self._buckets = [_Bucket(dtype, members)
                         for dtype, members in _assign_buckets(params, first_bucket_bytes, bucket_bytes)]
        self._armed = True  # False inside no_sync
        self._next = 0  # the next bucket to launch this round
        self._tasks = []
        self._accumulated = False  # a backward added to the buckets since their last reduction
        self._replaced = False  # a hook found a gradient outside its view
        self._used = {}
        for b, bucket in enumerate(self._buckets):
            bucket.relink()
            for k, slot in enumerate(bucket.slots):
                slot[0]._register_backward_hook(self._hook(b, k))
        model.register_forward_pre_hook(self._before_forward)

    @property
    def buckets(self) -> list:
        """``[(flat buffer, [param, ...])]`` in launch order."""
        return [(bucket.buffer, [slot[0] for slot in bucket.slots]) for bucket in self._buckets]

    def _hook(self, b: int, k: int):
        """The backward hook of bucket ``b``'s ``k``-th parameter. Paddle keeps a tensor's hooks on the C++ side,
        where Python's collector cannot see them: a hook holding the parameter, its bucket or these buffers would
        keep them alive after the model is dropped. It holds a weak reference and two indices only."""
        owner = weakref.ref(self)

        def ready():  # after backward accumulated into param.grad
            buffers = owner()
            if buffers is not None:
                buffers._gradient_ready(b, k)

        return ready

    def _gradient_ready(self, b: int, k: int) -> None:
        bucket = self._buckets[b]
        slot = bucket.slots[k]
        param, address = slot[0], slot[3]
        self._accumulated = True
        if self._find_unused:
            self._used[id(param)] = True
        grad = param.grad
        if grad.data_ptr() != address:  # replaced: bring the values into the bucket
            self._replaced = True
            with paddle.no_grad():
                view = bucket.view(slot)
                view.copy_(grad if grad.dtype == view.dtype else grad.astype(view.dtype), False)
        if not self._armed or bucket.ready[k]:
            return
        bucket.ready[k] = True
        bucket.pending -= 1
        while self._next < len(self._buckets) and self._buckets[self._next].pending == 0:
            self._launch()

    def _launch(self) -> None:
        buffer = self._buckets[self._next].buffer
        buffer.scale_(self._scale)
        self._tasks.append(dist.all_reduce(buffer, group=self._group, sync_op=False))
        self._next += 1

    def _before_forward(self, layer, inputs):
        if self._next and paddle.is_grad_enabled():
            self._finish_round()

    @paddle.no_grad()
    def _finish_round(self) -> None:
        """Launch the buckets left (in order), wait for every all-reduce, relink replaced gradients."""
        while self._next < len(self._buckets):
            self._launch()
        for task in self._tasks:
            task.wait()
        self._tasks = []
        self._next = 0
        self._accumulated = False
        for bucket in self._buckets:
            bucket.reset()
            if self._replaced:
                bucket.relink()
        self._replaced = False

    @paddle.no_grad()
    def sync(self) -> None:
        """Finish the reduction of the gradients (the mean over the dp ranks); with ``find_unused_parameters``,
        drop the gradient of every parameter no rank used in this step."""
        if self._accumulated or self._next:
            self._finish_round()
        if self._find_unused:
            params = [slot[0] for bucket in self._buckets for slot in bucket.slots]
            flags = [1 if self._used.get(id(p)) else 0 for p in params]
            used = paddle.to_tensor(flags, dtype="int32")
            dist.all_reduce(used, group=self._group)
            # only a parameter this rank did not use can be unused on every rank: a rank that used all of them
            # reads nothing from the device (no host sync between logging steps; Paddle's reducer reads in C++)
            if not all(flags):
                for p, count in zip(params, used.tolist()):
                    if count == 0:
                        p.clear_gradient(False)  # relinked (zero) by the next zero()

    @paddle.no_grad()
    def zero(self) -> None:
        """Zero every gradient in place (the views stay) and start a new step; values a gradient holds
        outside its view (AMP's master gradients replace ``.grad`` at the step) are dropped."""
        for task in self._tasks:
            task.wait()
        self._tasks, self._next, self._accumulated, self._replaced, self._used = [], 0, False, False, {}
        for bucket in self._buckets:
            bucket.buffer.zero_()
            bucket.reset()
            bucket.relink()

    @contextlib.contextmanager
    def no_sync(self):
        """Backward passes inside accumulate without launching any reduction."""
        previous, self._armed = self._armed, False
        try:
            yield
        finally:
            self._armed = previous


def gradient_buffers(model):
    """The :class:`GradientBuffers` :func:`apply_data_parallel` attached to ``model``, or None."""
    return getattr(model, _ATTRIBUTE, None)


def apply_data_parallel(model, *, topology, find_unused_parameters: bool = False):
    """Plain data parallel (dp the sole axis): broadcast the parameters and buffers from rank 0 and attach a
    :class:`GradientBuffers` (:func:`gradient_buffers`); the model itself is returned, not wrapped.

    In hybrid layouts dp is not set up here: ``HybridParallelOptimizer`` all-reduces the dp gradients at step
    time (see :mod:`paddletrainer.parallel.apply`).
    """
    if topology.dp_degree == 1:
        return model
    if topology.use_hybrid:
        raise ValueError("apply_data_parallel sets up plain data parallel only; "
                         "hybrid layouts sync dp in the optimizer")
    # expert-aware: the ep ranks hold different experts, and sync_params_buffers skips the experts' no_sync flag
    broadcast_initial_state(model, topology)
    buffers = GradientBuffers(model, degree=topology.dp_degree, find_unused_parameters=find_unused_parameters,
                              leave_out_experts=topology.layout.ep > 1)
    object.__setattr__(model, _ATTRIBUTE, buffers)
    return model


def no_sync(model):
    """Context manager that skips the gradient reduction of the next backward passes.

    Use it around every micro-batch but the last of a gradient-accumulation step. It skips the reduction of
    what synchronises during backward: plain data parallel (:class:`GradientBuffers`), a
    ``paddle.DataParallel`` built by user code, and sharding stage 2 (:func:`~.sharding.stage2_no_sync`: one
    reduction per optimizer step instead of one per micro-batch). Fleet's hybrid optimizer synchronises at
    step time anyway; sharding stage 3 still reduces every backward (its hooks also release the gathered
    parameters; the sum of per-micro-batch reductions equals the reduction of the sum, so only traffic, not
    correctness, depends on it): nothing to skip.
    """
    buffers = gradient_buffers(model)
    if buffers is not None:
        return buffers.no_sync()
    if isinstance(model, paddle.DataParallel):
        return model.no_sync()
    if is_stage2_model(model):
        return stage2_no_sync(model)
    return contextlib.nullcontext()


class LocalOptimizer(ParallelOptimizer):
    """:class:`~.optimizer.ParallelOptimizer` of one process, or of plain data parallel: ``dp_buffers`` (the
    model's :class:`GradientBuffers`) finish their reduction in :meth:`sync_gradients` and are zeroed in place by
    :meth:`clear_grad`."""

    MODE = "local"

    def __init__(self, optimizer, *, topology, dp_buffers=None, expert_grads=None):
        super().__init__(optimizer, topology=topology, expert_grads=expert_grads)
        self._dp_buffers = dp_buffers

    def sync_gradients(self) -> None:
        if self._synced:
            return
        if self._dp_buffers is not None:
            with paddle.no_grad():
                self._dp_buffers.sync()  # waits for the all-reduces the backward hooks launched, launches the rest
        self._finish_sync()

    def step(self) -> None:
        self.sync_gradients()
        with paddle.no_grad():
            self._optimizer.step()

    def clear_grad(self, set_to_zero: bool = True) -> None:
        self._synced = False
        if self._dp_buffers is None:
            self._optimizer.clear_grad(set_to_zero)
            return
        self._dp_buffers.zero()  # in place: the gradients stay views of the all-reduce buckets
        if self._expert_grads is not None:  # not in the buckets
            self._expert_grads.zero(set_to_zero)

    def named_counted_gradients(self) -> list:
        return self._counted([(p, p.grad, True) for p in flat_parameters(self._optimizer._parameter_list)])
