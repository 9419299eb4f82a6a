"""The interleaved pipeline (virtual stages) on Paddle's CPU build: p2p in a ring-safe order, two stages allowed.

``virtual_pp_degree`` > 1 runs Paddle's ``PipelineParallelWithInterleave`` (or its F-then-B variant). Their p2p
assumes NCCL's grouped, non-blocking send/recv; this module makes the same exchanges work over gloo's blocking
ones (``p2p_communication._batched_p2p_ops`` and two ``P2pHelper`` exchanges), which also makes two stages
correct, so Paddle's "pp degree > 2" sanity check is relaxed to 2. :func:`install` applies it;
:func:`assumptions` lists what it relies on in Paddle. The blocking send/recv themselves are :mod:`.pipeline_p2p`.
"""
from __future__ import annotations

import inspect

import paddle
from paddle.distributed.fleet.meta_parallel import pipeline_parallel as ppl
from paddle.distributed.fleet.meta_parallel.pp_utils import p2p_communication as p2p

from .paddle_checks import Assumption, paddle_source, params_of

__all__ = ["install", "assumptions"]

# --------------------------------------------------------------------------------------------------
# The interleaved schedules are a ring: the last stage's chunk k feeds the first stage's chunk k+1, and in the
# steady phase every stage exchanges an activation and a gradient with both neighbours in one call. Paddle's
# batched p2p posts [send to prev, recv from prev, send to next, recv from next] as one group, which NCCL runs
# concurrently; gloo's send blocks until the peer posts the matching recv (measured: two processes that both
# send first time out), so on a ring every stage would block in its first send. And with two stages the
# previous and the next stage are one process: messages to one peer match in order, so the gradient sent
# "to prev" would land in the buffer of the activation received "from next" (same shape, no error) — why
# Paddle asserts "pp degree > 2".
#
# The fills split each exchange into this stage's sends — activation (to next) first, then gradient (to
# prev) — and its receives in the same order — activation (from prev), then gradient (from next) — and run
# the sends first on even stages and the receives first on odd ones (Megatron's non-batched order). Per pair
# of neighbours the messages then match one to one, and the ring unblocks from any even stage.
def _as_tuple(tensors):
    if tensors is None:
        return ()
    return tuple(tensors) if isinstance(tensors, (tuple, list)) else (tensors,)


def _sends_first(hcg) -> bool:
    return hcg.get_stage_id() % 2 == 0


def _make_batched_p2p_ops(original):
    def _batched_p2p_ops(tensor_send_prev, tensor_recv_prev, tensor_send_next, tensor_recv_next, hcg):
        """Replaces p2p_communication._batched_p2p_ops: blocking send/recv in a ring-safe order (see above)."""
        group = hcg.get_pipe_parallel_group()
        prev, nxt = hcg._get_p2p_prev_rank(), hcg._get_p2p_next_rank()
        sends = [(p2p._send_on_calc_stream, t, nxt) for t in _as_tuple(tensor_send_next)]
        sends += [(p2p._send_on_calc_stream, t, prev) for t in _as_tuple(tensor_send_prev)]
        recvs = [(p2p._recv_on_calc_stream, t, prev) for t in _as_tuple(tensor_recv_prev)]
        recvs += [(p2p._recv_on_calc_stream, t, nxt) for t in _as_tuple(tensor_recv_next)]
        for op, tensor, peer in (sends + recvs if _sends_first(hcg) else recvs + sends):
            op(tensor, group, peer)
        for _, tensor, _ in recvs:  # a no-op unless partial send/recv is on (it is off on CPU)
            p2p.allgather_partial(tensor, nranks=hcg.get_model_parallel_world_size(),
                                  rank_id=hcg.get_model_parallel_rank(), group=hcg.get_model_parallel_group(),
                                  use_calc_stream=True)

    _batched_p2p_ops.__wrapped_paddle__ = original
    return _batched_p2p_ops


def _make_split_exchange(original):
    signature = inspect.signature(original)

    def method(self, *args, **kwargs):
        # Paddle sends this stage's shape metadata, receives the previous stage's, then runs one data batch:
        # a blocking metadata receive placed before the data send deadlocks the ring. So the exchange is split
        # in the same two halves as the data (everything sent: activation metadata and data, then the
        # gradient; everything received, in the same order), in the even/odd order of _batched_p2p_ops.
        bound = signature.bind(self, *args, **kwargs)
        bound.apply_defaults()
        a = bound.arguments
        batch = a["batch_p2p_comm"]
        received = {}

        def send():
            if a["output_tensor"] is not None:
                self.send_forward(a["output_tensor"], pp_last_stage=False, batch_p2p_comm=batch,
                                  skip_check_meta=a["skip_check_meta"])
            if a.get("input_tensor_grad") is not None:
                self.send_backward(a["input_tensor_grad"], pp_first_stage=False, batch_p2p_comm=batch)

        def recv():
            received["input"] = (self.recv_forward(False, sync_recv=False, batch_p2p_comm=batch)
                                 if a["recv_prev"] else None)
            if a.get("recv_next"):
                received["grad"] = self.recv_backward(False, sync_recv=False, batch_p2p_comm=batch)

        for half in ((send, recv) if _sends_first(p2p._hcg) else (recv, send)):
            half()
        if "recv_next" in a:  # send_forward_backward_recv_forward_backward
            return received["input"], received.get("grad")
        return (received["input"], None) if a.get("overlap_p2p_comm") else received["input"]

    method.__wrapped_paddle__ = original
    return method


