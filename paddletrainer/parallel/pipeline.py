"""Pipeline parallel: fleet's ``PipelineParallel`` (1F1B) over a ``PipelineLayer`` model, or with
``virtual_pp_degree`` > 1 its interleaved variants (``PipelineParallelWithInterleave`` / ``...FthenB``).

The Trainer keeps the optimizer step (PaddleNLP does the same: it calls ``forward_backward_pipeline``,
not ``train_batch``), so :func:`train_batch` runs forward and backward over the gradient-accumulation
micro-batches and returns the loss; gradients are synchronised and applied by the optimizer afterwards.
"""
from __future__ import annotations

import contextlib
import logging
import types

import numpy as np
import paddle

from ..paddle_contract import pipeline_inputs_hook
from ..device import on_cuda_device
from .flashmask import normalize_startend, visible
from .sequence_cut import DOCUMENT_ENDS
from .wrappers import unwrap_model

__all__ = ["apply_pipeline", "check_virtual_pipeline_split", "train_batch", "eval_batch", "stack_micro_batches",
           "shared_weights_counted_elsewhere", "default_pipeline_inputs"]

logger = logging.getLogger(__name__)


def apply_pipeline(model, optimizer, *, topology, virtual_pp_degree: int = 1):
    """Wrap a ``PipelineLayer`` in ``PipelineParallel`` and the optimizer in ``HybridParallelOptimizer``.

    fleet's pipeline wrapper also covers tensor parallel, dp and sharding stage 1 inside the pipeline
    (the hybrid optimizer reduces their gradients), so this is the only wrapping a pp > 1 layout needs.
    The strategy's ``accumulate_steps`` (= gradient_accumulation_steps) is the number of micro-batches
    every :func:`train_batch` call must pass.

    ``virtual_pp_degree`` > 1 (interleaved pipeline): the model must have been built with that many chunks
    per stage (PaddleNLP's ``...Pipe`` models read ``config.virtual_pp_degree``). With 1 (not asked for in the
    training arguments) the model's own chunk count is used: PaddleNLP's llm scripts set it through their model
    argument ``virtual_pp_degree``. fleet then picks
    ``PipelineParallelWithInterleave`` (accumulate_steps >= 2·pp) or its all-forward-then-backward variant
    (pp <= accumulate_steps < 2·pp).
    """
    from paddle.distributed import fleet
    from paddle.distributed.fleet.meta_parallel import PipelineLayer

    if topology.pp_degree == 1:
        raise ValueError("apply_pipeline needs pp_degree > 1")
    if not isinstance(model, PipelineLayer):
        raise TypeError(f"pipeline parallel needs a PipelineLayer model (e.g. LlamaForCausalLMPipe), got "
                        f"{type(model).__name__}")
    chunks = model.get_num_virtual_stages()
    layers = getattr(getattr(model, "config", None), "num_hidden_layers", None)
    if isinstance(layers, int):
        check_virtual_pipeline_split(layers, topology.pp_degree, max(virtual_pp_degree, chunks))
    if virtual_pp_degree > 1 and chunks != virtual_pp_degree:
        raise ValueError(f"virtual_pp_degree={virtual_pp_degree} but the model was built with {chunks} chunk(s) per "
                         f"stage: set config.virtual_pp_degree={virtual_pp_degree} before building the ...Pipe model")
    if pipeline_inputs_hook(model) is None:
        logger.warning("%s has no _prepare_pipeline_inputs_func: dict batches are split by the default one "
                       "(%s to the first stage, %s to the last; other keys are dropped)", type(model).__name__,
                       ", ".join(FIRST_STAGE_KEYS), ", ".join(LAST_STAGE_KEYS))
    return fleet.distributed_model(model), fleet.distributed_optimizer(optimizer)


