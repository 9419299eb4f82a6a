"""An exact all-to-all for gloo, which has none (the CPU fill the sep/Ulysses and expert-parallel paths need).

Paddle 3.3.1's ``ProcessGroupGloo`` rejects every all-to-all ("does not support all_to_all with sync_op flag",
``process_group.h:166/175/310``), so PaddleNLP's sep attention (``segment_parallel_utils._reshard_qkv`` →
``paddle.distributed.alltoall``) and its MoE dispatch (``moe_layer._AllToAll`` →
``paddle.distributed.stream.alltoall_single``) cannot run on CPU.

The fill builds the exchange from ``all_gather``, which gloo has: every rank flattens the pieces it sends
(piece ``j`` for rank ``j``) into one buffer, pads it to the longest buffer of the group, all-gathers the
buffers and keeps, from peer ``k``'s buffer, the piece ``k`` addressed to it. It moves bits and does no
arithmetic, so it is exact for every dtype. With unequal pieces the per-destination element counts are
all-gathered first (one small collective) so every rank knows where its piece sits in each peer's buffer.
The cost is ``n`` times an all-to-all's traffic, which is fine for CPU test runs.

Replaced by :func:`install_all_to_all` (CPU-only builds; :func:`check_paddle_assumptions` checks them):

* ``paddle.distributed.communication.stream.all_to_all._all_to_all_tensor_in_dygraph`` (a tensor split into
  equal chunks along dim 0), ``._all_to_all_in_dygraph`` (the list form ``alltoall(out_list, in_list)``, equal
  or unequal shapes) and ``._alltoall_single_in_dygraph`` (dim-0 splits with ``in/out_split_sizes``): every
  dygraph all-to-all of Paddle ends in one of them (``paddle.distributed.alltoall``, ``alltoall_single``,
  ``stream.alltoall``, ``stream.alltoall_single``), so their signatures are Paddle's own.

Separately, :func:`install_paddlenlp_reshard_order_fix` replaces PaddleNLP 3.0.0b4's
``segment_parallel_utils._reshard_qkv``: it calls ``dist.alltoall(comm_tensor_list, output_list)`` with the
pre-Paddle-3.0 argument order (input first); Paddle 3.3.1's ``alltoall`` takes the output first (Paddle
PR #69014), so the call writes the received pieces over its input chunks and returns ``output_list``
uninitialised, on any device. Later PaddleNLP swaps the two arguments; the fix does the same.

:class:`AllToAll` (and :func:`all_to_all`) is the differentiable form: a PyLayer whose backward is the
reverse all-to-all (the split sizes swapped).
"""
from __future__ import annotations

import importlib.util
import inspect
import sys

import paddle
import paddle.distributed as dist
from paddle.autograd import PyLayer

from ...device import has_accelerator
from .blocking import DoneTask, group_or_world
from .paddle_checks import Assumption, broken_assumptions

__all__ = [
    "exchange",
    "AllToAll",
    "all_to_all",
    "reshard_qkv",
    "install_all_to_all",
    "install_paddlenlp_reshard_order_fix",
    "check_paddle_assumptions",
    "STREAM_MODULE",
]

THIS_FILE = "paddletrainer/parallel/cpu/all_to_all.py"
# The module (its name is shadowed by the function ``stream.alltoall`` in the package namespace).
STREAM_MODULE = "paddle.distributed.communication.stream.all_to_all"




def _counts_of_every_rank(mine: list, group, equal: bool) -> list:
    """``counts[k][j]`` = elements rank ``k`` sends to rank ``j``: known locally when every split is equal
    (the caller's contract, as with NCCL), else all-gathered."""
    if equal:
        return [list(mine) for _ in range(group.nranks)]
    gathered = []
    dist.all_gather(gathered, paddle.to_tensor(mine, dtype="int64"), group=group)
    return [[int(c) for c in g.numpy().tolist()] for g in gathered]


