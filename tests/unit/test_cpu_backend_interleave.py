"""The CPU backend's interleaved-pipeline fill (``parallel/cpu/interleave.py``): the interleaved pipeline's p2p over blocking
send/recv (no processes).

Each pipeline stage is a thread; a fake gloo send blocks until the peer's matching recv takes the tensor, as
gloo's does (measured: two processes that both send first time out). The steady-phase exchange of the
interleaved schedule (every stage sends an activation to the next and a gradient to the previous stage, and
receives both) must neither block nor mix the messages up — on two stages, where prev and next are one peer,
and on a four-stage ring.
"""
import queue
import threading

import paddle
import pytest

from paddletrainer.parallel.cpu import interleave as cpu_interleave


class FakeHcg:
    def __init__(self, stage, stages):
        self.stage, self.stages = stage, stages

    def get_stage_id(self):
        return self.stage

    def _get_p2p_prev_rank(self):
        return (self.stage - 1) % self.stages

    def _get_p2p_next_rank(self):
        return (self.stage + 1) % self.stages

    def get_pipe_parallel_group(self):
        return None

    def get_model_parallel_world_size(self):
        return 1

    def get_model_parallel_rank(self):
        return 0

    def get_model_parallel_group(self):
        return None


class BlockingWire:
    """send(src→dst) hands the tensor over and waits until dst's recv took it; recv copies it in."""

    def __init__(self, stages, timeout=5.0):
        self.channels = {(a, b): queue.Queue(maxsize=1) for a in range(stages) for b in range(stages) if a != b}
        self.me = threading.local()
        self.timeout = timeout

    def send(self, tensor, group, dst, nranks=1, rank_id=0):
        done = threading.Event()
        self.channels[(self.me.rank, dst)].put((tensor.numpy().copy(), done), timeout=self.timeout)
        if not done.wait(self.timeout):
            raise TimeoutError(f"stage {self.me.rank}: send to {dst} never received")

    def recv(self, tensor, group, src, nranks=1, rank_id=0):
        value, done = self.channels[(src, self.me.rank)].get(timeout=self.timeout)
        paddle.assign(paddle.to_tensor(value), tensor)
        done.set()


def run_steady_exchange(stages, monkeypatch, timeout=5.0):
    """Every stage: send activation (value 100·stage+1) to next, gradient (100·stage+2) to prev; receive both."""
    from paddle.distributed.fleet.meta_parallel.pp_utils import p2p_communication as p2p

    wire = BlockingWire(stages, timeout)
    monkeypatch.setattr(p2p, "_send_on_calc_stream", wire.send)
    monkeypatch.setattr(p2p, "_recv_on_calc_stream", wire.recv)
    exchange = cpu_interleave._make_batched_p2p_ops(p2p._batched_p2p_ops)
    got, errors = {}, []

    def stage(rank):
        wire.me.rank = rank
        activation = paddle.full([2, 3], 100.0 * rank + 1)
        gradient = paddle.full([2, 3], 100.0 * rank + 2)
        from_prev, from_next = paddle.zeros([2, 3]), paddle.zeros([2, 3])
        try:
            exchange(gradient, from_prev, activation, from_next, FakeHcg(rank, stages))
            got[rank] = (float(from_prev[0, 0]), float(from_next[0, 0]))
        except Exception as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)

    threads = [threading.Thread(target=stage, args=(r,)) for r in range(stages)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors, errors
    return got


@pytest.mark.parametrize("stages", [2, 4])
def test_interleaved_steady_exchange_neither_blocks_nor_swaps_activation_and_gradient(stages, monkeypatch):
    got = run_steady_exchange(stages, monkeypatch)
    for rank in range(stages):
        prev, nxt = (rank - 1) % stages, (rank + 1) % stages
        assert got[rank] == (100.0 * prev + 1, 100.0 * nxt + 2), f"stage {rank}"


def test_every_stage_sending_first_as_paddle_does_blocks_on_blocking_sends(monkeypatch):
    """Why the fill orders by stage parity: with every stage sending first (Paddle's batch order posts a send
    first everywhere), no send ever finds its receive."""
    monkeypatch.setattr(cpu_interleave, "_sends_first", lambda hcg: True)
    with pytest.raises(AssertionError, match="TimeoutError|Full"):
        run_steady_exchange(2, monkeypatch, timeout=0.5)


def test_interleave_sanity_accepts_two_stages_and_keeps_the_accumulation_rule():
    class Schedule:
        num_stages, accumulate_steps = 2, 4

    cpu_interleave._interleave_sanity(Schedule())
    Schedule.accumulate_steps = 3
    with pytest.raises(RuntimeError, match=r"accumulate_steps\(3\) should be greater than or equal to 2 \* num_stages"):
        cpu_interleave._interleave_sanity(Schedule())
    Schedule.num_stages = 1
    with pytest.raises(RuntimeError, match="pp degree >= 2"):
        cpu_interleave._interleave_f_then_b_sanity(Schedule())
