"""What Paddle's parallel wrappers hide: the user's model and the Paddle optimizer inside them. The one place that
knows which attribute each wrapper keeps the wrapped object in (the model's through ``paddle_contract``)."""

from ..paddle_contract import wrapped_layer

__all__ = ["unwrap_model", "unwrap_optimizer", "optimizer_layers"]

# The attribute each optimizer wrapper keeps the optimizer it wraps in: paddletrainer's ParallelOptimizer
# (``_optimizer``), fleet's HybridParallelOptimizer and DygraphShardingOptimizer(V2) (``_inner_opt``), the
# group-sharded stage 2/3 wrappers (``_optim``).
_OPTIMIZER_INNER = ("_optimizer", "_inner_opt", "_optim")


def unwrap_model(model):
    """The innermost Layer whose ``state_dict`` has the user's names: ``paddle.DataParallel``, fleet's
    TensorParallel/PipelineParallel/ShardingParallel keep it in ``_layers``, the group-sharded stage 2/3
    wrappers in ``_layer``."""
    seen = set()
    while model is not None and id(model) not in seen:
        seen.add(id(model))
        inner = wrapped_layer(model)
        if inner is None:
            break
        model = inner
    return model


def optimizer_layers(optimizer) -> list:
    """``optimizer`` and every optimizer it wraps, outermost first; the last is the Paddle optimizer that owns
    ``_accumulators``. A wrapper that points at itself (stage 3's ``_inner_opt``) ends the chain."""
    layers, seen = [], set()
    while optimizer is not None and id(optimizer) not in seen:
        seen.add(id(optimizer))
        layers.append(optimizer)
        d = vars(optimizer)  # not getattr: some wrappers forward unknown attributes to the inner optimizer
        optimizer = next((d[a] for a in _OPTIMIZER_INNER if d.get(a) is not None), None)
    return layers


def unwrap_optimizer(optimizer):
    """The Paddle optimizer inside ``ParallelOptimizer``/``HybridParallelOptimizer``/the sharding wrappers: the
    one that owns ``_accumulators`` (the checkpoint's optimizer states). ``None`` stays ``None``."""
    layers = optimizer_layers(optimizer)
    return layers[-1] if layers else optimizer