@paddle.no_grad()
def exchange(pieces: list, group=None, equal: bool = False) -> list:
    """All-to-all of flat pieces: ``pieces[j]`` goes to rank ``j``; returns what each rank ``k`` sent here.

    ``pieces`` holds one tensor per rank of ``group`` (any shape, one dtype; flattened). ``equal=True``
    promises that every rank sends pieces of this rank's piece sizes (skips the size exchange; a caller that
    breaks the promise gets wrong pieces, as with NCCL's equal-split all-to-all). The result is a list of 1-D
    tensors, entry ``k`` from rank ``k``. Exact: only copies (see module).
    """
    group = group_or_world(group)
    n, r = group.nranks, group.rank
    if len(pieces) != n:
        raise ValueError(f"all-to-all: {len(pieces)} pieces for a group of {n} ranks (one per rank expected)")
    dtype = pieces[0].dtype
    flat = [p.reshape([-1]) for p in pieces]
    if dtype == paddle.bool:  # gloo reduces and gathers numbers: carry booleans as bytes
        flat = [p.astype("uint8") for p in flat]
    counts = _counts_of_every_rank([int(p.shape[0]) for p in flat], group, equal)
    width = max(sum(c) for c in counts)
    if width == 0:
        return [paddle.zeros([0], dtype=dtype) for _ in range(n)]
    parts = [p for p in flat if p.shape[0] > 0]
    pad = width - sum(counts[r])
    if pad or not parts:
        parts.append(paddle.zeros([pad], dtype=flat[0].dtype))
    buffer = paddle.concat(parts) if len(parts) > 1 else parts[0]
    gathered = []
    dist.all_gather(gathered, buffer, group=group)
    received = []
    for k in range(n):
        start = sum(counts[k][:r])
        piece = gathered[k][start:start + counts[k][r]]
        received.append(piece.astype(dtype) if dtype == paddle.bool else piece)
    return received


