"""Plain data parallel holds one copy of the gradients (``parallel.data_parallel.GradientBuffers``).

One process; the all-reduce is replaced by what two ranks return when the other rank's gradients are all zero:
the bucket's sum after the 1/dp scale, i.e. half this rank's gradient. A reduction that is missed leaves the
whole gradient, one done twice leaves a quarter, so every value below checks that each backward's gradients were
reduced exactly once. Every gradient must stay a view of its bucket through backward, accumulation, the sync and
the clear; the buckets are launched from the backward hooks, in order, and not inside ``no_sync``.
"""
from __future__ import annotations

import numpy as np
import paddle
import pytest

from paddletrainer.parallel import data_parallel
from paddletrainer.parallel.data_parallel import GradientBuffers, no_sync


WAITS = []


class _Done:
    def wait(self):
        WAITS.append(1)
        return True


@pytest.fixture(autouse=True)
def launches(monkeypatch):
    """The address of each all-reduced bucket, in call order."""
    calls = []
    WAITS.clear()

    def all_reduce(tensor, group=None, sync_op=True):
        calls.append(tensor.data_ptr())
        return _Done()  # the other rank holds zeros: the sum is this rank's scaled bucket, unchanged

    monkeypatch.setattr(data_parallel.dist, "all_reduce", all_reduce)
    return calls


class Net(paddle.nn.Layer):
    def __init__(self):
        super().__init__()
        self.a = paddle.nn.Linear(4, 3)
        self.b = paddle.nn.Linear(3, 2)
        self.unused = paddle.nn.Linear(2, 2)

    def forward(self, x):
        return self.b(self.a(x)).sum()


def _inside(buffers, param) -> bool:
    grad = param.grad
    for buffer, _ in buffers.buckets:
        start = buffer.data_ptr()
        if grad is not None and start <= grad.data_ptr() < start + int(buffer.numel()) * buffer.element_size():
            return True
    return False


def _every_parameter(net, x):
    return net(x) + net.unused(paddle.ones([1, 2])).sum()


def _reference(x, backwards=1, loss=Net.__call__):
    """One process's accumulated gradients over ``backwards`` backward passes of ``loss(net, x)``."""
    paddle.seed(1)
    net = Net()
    for _ in range(backwards):
        loss(net, x).backward()
    return {n: (np.zeros(p.shape, "float32") if p.grad is None else p.grad.numpy()) for n, p in net.named_parameters()}


def _net_and_buffers(**options):
    paddle.seed(1)
    net = Net()
    return net, GradientBuffers(net, degree=2, **options)


def _assert_grads(net, buffers, expected, factor):
    for name, p in net.named_parameters():
        assert _inside(buffers, p), name
        np.testing.assert_allclose(p.grad.numpy(), expected[name] * factor, rtol=1e-6, err_msg=name)


def test_buckets_are_cut_in_reverse_parameter_order_with_a_small_first_bucket():
    net, buffers = _net_and_buffers(first_bucket_bytes=1, bucket_bytes=40)
    params = [p for _, members in buffers.buckets for p in members]
    assert params == list(reversed(list(net.parameters())))
    sizes = [[int(p.numel()) for p in members] for _, members in buffers.buckets]
    assert sizes == [[2], [4, 2, 6], [3, 12]]  # 4 bytes >= 1; 48 >= 40; the rest
    assert sum(int(b.numel()) for b, _ in buffers.buckets) == sum(int(p.numel()) for p in params)


def test_each_bucket_is_launched_from_backward_once_its_gradients_are_ready(launches):
    x = paddle.to_tensor(np.arange(8, dtype="float32").reshape(2, 4))
    net, buffers = _net_and_buffers(first_bucket_bytes=1, bucket_bytes=1)  # one bucket per parameter
    order = [b.data_ptr() for b, _ in buffers.buckets]
    _every_parameter(net, x).backward()
    assert launches == order  # every bucket launched by the backward hooks, in launch order
    buffers.sync()
    assert launches == order  # the sync only waits

    buffers.zero()
    launches.clear()
    net(x).backward()
    # the unused layer's buckets come first in launch order, so nothing may start before the sync (the same
    # collectives in the same order on every rank, whichever parameters this rank used)
    assert launches == []
    buffers.sync()
    assert launches == order
    _assert_grads(net, buffers, _reference(x), 0.5)


