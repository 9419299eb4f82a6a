"""Tensor parallel: fleet's ``TensorParallel`` model wrapper.

The model itself must already be built split (PaddleNLP models read ``tensor_parallel_degree`` /
``tensor_parallel_rank`` from their config and use ``ColumnParallelLinear`` / ``RowParallelLinear`` /
``VocabParallelEmbedding``). Wrapping broadcasts the replicated parameters inside the tp group and the
whole model across dp/sharding, so every replica starts identical.
"""
from __future__ import annotations

__all__ = ["apply_tensor_parallel"]


def apply_tensor_parallel(model, *, topology):
    """Return ``fleet.distributed_model(model)`` (a ``TensorParallel``) when tp > 1 and pp == 1."""
    if topology.tp_degree == 1:
        return model
    if topology.pp_degree > 1:
        raise ValueError("with pipeline parallel, tensor parallel is applied by apply_pipeline (PipelineParallel)")
    from paddle.distributed import fleet
    from paddle.distributed.fleet.meta_parallel import TensorParallel

    wrapped = fleet.distributed_model(model)
    if not isinstance(wrapped, TensorParallel):
        raise RuntimeError(f"fleet.distributed_model returned {type(wrapped).__name__}, expected TensorParallel")
    return wrapped
