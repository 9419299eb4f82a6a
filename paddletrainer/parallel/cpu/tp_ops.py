"""Tensor parallel on Paddle's CPU build: the tensor-parallel ops as autograd functions, and no input broadcast.

Paddle's CPU build has no kernels for ``c_identity``, ``c_split``, ``c_concat`` and
``c_softmax_with_cross_entropy`` (and ``_mp_allreduce``'s backward calls ``c_identity``). Megatron's
conjugate pairs rebuild them from ``all_reduce`` / ``all_gather``, which gloo has:
identity ↔ all-reduce (f / g) and split ↔ all-gather along the last dim. Each function keeps the signature
of the Paddle function it replaces (``mp_ops._c_identity``, ... and their ``collective`` re-exports).

``TensorParallel.forward`` also calls ``hybrid_parallel_util.broadcast_input_data``, which asserts a GPU/XPU
device; it becomes a no-op (:func:`_broadcast_input_data`). :func:`install` puts all of them in place.
"""
from __future__ import annotations

import paddle
import paddle.distributed as dist
from paddle.autograd import PyLayer
from paddle.distributed import ReduceOp, collective
from paddle.distributed.fleet.layers.mpu import mp_ops
from paddle.distributed.fleet.meta_parallel import tensor_parallel
from paddle.distributed.fleet.utils import hybrid_parallel_util

from .paddle_checks import Assumption, params_of

__all__ = ["install", "assumptions", "_c_identity", "_mp_allreduce", "_c_split", "_c_concat",
           "parallel_softmax_cross_entropy"]


def _group_or_default(group):
    return collective._get_default_group() if group is None else group


def _all_gather_last_dim(tensor, group):
    parts = []
    dist.all_gather(parts, tensor.contiguous() if hasattr(tensor, "contiguous") else tensor, group=group)
    return paddle.concat(parts, axis=-1)


def _local_last_dim_chunk(tensor, group):
    width = tensor.shape[-1] // group.nranks
    start = group.rank * width
    return paddle.slice(tensor, axes=[tensor.ndim - 1], starts=[start], ends=[start + width]).clone()


class _Identity(PyLayer):
    """Forward: identity. Backward: all-reduce (sum) over the tensor-parallel group (Megatron's f)."""

    @staticmethod
    def forward(ctx, tensor, group):
        ctx.group = group
        return tensor.clone()

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad


class _AllReduce(PyLayer):
    """Forward: all-reduce (sum). Backward: identity (Megatron's g)."""

    @staticmethod
    def forward(ctx, tensor, group):
        out = tensor.clone()
        dist.all_reduce(out, group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        return grad


class _Split(PyLayer):
    """Forward: this rank's chunk of the last dim. Backward: all-gather the chunks along the last dim."""

    @staticmethod
    def forward(ctx, tensor, group):
        ctx.group = group
        return _local_last_dim_chunk(tensor, group)

    @staticmethod
    def backward(ctx, grad):
        return _all_gather_last_dim(grad, ctx.group)


class _Concat(PyLayer):
    """Forward: all-gather along the last dim. Backward: this rank's chunk of the gradient."""

    @staticmethod
    def forward(ctx, tensor, group):
        ctx.group = group
        return _all_gather_last_dim(tensor, group)

    @staticmethod
    def backward(ctx, grad):
        return _local_last_dim_chunk(grad, ctx.group)


class _ParallelSoftmaxCrossEntropy(PyLayer):
    """Cross entropy over logits whose last (vocab) dim is split across the tensor-parallel group.

    With v = local vocab width and rank r owning classes [r·v, (r+1)·v):
    ``loss = log Σ_all exp(x - m) - (x[label] - m)`` where m (max), the exp-sum and the target logit are
    each all-reduced (max, sum, sum; the target is non-zero on exactly one rank). The gradient is
    ``softmax - onehot(label)`` on the local columns, times the incoming loss gradient.
    """

    @staticmethod
    def forward(ctx, logits, label, group, ignore_index):
        width = logits.shape[-1]
        start = group.rank * width
        x = logits.astype("float32")
        row_max = x.max(axis=-1, keepdim=True)
        dist.all_reduce(row_max, op=ReduceOp.MAX, group=group)
        exp = paddle.exp(x - row_max)
        sum_exp = exp.sum(axis=-1, keepdim=True)
        dist.all_reduce(sum_exp, group=group)
        label = label.astype("int64")
        owned = paddle.logical_and(label >= start, label < start + width)
        local_label = paddle.where(owned, label - start, paddle.zeros_like(label))
        target = paddle.take_along_axis(x - row_max, local_label, axis=-1) * owned.astype("float32")
        dist.all_reduce(target, group=group)
        valid = (label != ignore_index).astype("float32")
        loss = (paddle.log(sum_exp) - target) * valid
        softmax = exp / sum_exp
        ctx.save_for_backward(softmax, local_label, owned, valid)
        ctx.dtype = logits.dtype
        return loss.astype(logits.dtype), softmax.astype(logits.dtype)

    @staticmethod
    def backward(ctx, grad_loss, grad_softmax=None):
        softmax, local_label, owned, valid = ctx.saved_tensor()
        onehot = paddle.nn.functional.one_hot(local_label.squeeze(-1), softmax.shape[-1])
        grad = (softmax - onehot * owned.astype("float32")) * (grad_loss.astype("float32") * valid)
        return grad.astype(ctx.dtype), None


def _c_identity(tensor, group=None, skip_c_identity_dynamic=False):
    """Replaces mp_ops._c_identity and collective._c_identity (CPU: no c_identity kernel)."""
    group = _group_or_default(group)
    if not group.is_member():
        return None
    if skip_c_identity_dynamic:
        return tensor
    return _Identity.apply(tensor, group)


def _mp_allreduce(tensor, op=None, group=None, use_calc_stream=True, use_model_parallel=True,
                  skip_c_identity_dynamic=False):
    """Replaces mp_ops._mp_allreduce (its backward calls the missing c_identity kernel)."""
    group = _group_or_default(group)
    if not group.is_member():
        return None
    if op is not None and op != dist.ReduceOp.SUM:
        raise ValueError(f"_mp_allreduce supports only ReduceOp.SUM, got {op}")
    return _AllReduce.apply(tensor, group)


def _c_split(tensor, group=None):
    """Replaces mp_ops._c_split (CPU: no c_split kernel)."""
    group = _group_or_default(group)
    if not group.is_member():
        return None
    return _Split.apply(tensor, group)


def _c_concat(tensor, group=None):
    """Replaces mp_ops._c_concat and collective._c_concat (CPU: no c_concat kernel)."""
    group = _group_or_default(group)
    if not group.is_member():
        return None
    return _Concat.apply(tensor, group)


def parallel_softmax_cross_entropy(logits, label, group=None, return_softmax=False, ignore_index=-100):
    """Replaces mp_ops._c_softmax_with_cross_entropy (CPU: no c_softmax_with_cross_entropy kernel).

    ``label`` holds global class ids with the shape of ``logits`` minus the last dim, or with a trailing 1.
    Returns the per-position loss with a trailing dim of 1 (Paddle's shape), and the local softmax if asked.
    """
    group = _group_or_default(group)
    if not group.is_member():
        return None
    if label.ndim == logits.ndim - 1:
        label = label.unsqueeze(-1)
    loss, softmax = _ParallelSoftmaxCrossEntropy.apply(logits, label, group, ignore_index)
    return (loss, softmax) if return_softmax else loss


def _broadcast_input_data(hcg, *inputs, **kwargs):
    """Replaces hybrid_parallel_util.broadcast_input_data, which asserts a GPU/XPU device.

    TensorParallel.forward calls it to copy the batch from tp-rank 0 to the other tp ranks. Our data
    order gives every rank of a tensor-parallel group the same batch already, so there is nothing to do.
    """
    return inputs, kwargs


def install() -> None:
    """Put the ops and the no-op broadcast in place (called once by :func:`paddletrainer.parallel.cpu.install`)."""
    mp_ops._c_identity = _c_identity
    mp_ops._c_split = _c_split
    mp_ops._c_concat = _c_concat
    mp_ops._mp_allreduce = _mp_allreduce
    mp_ops._c_softmax_with_cross_entropy = parallel_softmax_cross_entropy
    # collective re-exports these by name; PaddleNLP's Llama head calls collective._c_identity/_c_concat.
    collective._c_identity = _c_identity
    collective._c_split = _c_split
    collective._c_concat = _c_concat
    collective._mp_allreduce = _mp_allreduce
    hybrid_parallel_util.broadcast_input_data = _broadcast_input_data
    tensor_parallel.broadcast_input_data = _broadcast_input_data  # imported there by name


def assumptions() -> list:
    """What this fill relies on in Paddle (checked by :func:`paddletrainer.parallel.cpu.check_paddle_assumptions`)."""
    ops = ("_c_identity", "_c_split", "_c_concat", "_mp_allreduce", "_c_softmax_with_cross_entropy")
    return [
        *(Assumption(lambda name=name: callable(getattr(mp_ops, name, None)), f"mp_ops.{name} is gone")
          for name in ops),
        Assumption(lambda: params_of(mp_ops._c_identity)[:3] == ["tensor", "group", "skip_c_identity_dynamic"],
                   "mp_ops._c_identity(tensor, group, skip_c_identity_dynamic) signature changed"),
        Assumption(lambda: params_of(mp_ops._c_split)[:2] == ["tensor", "group"], "mp_ops._c_split signature changed"),
        Assumption(lambda: params_of(mp_ops._c_concat)[:2] == ["tensor", "group"],
                   "mp_ops._c_concat signature changed"),
        Assumption(lambda: params_of(mp_ops._mp_allreduce)[:3] == ["tensor", "op", "group"],
                   "mp_ops._mp_allreduce changed"),
        Assumption(lambda: params_of(mp_ops._c_softmax_with_cross_entropy)[:5]
                   == ["logits", "label", "group", "return_softmax", "ignore_index"],
                   "mp_ops._c_softmax_with_cross_entropy signature changed"),
        *(Assumption(lambda name=name: hasattr(collective, name), f"collective.{name} re-export is gone")
          for name in ("_c_identity", "_c_concat", "_c_split")),
        Assumption(lambda: params_of(hybrid_parallel_util.broadcast_input_data)[:1] == ["hcg"],
                   "hybrid_parallel_util.broadcast_input_data(hcg, *inputs, **kwargs) changed"),
        Assumption(lambda: "broadcast_input_data" in vars(tensor_parallel),
                   "tensor_parallel no longer imports broadcast_input_data"),
    ]