def _even_rows(tensor, n: int, what: str) -> list:
    rows = int(tensor.shape[0]) if tensor.ndim else 0
    if rows % n:
        raise ValueError(f"all-to-all: {what} has {rows} rows along dim 0, not divisible by the group's {n} "
                         f"ranks (pass split sizes for unequal splits)")
    return [rows // n] * n


def _copy_into(out_tensor, flat, what: str):
    if int(out_tensor.numel()) != int(flat.shape[0]):
        raise ValueError(f"all-to-all: {what} holds {int(out_tensor.numel())} elements but "
                         f"{int(flat.shape[0])} arrived (check the split sizes / output shapes)")
    out_tensor.copy_(flat.reshape(out_tensor.shape), True)


def _row_pieces(in_tensor, in_split_sizes, n):
    sizes = list(in_split_sizes) if in_split_sizes else _even_rows(in_tensor, n, "the input")
    if len(sizes) != n or sum(sizes) != int(in_tensor.shape[0]):
        raise ValueError(f"all-to-all: in_split_sizes {sizes} must have one entry per rank ({n}) summing to the "
                         f"input's {int(in_tensor.shape[0])} rows")
    return paddle.split(in_tensor, sizes, axis=0) if n > 1 else [in_tensor]


# --------------------------------------------------------------------------------------------------
# The fills: Paddle's three dygraph all-to-all helpers, same signatures
# --------------------------------------------------------------------------------------------------
def _all_to_all_tensor_in_dygraph(out_tensor, in_tensor, group, sync_op, use_calc_stream):
    """Replaces ``stream.all_to_all._all_to_all_tensor_in_dygraph``: equal chunks of dim 0."""
    n = group.nranks
    received = exchange(_row_pieces(in_tensor, None, n), group, equal=True)
    _copy_into(out_tensor, paddle.concat(received), "the output tensor")
    return None if use_calc_stream else DoneTask()


def _all_to_all_in_dygraph(out_tensor_list, in_tensor_list, group, sync_op, use_calc_stream):
    """Replaces ``stream.all_to_all._all_to_all_in_dygraph``: ``in_tensor_list[j]`` goes to rank ``j``,
    ``out_tensor_list[k]`` receives rank ``k``'s; shapes may differ. An empty output list is filled with
    tensors shaped like the inputs, as Paddle does."""
    if len(in_tensor_list) == 0:
        raise RuntimeError("The input tensor_list should not be empty.")
    if len(out_tensor_list) == 0:
        out_tensor_list += [paddle.empty_like(tensor) for tensor in in_tensor_list]
    received = exchange(list(in_tensor_list), group, equal=False)
    for k, (out, piece) in enumerate(zip(out_tensor_list, received)):
        _copy_into(out, piece, f"out_tensor_list[{k}]")
    return None if use_calc_stream else DoneTask()


def _alltoall_single_in_dygraph(out_tensor, in_tensor, out_split_sizes, in_split_sizes, group, sync_op,
                                use_calc_stream):
    """Replaces ``stream.all_to_all._alltoall_single_in_dygraph``: dim-0 splits, equal when both sizes are
    None/empty (then no size exchange), else ``in_split_sizes[j]`` rows go to rank ``j`` and
    ``out_split_sizes[k]`` rows arrive from rank ``k``."""
    n = group.nranks
    equal = not in_split_sizes and not out_split_sizes
    received = exchange(_row_pieces(in_tensor, in_split_sizes, n), group, equal=equal)
    if out_split_sizes:
        row = int(out_tensor.numel()) // max(int(out_tensor.shape[0]), 1) if out_tensor.ndim else 1
        for k, (rows, piece) in enumerate(zip(out_split_sizes, received)):
            if rows * row != int(piece.shape[0]):
                raise ValueError(f"all-to-all: out_split_sizes[{k}] = {rows} rows but rank {k} sent "
                                 f"{int(piece.shape[0]) // max(row, 1)}")
    _copy_into(out_tensor, paddle.concat(received), "the output tensor")
    return None if use_calc_stream else DoneTask()


_FILLS = (("_all_to_all_tensor_in_dygraph", _all_to_all_tensor_in_dygraph),
          ("_all_to_all_in_dygraph", _all_to_all_in_dygraph),
          ("_alltoall_single_in_dygraph", _alltoall_single_in_dygraph))


# --------------------------------------------------------------------------------------------------
# Differentiable form
# --------------------------------------------------------------------------------------------------
def _rows_exchange(x, in_split_sizes, group):
    """All-to-all of ``x``'s dim-0 pieces; returns (result, the rows that arrived from each rank)."""
    n = group.nranks
    pieces = _row_pieces(x, in_split_sizes, n)
    row_shape = list(x.shape[1:])
    received = exchange(pieces, group, equal=not in_split_sizes)
    row = 1
    for d in row_shape:
        row *= int(d)
    rows = [int(p.shape[0]) // row if row else 0 for p in received]
    return paddle.concat(received).reshape([sum(rows)] + row_shape), rows


class AllToAll(PyLayer):
    """Differentiable all-to-all along dim 0: ``AllToAll.apply(x, in_split_sizes, group)``.

    Rows ``in_split_sizes[j]`` of ``x`` (equal chunks when None) go to rank ``j``; the result stacks what
    each rank sent, in rank order. Backward sends each gradient row back where its row came from (the
    reverse all-to-all, split by the rows that arrived).
    """

    @staticmethod
    def forward(ctx, x, in_split_sizes=None, group=None):
        group = group_or_world(group)
        out, arrived = _rows_exchange(x, list(in_split_sizes) if in_split_sizes else None, group)
        ctx.group, ctx.arrived = group, arrived
        ctx.sent = list(in_split_sizes) if in_split_sizes else None
        return out

    @staticmethod
    def backward(ctx, grad):
        back, _ = _rows_exchange(grad, None if ctx.sent is None else ctx.arrived, ctx.group)
        return back


def all_to_all(x, in_split_sizes=None, group=None):
    """The differentiable all-to-all of ``x``'s dim-0 rows (see :class:`AllToAll`)."""
    return AllToAll.apply(x, in_split_sizes, group)


# --------------------------------------------------------------------------------------------------
# PaddleNLP 3.0.0b4's sep reshard, with the argument order Paddle 3.x's alltoall takes
# --------------------------------------------------------------------------------------------------
@paddle.no_grad()
def reshard_qkv(x, group, split_axis=2, concat_axis=0):
    """Replaces ``paddlenlp.transformers.segment_parallel_utils._reshard_qkv`` (same arguments and result
    shape): split ``x`` into group-size pieces along ``split_axis``, all-to-all them (piece ``j`` to rank
    ``j``) and concatenate what arrives along ``concat_axis`` — ``[b, s/sep, h] → [b, s, h/sep]`` and back.
    Unlike PaddleNLP 3.0.0b4 it passes ``dist.alltoall`` the output list first (see module)."""
    group = group_or_world(group)
    nranks = dist.get_world_size(group=group)
    if x.ndim != 3 or x.shape[split_axis] % nranks:
        raise ValueError(f"reshard_qkv: needs a 3-D tensor whose axis {split_axis} divides by {nranks}; "
                         f"got shape {list(x.shape)}")
    pieces = paddle.split(x, nranks, axis=split_axis)
    received = [paddle.empty_like(pieces[0]) for _ in pieces]
    dist.alltoall(received, pieces, group=group)
    return paddle.concat(received, axis=concat_axis)


def install_paddlenlp_reshard_order_fix() -> None:
    """Put :func:`reshard_qkv` in place of PaddleNLP's ``_reshard_qkv`` (idempotent; ``ReshardQKV`` looks the
    name up in its module at call time). Valid on any device: the wrong order is PaddleNLP's, not gloo's."""
    from paddlenlp.transformers import segment_parallel_utils as spu

    if spu._reshard_qkv is not reshard_qkv:
        reshard_qkv.__wrapped_paddle__ = spu._reshard_qkv
        spu._reshard_qkv = reshard_qkv


# --------------------------------------------------------------------------------------------------
# install / check
# --------------------------------------------------------------------------------------------------
def install() -> None:
    """Put the all-gather all-to-all in place of Paddle's dygraph all-to-all helpers (idempotent; called by
    :func:`.cpu.install`, which has checked every fill's assumptions first).

    CPU-only builds only: with an accelerator the device's own all-to-all is the kernel, so calling this
    there raises instead of slowing it down behind the caller's back.
    """
    if has_accelerator():
        raise RuntimeError(f"{THIS_FILE}: the gloo all-to-all fill is for CPU-only Paddle builds; this build "
                           f"has an accelerator, whose own all-to-all must run")
    stream_module = _stream_module()
    for name, fill in _FILLS:
        if getattr(stream_module, name) is not fill:
            fill.__wrapped_paddle__ = getattr(stream_module, name)
            setattr(stream_module, name, fill)


def install_all_to_all() -> None:
    """This fill alone, for a caller outside :func:`.cpu.install`: its assumptions checked, then :func:`install`."""
    check_paddle_assumptions()
    install()


def _stream_module():
    import importlib

    return importlib.import_module(STREAM_MODULE)


def _params_of(func) -> list:
    func = getattr(func, "__wrapped_paddle__", func)
    return list(inspect.signature(inspect.unwrap(func)).parameters)


def _source(func) -> str:
    return inspect.getsource(inspect.unwrap(getattr(func, "__wrapped_paddle__", func)))


_PADDLE_SIGNATURES = {
    "_all_to_all_tensor_in_dygraph": ["out_tensor", "in_tensor", "group", "sync_op", "use_calc_stream"],
    "_all_to_all_in_dygraph": ["out_tensor_list", "in_tensor_list", "group", "sync_op", "use_calc_stream"],
    "_alltoall_single_in_dygraph": ["out_tensor", "in_tensor", "out_split_sizes", "in_split_sizes", "group",
                                    "sync_op", "use_calc_stream"],
}


def assumptions() -> list:
    """The facts about Paddle (and PaddleNLP's sep reshard, when it is installed) this fill relies on, one
    :class:`~.paddle_checks.Assumption` each (checked by :func:`paddletrainer.parallel.cpu.check_paddle_assumptions`)."""
    found = []

    def expect(condition, message):
        found.append(Assumption(condition, message))

    stream_module = _stream_module()
    for name, params in _PADDLE_SIGNATURES.items():
        expect(lambda name=name, params=params: _params_of(getattr(stream_module, name)) == params,
               f"stream.all_to_all.{name}({', '.join(params)}) signature changed")
    expect(lambda: all(f"{name}(" in _source(stream_module.alltoall)
                       for name in ("_all_to_all_tensor_in_dygraph", "_all_to_all_in_dygraph")),
           "stream.alltoall no longer ends in _all_to_all_tensor_in_dygraph / _all_to_all_in_dygraph")
    expect(lambda: "_alltoall_single_in_dygraph(" in _source(stream_module.alltoall_single),
           "stream.alltoall_single no longer ends in _alltoall_single_in_dygraph")
    expect(lambda: _params_of(dist.alltoall)[:4] == ["out_tensor_list", "in_tensor_list", "group", "sync_op"]
           and "stream.alltoall(" in _source(dist.alltoall),
           "paddle.distributed.alltoall(out_tensor_list, in_tensor_list, group, sync_op) changed or no longer "
           "calls stream.alltoall")
    expect(lambda: _params_of(dist.alltoall_single)[:6]
           == ["out_tensor", "in_tensor", "in_split_sizes", "out_split_sizes", "group", "sync_op"]
           and "stream.alltoall_single(" in _source(dist.alltoall_single),
           "paddle.distributed.alltoall_single(out_tensor, in_tensor, in_split_sizes, out_split_sizes, group, "
           "sync_op) changed or no longer calls stream.alltoall_single")
    expect(lambda: _params_of(dist.all_gather)[:3] == ["tensor_list", "tensor", "group"],
           "paddle.distributed.all_gather(tensor_list, tensor, group) signature changed")
    _check_paddlenlp(expect)
    return found


def check_paddle_assumptions() -> None:
    """Fail loudly if Paddle (or PaddleNLP's sep reshard) no longer looks the way the fill assumes: a
    ``RuntimeError`` whose every line names this file and one broken assumption."""
    problems = broken_assumptions(sys.modules[__name__])
    if problems:
        raise RuntimeError(f"{THIS_FILE} no longer matches this Paddle / PaddleNLP version:\n  - "
                           + "\n  - ".join(problems))


def _check_paddlenlp(expect) -> None:
    """The PaddleNLP call sites the fill serves still call what it fills, and the reshard still has the
    argument order the fix corrects. Nothing to check without PaddleNLP (an optional dependency)."""
    if importlib.util.find_spec("paddlenlp") is None:
        return
    from paddlenlp.transformers import moe_layer
    from paddlenlp.transformers import segment_parallel_utils as spu

    expect(lambda: "dist.alltoall(comm_tensor_list, output_list" in _source(spu._reshard_qkv),
           "segment_parallel_utils._reshard_qkv no longer calls dist.alltoall(comm_tensor_list, output_list) "
           "(PaddleNLP fixed the order? drop install_paddlenlp_reshard_order_fix)")
    expect(lambda: _params_of(spu._reshard_qkv)[:4] == ["x", "group", "split_axis", "concat_axis"],
           "segment_parallel_utils._reshard_qkv(x, group, split_axis, concat_axis) signature changed")
    expect(lambda: "_reshard_qkv(" in _source(spu.ReshardQKV.forward)
           and "_reshard_qkv(" in _source(spu.ReshardQKV.backward),
           "segment_parallel_utils.ReshardQKV no longer reshards through _reshard_qkv")
    expect(lambda: "stream.alltoall_single(" in _source(moe_layer._AllToAll.forward),
           "moe_layer._AllToAll no longer calls stream.alltoall_single")
