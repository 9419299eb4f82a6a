"""What Paddle's parallel wrappers hide: the user's model inside them (pure, no paddle import)."""

__all__ = ["unwrap_model"]


def unwrap_model(model):
    """The innermost Layer whose ``state_dict`` has the user's names: ``paddle.DataParallel``, fleet's
    TensorParallel/PipelineParallel/ShardingParallel keep it in ``_layers``, the group-sharded stage 2/3
    wrappers in ``_layer``."""
    seen = set()
    while model is not None and id(model) not in seen:
        seen.add(id(model))
        inner = getattr(model, "_layers", None) or getattr(model, "_layer", None)
        if inner is None:
            break
        model = inner
    return model
