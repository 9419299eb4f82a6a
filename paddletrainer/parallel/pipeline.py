"""Pipeline parallel: fleet's ``PipelineParallel`` (1F1B) over a ``PipelineLayer`` model.

The Trainer keeps the optimizer step (PaddleNLP does the same: it calls ``forward_backward_pipeline``,
not ``train_batch``), so :func:`train_batch` runs forward and backward over the gradient-accumulation
micro-batches and returns the loss; gradients are synchronised and applied by the optimizer afterwards.
"""
from __future__ import annotations

import paddle

__all__ = ["apply_pipeline", "train_batch", "eval_batch", "stack_micro_batches"]


def apply_pipeline(model, optimizer, *, topology):
    """Wrap a ``PipelineLayer`` in ``PipelineParallel`` and the optimizer in ``HybridParallelOptimizer``.

    fleet's pipeline wrapper also covers tensor parallel, dp and sharding stage 1 inside the pipeline
    (the hybrid optimizer reduces their gradients), so this is the only wrapping a pp > 1 layout needs.
    The strategy's ``accumulate_steps`` (= gradient_accumulation_steps) is the number of micro-batches
    every :func:`train_batch` call must pass.
    """
    from paddle.distributed import fleet
    from paddle.distributed.fleet.meta_parallel import PipelineLayer

    if topology.pp_degree == 1:
        raise ValueError("apply_pipeline needs pp_degree > 1")
    if not isinstance(model, PipelineLayer):
        raise TypeError(f"pipeline parallel needs a PipelineLayer model (e.g. LlamaForCausalLMPipe), got "
                        f"{type(model).__name__}")
    return fleet.distributed_model(model), fleet.distributed_optimizer(optimizer)


def _as_pair(micro_batch, layers):
    if isinstance(micro_batch, dict):
        prepare = getattr(layers, "_prepare_pipeline_inputs_func", None)
        if prepare is None:
            raise TypeError("dict micro-batches need a model with _prepare_pipeline_inputs_func; pass (inputs, labels)")
        return tuple(prepare(dict(micro_batch)))
    if not isinstance(micro_batch, (tuple, list)) or len(micro_batch) != 2:
        raise TypeError("a pipeline micro-batch is (inputs, labels) or a dict; got "
                        f"{type(micro_batch).__name__}")
    return tuple(micro_batch)


def _stack(parts):
    """[x_0, x_1, ...] (one per micro-batch) → the list/tuple-of-lists FakeMicroDataset indexes by step."""
    first = parts[0]
    if isinstance(first, (tuple, list)):
        return tuple(_stack([p[i] for p in parts]) if first[i] is not None else None for i in range(len(first)))
    if first is None:
        return None
    return list(parts)


def stack_micro_batches(micro_batches, layers=None):
    """Turn ``[(inputs, labels), ...]`` (or dicts) into the ``(inputs, labels)`` PipelineParallel expects.

    ``inputs``/``labels`` may each be a Tensor or a tuple of Tensors (None entries allowed); the result
    holds, per field, the list of per-micro-batch tensors.
    """
    pairs = [_as_pair(mb, layers) for mb in micro_batches]
    return (_stack([p[0] for p in pairs]), _stack([p[1] for p in pairs]))


def _prepare(model, data, train: bool):
    # What PipelineParallel._prepare_training does, minus its optimizer bookkeeping (the Trainer steps).
    model.set_virtual_pipeline_rank(0)
    if train:
        model._layers.train()
    if not (model.is_pipeline_first_stage(ignore_virtual=True) or model.is_pipeline_last_stage(ignore_virtual=True)):
        return None
    return data


def train_batch(model, micro_batches: list, scaler=None):
    """Forward and backward over the micro-batches with the 1F1B schedule; return the mean loss.

    ``len(micro_batches)`` must equal the strategy's accumulate_steps (gradient_accumulation_steps).
    Each micro-batch loss is divided by that count before backward, so gradients and the returned loss
    are the means over micro-batches. The loss is broadcast from the last stage to every pp rank and
    returned as a float32 scalar tensor on every rank.
    """
    if len(micro_batches) != model.accumulate_steps:
        raise ValueError(f"train_batch got {len(micro_batches)} micro-batches; the pipeline was configured for "
                         f"accumulate_steps={model.accumulate_steps} (gradient_accumulation_steps)")
    data = _prepare(model, stack_micro_batches(micro_batches, model._layers), train=True)
    loss = model.forward_backward_pipeline(data, scaler)
    # The last stage returns the loss with its own shape, the others a [1] tensor: make them agree.
    return loss.astype("float32").reshape([])


@paddle.no_grad()
def eval_batch(model, micro_batches: list):
    """Forward only; returns ``(loss, None)`` with the mean loss over the micro-batches on every rank.

    Logits are not returned: on a pipeline they exist only on the last stage, one micro-batch at a time.
    """
    saved_steps = model.accumulate_steps
    model.accumulate_steps = len(micro_batches)  # eval batches need not match the training GA
    try:
        data = _prepare(model, stack_micro_batches(micro_batches, model._layers), train=False)
        loss = model.eval_batch(data, compute_loss=True)
    finally:
        model.accumulate_steps = saved_steps
    return loss.astype("float32").reshape([]), None