def shared_weights_counted_elsewhere(model) -> set:
    """``id()`` of the weights this rank shares with other pipeline stages (a ``SharedLayerDesc``, e.g. a tied
    embedding) whose gradient another rank of their shared group adds to the global norm.

    After ``allreduce_shared_weight_gradients`` every stage holding such a weight holds the same summed
    gradient, so only one of them may count it: the lowest rank of its shared group, the rank Paddle broadcasts
    the weight from. Paddle's own marker for this (``is_firstly_shared``) is never set in Paddle 3.3.1: the
    ``PipelineLayer`` compares parameter names with attribute names, which never match. ``model``: the
    ``PipelineParallel`` wrapper or the ``PipelineLayer``; an empty set for any other model.
    """
    from paddle.distributed.fleet.meta_parallel import PipelineLayer

    layers = unwrap_model(model)
    if not isinstance(layers, PipelineLayer):
        return set()
    counting_rank = {}
    for comm in getattr(layers, "shared_comm", {}).values():
        for attr in comm["weight_attr"]:
            param = getattr(comm["layer"], attr)
            counting_rank[id(param)] = min(counting_rank.get(id(param), layers.global_rank), *comm["ranks"])
    return {key for key, rank in counting_rank.items() if rank != layers.global_rank}


FIRST_STAGE_KEYS = ("input_ids", "attention_mask", "position_ids")
LAST_STAGE_KEYS = ("labels",)


def default_pipeline_inputs(batch: dict) -> list:
    """``[first-stage inputs, last-stage labels]`` of a dict micro-batch, for a ``PipelineLayer`` without its own
    ``_prepare_pipeline_inputs_func`` (PaddleNLP's Trainer installs the same default): the present keys of
    :data:`FIRST_STAGE_KEYS` and of :data:`LAST_STAGE_KEYS`, in that order, each a tuple or, when one key is
    present, that tensor alone. Other keys are dropped (``apply_pipeline`` warns once that they are)."""
    def present(keys):
        values = tuple(batch[k] for k in keys if k in batch)
        return values[0] if len(values) == 1 else values

    return [present(FIRST_STAGE_KEYS), present(LAST_STAGE_KEYS)]


def check_virtual_pipeline_split(num_layers: int, pp_degree: int, virtual_pp_degree: int,
                                 option: str = "num_hidden_layers") -> None:
    """Interleaved pipeline: the layers are cut into pp·vpp equal chunks. Call before building the model
    (no process group needed); PaddleNLP's ``...Pipe`` models split by decoder layer."""
    chunks = max(pp_degree, 1) * max(virtual_pp_degree, 1)
    if virtual_pp_degree > 1 and num_layers % chunks:
        raise ValueError(f"{option}={num_layers} is not divisible by pipeline_parallel_degree={pp_degree} x "
                         f"virtual_pp_degree={virtual_pp_degree} = {chunks}: every virtual stage needs as many layers")


def _is_interleaved(model) -> bool:
    return getattr(model, "num_model_chunks", 1) > 1


def _documents_as_block_mask(micro_batch: dict) -> dict:
    """Packed rows' document ends as the block-diagonal mask they describe, off a CUDA device: PaddleNLP's Pipe
    stages pass ``(hidden, mask, ends, positions)`` with the ``None`` entries left out and tell the ends from the
    positions by dtype only on a GPU, so elsewhere the ends would be taken for positions. The mask travels in
    their place (S×S per row, the format PaddleNLP's own zero-padding data also uses)."""
    ends = micro_batch.get(DOCUMENT_ENDS)
    if ends is None or on_cuda_device():
        return micro_batch
    ends = normalize_startend(paddle.to_tensor(ends) if isinstance(ends, np.ndarray) else ends)
    positions = paddle.arange(ends.shape[1], dtype="int64")
    out = {key: value for key, value in micro_batch.items() if key != DOCUMENT_ENDS}
    out["attention_mask"] = visible(positions, positions, ends)
    return out


def _as_pair(micro_batch, layers):
    if isinstance(micro_batch, dict):
        prepare = pipeline_inputs_hook(layers) or default_pipeline_inputs
        return tuple(prepare(_documents_as_block_mask(dict(micro_batch))))
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
    return _stack_pairs([_as_pair(mb, layers) for mb in micro_batches])


def _stack_pairs(pairs):
    return (_stack([p[0] for p in pairs]), _stack([p[1] for p in pairs]))


def _prepare(model, data, train: bool):
    # What PipelineParallel._prepare_training does, minus its optimizer bookkeeping (the Trainer steps).
    model.set_virtual_pipeline_rank(0)
    if train:
        model._layers.train()
    if not (model.is_pipeline_first_stage(ignore_virtual=True) or model.is_pipeline_last_stage(ignore_virtual=True)):
        return None
    return data


