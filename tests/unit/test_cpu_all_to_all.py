"""The gloo all-to-all fill (paddletrainer/parallel/cpu/all_to_all.py) without processes: its Paddle/PaddleNLP
assumption checks, where it installs, and its exchange logic over a simulated group (threads standing in for
ranks, all_gather by a barrier). The real multi-process runs are tests/distributed/test_long_context_ops.py."""
import threading

import numpy as np
import paddle
import paddle.distributed as dist
import pytest

from paddletrainer.parallel.cpu import all_to_all as a2a


def test_paddle_and_paddlenlp_still_look_the_way_the_fill_assumes():
    a2a.check_paddle_assumptions()


def test_a_changed_paddle_helper_signature_fails_the_check_naming_this_file(monkeypatch):
    module = a2a._stream_module()

    def moved(out_tensor, in_tensor, split_sizes, group, sync_op, use_calc_stream):  # one list for both
        return None

    monkeypatch.setattr(module, "_alltoall_single_in_dygraph", moved)
    with pytest.raises(RuntimeError, match=r"paddletrainer/parallel/cpu/all_to_all.py[\s\S]*"
                                           r"_alltoall_single_in_dygraph\(out_tensor, in_tensor, out_split_sizes"):
        a2a.check_paddle_assumptions()


def test_a_public_alltoall_with_swapped_arguments_fails_the_check(monkeypatch):
    def alltoall(in_tensor_list, out_tensor_list, group=None, sync_op=True):  # the pre-3.0 order
        return None

    monkeypatch.setattr(dist, "alltoall", alltoall)
    with pytest.raises(RuntimeError, match="paddle.distributed.alltoall"):
        a2a.check_paddle_assumptions()


def test_a_paddlenlp_that_fixed_the_reshard_order_fails_the_check(monkeypatch):
    from paddlenlp.transformers import segment_parallel_utils as spu

    monkeypatch.setattr(spu, "_reshard_qkv", a2a.reshard_qkv)  # our order: PaddleNLP's later fix
    monkeypatch.delattr(a2a.reshard_qkv, "__wrapped_paddle__", raising=False)
    with pytest.raises(RuntimeError, match="drop install_paddlenlp_reshard_order_fix"):
        a2a.check_paddle_assumptions()


def test_install_refuses_a_build_with_an_accelerator(monkeypatch):
    monkeypatch.setattr(a2a, "has_accelerator", lambda: True)
    with pytest.raises(RuntimeError, match="all_to_all.py: the gloo all-to-all fill is for CPU-only"):
        a2a.install_all_to_all()


def test_install_replaces_exactly_paddles_three_dygraph_helpers_once(monkeypatch):
    module = a2a._stream_module()
    originals = {name: getattr(module, name) for name, _ in a2a._FILLS}
    for name, original in originals.items():
        monkeypatch.setattr(module, name, original)  # restored after the test
    a2a.install_all_to_all()
    a2a.install_all_to_all()
    for name, fill in a2a._FILLS:
        assert getattr(module, name) is fill
        assert fill.__wrapped_paddle__ is originals[name]  # idempotent: never wraps itself


class _VirtualGroup:
    """A group of ``n`` thread-ranks whose all_gather meets at a barrier."""

    def __init__(self, n):
        self.nranks, self.slots, self.barrier = n, [None] * n, threading.Barrier(n)
        self.local = threading.local()

    @property
    def rank(self):
        return self.local.rank

    def all_gather(self, out, tensor, group=None):
        self.barrier.wait()
        self.slots[self.rank] = tensor.clone()
        self.barrier.wait()
        out.extend(t.clone() for t in self.slots)
        self.barrier.wait()


def _run_ranks(monkeypatch, n, body):
    group = _VirtualGroup(n)
    monkeypatch.setattr(dist, "all_gather", group.all_gather)
    results, errors = [None] * n, []

    def run(r):
        group.local.rank = r
        try:
            results[r] = body(group, r)
        except Exception as exc:  # noqa: BLE001 - re-raised in the main thread
            errors.append(exc)
            group.barrier.abort()

    threads = [threading.Thread(target=run, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    if errors:
        raise errors[0]
    return results


@pytest.mark.parametrize("n", [2, 3])
def test_exchange_delivers_every_piece_with_unequal_and_empty_sizes(monkeypatch, n):
    sizes = lambda k, j: (k + 2 * j) % 3  # noqa: E731 - includes empty pieces
    pieces = [[np.arange(sizes(k, j)) + 100 * k + 10 * j for j in range(n)] for k in range(n)]

    def body(group, r):
        got = a2a.exchange([paddle.to_tensor(p, dtype="int64") for p in pieces[r]], group)
        return [g.numpy() for g in got]

    for r, got in enumerate(_run_ranks(monkeypatch, n, body)):
        for k in range(n):
            np.testing.assert_array_equal(got[k], pieces[k][r])


def test_exchange_refuses_a_piece_count_that_is_not_the_group_size(monkeypatch):
    def body(group, r):
        return a2a.exchange([paddle.ones([2])], group)

    with pytest.raises(ValueError, match="1 pieces for a group of 2 ranks"):
        _run_ranks(monkeypatch, 2, body)


def test_alltoall_single_fill_checks_out_split_sizes_against_what_arrived(monkeypatch):
    def body(group, r):  # both ranks send rows [2, 1]; rank 0 wrongly expects 1 row from rank 1
        out_split = [2, 1] if r == 0 else [1, 1]
        out = paddle.empty([sum(out_split), 2])
        a2a._alltoall_single_in_dygraph(out, paddle.ones([3, 2]), out_split, [2, 1], group, True, False)

    with pytest.raises(ValueError, match=r"out_split_sizes\[1\] = 1 rows but rank 1 sent 2"):
        _run_ranks(monkeypatch, 2, body)