def test_no_sync_accumulates_and_the_last_backward_reduces_the_sum_once(launches):
    x = paddle.to_tensor(np.arange(8, dtype="float32").reshape(2, 4))
    net, buffers = _net_and_buffers()
    with no_sync(net):
        net(x).backward()
        net(x).backward()
    assert launches == []
    net(x).backward()
    buffers.sync()
    buffers.sync()  # idempotent until the next backward
    _assert_grads(net, buffers, _reference(x, backwards=3), 0.5)
    buffers.zero()
    assert all(_inside(buffers, p) and not p.grad.numpy().any() for p in net.parameters())


def test_a_forward_after_a_launched_backward_waits_for_it_and_the_next_backward_reduces_again(launches):
    """Without no_sync each backward is reduced (the mean of each one's gradients, as paddle.DataParallel gives),
    and no backward writes into a bucket whose all-reduce may still run."""
    x = paddle.ones([2, 4])
    net, buffers = _net_and_buffers()
    _every_parameter(net, x).backward()
    assert len(launches) == 1 and WAITS == []
    loss = _every_parameter(net, x)
    assert WAITS == [1]  # the forward waited for the first backward's all-reduce
    loss.backward()
    assert len(launches) == 2
    buffers.sync()
    # fake reduction (the other rank holds zeros): 0.5 g after the first, (0.5 g + g) / 2 after the second
    _assert_grads(net, buffers, _reference(x, loss=_every_parameter), 0.75)


def test_a_gradient_that_left_its_view_is_copied_back_by_the_hook():
    x = paddle.ones([2, 4])
    net, buffers = _net_and_buffers()
    net.a.weight.clear_gradient(True)  # "fake empty": the next backward replaces the view with a new tensor
    net(x).backward()
    assert not _inside(buffers, net.a.weight)
    buffers.sync()
    _assert_grads(net, buffers, _reference(x), 0.5)


def test_find_unused_parameters_leaves_no_gradient_on_a_parameter_no_rank_used(monkeypatch):
    net, buffers = _net_and_buffers(find_unused_parameters=True)
    net(paddle.ones([2, 4])).backward()
    buffers.sync()
    assert net.unused.weight.grad is None and net.unused.bias.grad is None
    assert net.a.weight.grad is not None and _inside(buffers, net.a.weight)
    buffers.zero()  # the next step starts with every view linked again
    assert _inside(buffers, net.unused.weight)


def test_zero_relinks_a_gradient_replaced_at_the_step_and_leaves_it_zero():
    """AMP's master gradients replace ``.grad`` by a new float32 tensor at the step; the clear that follows
    must give back a zero view, not copy the stale values into the bucket."""
    net, buffers = _net_and_buffers()
    net(paddle.ones([2, 4])).backward()
    buffers.sync()
    net.a.weight._copy_gradient_from(paddle.ones(net.a.weight.shape))  # what the step's replacement does
    assert not _inside(buffers, net.a.weight)
    buffers.zero()
    assert _inside(buffers, net.a.weight) and not net.a.weight.grad.numpy().any()


def test_dropping_a_model_with_gradient_buffers_frees_its_parameters():
    # Paddle keeps a tensor's backward hooks on the C++ side, out of the collector's sight: a hook holding its
    # parameter (or the buffers) would keep every weight and bucket alive after the model is dropped.
    import gc
    import weakref

    model = paddle.nn.Linear(4, 4)
    model._paddletrainer_test_buffers = GradientBuffers(model, degree=1)
    weight = weakref.ref(model.weight)
    del model
    gc.collect()
    assert weight() is None