def _broadcast_final_loss_on_device(self, return_micro_batch_loss=False):
    """``PipelineParallel._broadcast_final_loss`` without its two host reads per step.

    Paddle's version stacks the last stage's micro-batch losses with ``paddle.to_tensor`` (a read of each
    loss) and the other stages read a broadcast dtype flag (``is_fp32.item()``) to allocate the receive buffer.
    Here the last stage adds the losses on the device and every stage uses float32 (the Trainer casts the loss
    to float32 anyway), so the dtype needs no exchange. Same losses, same group, same source rank.
    """
    src = self._hcg.get_rank_from_stage(self.num_stages - 1)
    shape = [self.accumulate_steps] if return_micro_batch_loss else [1]
    losses = []
    for idx in range(len(self._layers._loss_fn)):
        if self.is_pipeline_last_stage(ignore_virtual=True):
            assert self.total_loss is not None, "train_batch() in last stage should obtain valid loss"
            parts = [loss.detach().astype("float32").reshape([1]) for loss in self.total_loss[idx]]
            if return_micro_batch_loss:
                loss = paddle.concat(parts)
            else:
                loss = paddle.add_n(parts) if len(parts) > 1 else parts[0]
                if self._delay_scale_loss:
                    loss = loss / self.accumulate_steps
        else:
            loss = paddle.zeros(shape, dtype="float32")
        paddle.distributed.broadcast(loss, src=src, sync_op=True, group=self.pp_group)
        losses.append(loss)
    return losses[0] if len(losses) == 1 else losses


@contextlib.contextmanager
def _weighted_loss_functions(layers, weights):
    """The model's loss functions, each result times the weight of its micro-batch (``weights[m]``), while the
    context lasts. The last stage computes the losses in micro-batch order in every schedule (fleet reads the
    labels from one sequential iterator), so the m-th call of a loss function is micro-batch m's."""
    if weights is None:
        yield
        return
    originals = layers._loss_fn

    def weighted(loss_fn):
        calls = iter(weights)

        def loss_of_micro_batch(output, labels):
            loss = loss_fn(output, labels)
            return loss * next(calls).astype(loss.dtype)
        return loss_of_micro_batch

    layers._loss_fn = [None if fn is None else weighted(fn) for fn in originals]
    try:
        yield
    finally:
        layers._loss_fn = originals


def train_batch(model, micro_batches: list, scaler=None, loss_weights=None):
    """Forward and backward over the micro-batches with the 1F1B schedule; return the step's loss.

    ``len(micro_batches)`` must equal the strategy's accumulate_steps (gradient_accumulation_steps).
    Each micro-batch loss is multiplied by its entry of ``loss_weights`` (when given: see
    ``optim.loss.micro_batch_weights``), then divided by that count before backward, so gradients and the
    returned loss are the weighted means over micro-batches. The loss is broadcast from the last stage to every
    pp rank and returned as a float32 scalar tensor on every rank.
    """
    if len(micro_batches) != model.accumulate_steps:
        raise ValueError(f"train_batch got {len(micro_batches)} micro-batches; the pipeline was configured for "
                         f"accumulate_steps={model.accumulate_steps} (gradient_accumulation_steps)")
    data = _prepare(model, stack_micro_batches(micro_batches, model._layers), train=True)
    if "_broadcast_final_loss" not in model.__dict__:  # once per model: see _broadcast_final_loss_on_device
        model._broadcast_final_loss = types.MethodType(_broadcast_final_loss_on_device, model)
    with _weighted_loss_functions(model._layers, loss_weights):
        loss = model.forward_backward_pipeline(data, scaler)
    # The last stage returns the loss with its own shape, the others a [1] tensor: make them agree.
    return loss.astype("float32").reshape([])