def _interleave_sanity(self):
    """Replaces PipelineParallelWithInterleave._check_sanity: Paddle's checks with two stages allowed."""
    if not paddle.in_dynamic_mode():
        raise RuntimeError("virtual pipeline stage with interleave only support eager dygraph mode")
    if self.num_stages < 2:
        raise RuntimeError("virtual pipeline needs a pp degree >= 2")
    if self.accumulate_steps < 2 * self.num_stages:
        raise RuntimeError(f"accumulate_steps({self.accumulate_steps}) should be greater than or equal to "
                           f"2 * num_stages({self.num_stages}) for pipeline with interleave")


def _interleave_f_then_b_sanity(self):
    """Replaces PipelineParallelWithInterleaveFthenB._check_sanity: two stages allowed."""
    if not paddle.in_dynamic_mode():
        raise RuntimeError("virtual pipeline stage with interleave only support eager dygraph mode")
    if self.num_stages < 2:
        raise RuntimeError("virtual pipeline needs a pp degree >= 2")


def install() -> None:
    """Apply the interleave fill (called once by :func:`paddletrainer.parallel.cpu.install`)."""
    p2p._batched_p2p_ops = _make_batched_p2p_ops(p2p._batched_p2p_ops)
    for name in ("send_forward_recv_forward", "send_forward_backward_recv_forward_backward"):
        setattr(p2p.P2pHelper, name, _make_split_exchange(getattr(p2p.P2pHelper, name)))
    _interleave_sanity.__wrapped_paddle__ = ppl.PipelineParallelWithInterleave._check_sanity
    ppl.PipelineParallelWithInterleave._check_sanity = _interleave_sanity
    _interleave_f_then_b_sanity.__wrapped_paddle__ = ppl.PipelineParallelWithInterleaveFthenB._check_sanity
    ppl.PipelineParallelWithInterleaveFthenB._check_sanity = _interleave_f_then_b_sanity


# P2pHelper methods the split exchange calls (or replaces), with the parameters it passes by name.
_HELPER_PARAMS = (
    ("send_forward_recv_forward", ["output_tensor", "recv_prev", "batch_p2p_comm", "overlap_p2p_comm",
                                   "skip_check_meta"]),
    ("send_forward_backward_recv_forward_backward", ["output_tensor", "input_tensor_grad", "recv_prev", "recv_next",
                                                     "batch_p2p_comm", "skip_check_meta"]),
    ("send_forward", ["output_tensor", "pp_last_stage", "batch_p2p_comm", "skip_check_meta"]),
    ("send_backward", ["input_tensor_grad", "pp_first_stage", "batch_p2p_comm"]),
    ("recv_forward", ["pp_first_stage", "sync_recv", "batch_p2p_comm"]),
    ("recv_backward", ["pp_last_stage", "sync_recv", "batch_p2p_comm"]),
)


def assumptions() -> list:
    """What this fill relies on in Paddle (checked by :func:`paddletrainer.parallel.cpu.check_paddle_assumptions`)."""
    return [
        Assumption(lambda: params_of(p2p._batched_p2p_ops)
                   == ["tensor_send_prev", "tensor_recv_prev", "tensor_send_next", "tensor_recv_next", "hcg"],
                   "p2p_communication._batched_p2p_ops(tensor_send_prev, tensor_recv_prev, tensor_send_next, "
                   "tensor_recv_next, hcg) signature changed"),
        Assumption(lambda: "_batched_p2p_ops if batch_p2p_comm" in paddle_source(p2p._p2p_helper),
                   "p2p_communication._p2p_helper no longer looks up _batched_p2p_ops by its module name"),
        *(Assumption(lambda name=name, needed=needed: params_of(getattr(p2p.P2pHelper, name))[1:] == needed,
                     f"P2pHelper.{name}({', '.join(needed)}) changed") for name, needed in _HELPER_PARAMS),
        *(Assumption(lambda cls=cls: "self.num_stages > 2" in paddle_source(getattr(ppl, cls)._check_sanity),
                     f"{cls}._check_sanity no longer requires pp > 2 (review the _check_sanity replacements)")
          for cls in ("PipelineParallelWithInterleave", "PipelineParallelWithInterleaveFthenB")),
    ]
