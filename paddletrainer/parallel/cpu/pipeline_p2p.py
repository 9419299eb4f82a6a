"""Pipeline parallel on Paddle's CPU build: blocking point-to-point, neighbour-pair groups, a device id.

* ``p2p_communication._send_on_calc_stream`` / ``_recv_on_calc_stream``: gloo rejects the calc-stream send;
  its plain blocking ``send``/``recv`` do the same job (:func:`_send_on_calc_stream`).
* With more than 2 stages the p2p traffic (data and the first step's shape metadata) runs on one 2-rank
  group per neighbour pair (:func:`install_pipeline_pair_groups`, called after ``fleet.init``).
* ``PipelineLayer.__init__`` reads ``ParallelEnv().device_id``, which ParallelEnv sets only for GPU/XPU/custom
  devices: a class-level default of 0 (the one CPU) fills the missing attribute.

The interleaved schedule's ordering of these sends and receives is :mod:`.interleave`.
"""
from __future__ import annotations

import inspect

import paddle.distributed as dist
from paddle.distributed.fleet.meta_parallel import pipeline_parallel
from paddle.distributed.fleet.meta_parallel.parallel_layers import pp_layers
from paddle.distributed.fleet.meta_parallel.pp_utils import p2p_communication

from .paddle_checks import Assumption, params_of

__all__ = ["install", "assumptions", "install_pipeline_pair_groups"]

# Neighbour-pair groups of the pipeline, {frozenset((me, peer)): group}; filled only when pp > 2.
_PAIR_GROUPS: dict = {}


def _p2p_group(group, peer: int):
    """The 2-rank group shared with ``peer`` when one exists (pp > 2), else ``group``."""
    if not _PAIR_GROUPS:
        return group
    return _PAIR_GROUPS.get(frozenset((dist.get_rank(), peer)), group)


def _send_on_calc_stream(tensor, group, dst, nranks=1, rank_id=0):
    """Replaces p2p_communication._send_on_calc_stream.

    gloo rejects ``send_on_calc_stream`` ("does not support send with sync_op and use_calc_stream");
    its plain blocking ``send`` does the same job. Partial send (a 1/mp slice) is never used: the
    strategy turns ``enable_partial_send_recv`` off on CPU because gloo lacks ``all_gather_partial``.
    """
    group = _p2p_group(group, dst)
    return group.process_group.send(tensor, group.get_group_rank(dst), True)


def _recv_on_calc_stream(tensor, group, src, nranks=1, rank_id=0):
    """Replaces p2p_communication._recv_on_calc_stream (see :func:`_send_on_calc_stream`)."""
    group = _p2p_group(group, src)
    return group.process_group.recv(tensor, group.get_group_rank(src), True)


def install_pipeline_pair_groups(hcg) -> None:
    """With more than 2 stages, carry pipeline p2p on one 2-rank group per neighbour pair.

    Paddle sends the first step's shape metadata (``SendRecvMeta.send_meta/recv_meta`` →
    ``paddle.distributed.send/recv``) and the activations over the whole pipe group. On gloo, with 4
    stages in one group, the first step hangs (TIMEOUT in stage 0's send_meta while stage 2 waits in
    recv_meta); pp2 — a group that is already a pair — works. So every pipe's neighbours (i, i+1 mod pp)
    get their own group and both paths use it. Called once after ``fleet.init``; ``new_group`` is
    collective, so every rank creates every pair in the same order.
    """
    if hcg.get_pipe_parallel_world_size() <= 2 or _PAIR_GROUPS:
        return
    me = dist.get_rank()
    for ranks in hcg.topology().get_comm_list("pipe"):
        for i in range(len(ranks)):
            pair = sorted({ranks[i], ranks[(i + 1) % len(ranks)]})
            group = dist.new_group(pair)
            if me in pair:
                _PAIR_GROUPS[frozenset(pair)] = group

    meta_cls = p2p_communication.SendRecvMeta
    send_meta, recv_meta = meta_cls.send_meta, meta_cls.recv_meta

    def send_meta_over_pair(self, tensor, group, reverse=False, broadcast=False):
        if not broadcast:
            peer = hcg._get_p2p_prev_rank() if reverse else hcg._get_p2p_next_rank()
            group = _p2p_group(group, peer)
        return send_meta(self, tensor, group, reverse=reverse, broadcast=broadcast)

    def recv_meta_over_pair(self, group, reverse=False, broadcast=False):
        if not broadcast:
            peer = hcg._get_p2p_next_rank() if reverse else hcg._get_p2p_prev_rank()
            group = _p2p_group(group, peer)
        return recv_meta(self, group, reverse=reverse, broadcast=broadcast)

    send_meta_over_pair.__wrapped_paddle__, recv_meta_over_pair.__wrapped_paddle__ = send_meta, recv_meta
    meta_cls.send_meta, meta_cls.recv_meta = send_meta_over_pair, recv_meta_over_pair


def install() -> None:
    """Put the device id and the blocking p2p in place (called once by :func:`paddletrainer.parallel.cpu.install`)."""
    dist.ParallelEnv._device_id = 0  # the one CPU: see the module docstring
    # Module globals: _batched_p2p_ops and P2PonCalcStream look these names up at call time.
    p2p_communication._send_on_calc_stream = _send_on_calc_stream
    p2p_communication._recv_on_calc_stream = _recv_on_calc_stream


def assumptions() -> list:
    """What this fill relies on in Paddle (checked by :func:`paddletrainer.parallel.cpu.check_paddle_assumptions`)."""
    return [
        Assumption(lambda: "ParallelEnv().device_id" in inspect.getsource(pp_layers.PipelineLayer.__init__),
                   "PipelineLayer.__init__ no longer reads ParallelEnv().device_id"),
        *(Assumption(lambda name=name, peer=peer: params_of(getattr(p2p_communication, name))[:3]
                     == ["tensor", "group", peer], f"p2p_communication.{name}(tensor, group, {peer}) signature changed")
          for name, peer in (("_send_on_calc_stream", "dst"), ("_recv_on_calc_stream", "src"))),
        Assumption(lambda: hasattr(pipeline_parallel.PipelineParallel, "forward_backward_pipeline"),
                   "PipelineParallel.forward_backward_pipeline is gone"),
        Assumption(lambda: params_of(p2p_communication.SendRecvMeta.send_meta)[1:5]
                   == ["tensor", "group", "reverse", "broadcast"]
                   and params_of(p2p_communication.SendRecvMeta.recv_meta)[1:4] == ["group", "reverse", "broadcast"],
                   "p2p_communication.SendRecvMeta.send_meta(tensor, group, reverse, broadcast) / "
                   "recv_meta(group, reverse, broadcast) changed"),
    ]