@paddle.no_grad()
def eval_batch(model, micro_batches: list, *, return_logits: bool = False):
    """Forward only; returns ``(loss, logits)``, the same on every pp rank.

    ``loss`` is the mean of the micro-batches' losses (None when they carry no labels). ``logits`` (only
    with ``return_logits``) are the last stage's outputs of the micro-batches concatenated along the batch
    axis, as float32. Both are computed on the last stage and broadcast to the whole pp group by
    :func:`_broadcast_from_last_stage` (fleet's own loss broadcast assumes the training shapes).

    Evaluation batches may differ in size from training micro-batches and from each other (the last one is
    short when the eval set is not a multiple of the batch), but fleet's p2p sends the activations' shape
    only on the first step and reuses it. So the shape cache is cleared before and after: every pp rank runs
    this call at the same point, so sender and receiver both exchange the new shape, and the next training
    step exchanges its own again.
    """
    saved_steps = model.accumulate_steps
    count = len(micro_batches)
    pairs = [_as_pair(mb, model._layers) for mb in micro_batches]
    run = pairs
    if _is_interleaved(model):
        # Paddle's interleaved schedules are valid only for the micro-batch counts the training schedule was
        # built for (its chunk order assumes >= pp micro-batches, a multiple for the F-then-B variant):
        # repeat the last micro-batch up to a multiple of gradient_accumulation_steps and drop those outputs.
        run = pairs + [pairs[-1]] * (-count % saved_steps)
    model.accumulate_steps = len(run)  # eval batches need not match the training GA
    model._p2p_helper.clear_meta_cache()
    try:
        data = _prepare(model, _stack_pairs(run), train=False)
        outputs = model.eval_batch(data, compute_loss=False)  # the last stage: one output per micro-batch
    finally:
        model.accumulate_steps = saved_steps
        model._p2p_helper.clear_meta_cache()
    if len(run) != count and isinstance(outputs, (list, tuple)):
        outputs = outputs[:count]

    loss = logits = error = None
    if model.is_pipeline_last_stage(ignore_virtual=True):
        try:
            loss, logits = _last_stage_loss_and_logits(model, outputs, [p[1] for p in pairs], return_logits)
        except Exception as exc:  # noqa: BLE001 - every pp rank must learn of it, or the others wait forever
            error = exc
    group = model._hcg.get_pipe_parallel_group()
    loss = _broadcast_from_last_stage(loss, group, error)
    return loss, (_broadcast_from_last_stage(logits, group) if return_logits else None)


def _last_stage_loss_and_logits(model, outputs, labels, return_logits: bool = True):
    outs = [o[0] if isinstance(o, (tuple, list)) and len(o) == 1 else o for o in outputs]
    logits = None
    if return_logits:
        if not all(isinstance(o, paddle.Tensor) for o in outs):
            raise TypeError("pipeline prediction needs the last stage to output one tensor (the logits) per "
                            "micro-batch; set prediction_loss_only=True to evaluate the loss only")
        if outs[0].ndim > _MAX_NDIM:
            raise ValueError(f"pipeline outputs with more than {_MAX_NDIM} dimensions are not supported")
        logits = paddle.concat([o.astype("float32") for o in outs], axis=0)
    loss = None
    if all(_has_labels(lab) for lab in labels):
        loss_fn = model._layers._loss_fn[0]
        loss = paddle.add_n([loss_fn(o, lab).astype("float32").reshape([]) for o, lab in zip(outputs, labels)])
        loss = loss / len(outs)
    return loss, logits


def _has_labels(labels) -> bool:
    if isinstance(labels, (tuple, list)):
        return any(_has_labels(x) for x in labels)
    return labels is not None


_MAX_NDIM = 8
_NONE, _FAILED = -1, -2  # header[0] codes besides ndim


def _broadcast_from_last_stage(tensor, group, error: Exception = None):
    """``tensor`` (float32 or None) from the group's last rank to all: a header with its shape, then the
    data. An ``error`` on the last rank is sent as a code in the header and raised on every rank."""
    import paddle.distributed as dist

    src = group.ranks[-1]
    header = np.full([_MAX_NDIM + 1], _NONE, dtype="int64")  # [ndim, dim_0, ..., dim_{ndim-1}, unused...]
    if error is not None:
        header[0] = _FAILED
    elif tensor is not None:
        header[0] = tensor.ndim
        header[1: 1 + tensor.ndim] = tensor.shape
    meta = paddle.to_tensor(header)
    dist.broadcast(meta, src=src, group=group)
    ndim = int(meta[0])
    if ndim == _FAILED:
        if error is not None:
            raise error
        raise RuntimeError(f"pipeline evaluation failed on the last stage (global rank {src}); see its log")
    if ndim == _NONE:
        return None
    shape = [int(v) for v in meta[1: 1 + ndim].tolist()]
    buffer = tensor if tensor is not None else paddle.empty(shape, dtype="float32")
    dist.broadcast(buffer, src=src, group=group)
    return buffer
