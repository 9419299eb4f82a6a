"""The loss of one batch from what a model returns (the body of ``Trainer.compute_loss``)."""
from __future__ import annotations

from typing import Any, Callable, Dict, Optional, Sequence

import paddle

__all__ = ["batch_loss"]


def batch_loss(model, inputs: Dict[str, Any], criterion: Optional[Callable], label_names: Sequence[str]):
    """``(loss, outputs)``: the model's own loss (a dict's ``"loss"``, a tuple's first item, or a scalar
    output), or with ``criterion`` ``criterion(logits, labels)`` after popping the label keys from ``inputs``
    (then ``outputs`` is ``(loss, logits)``). Raises unless the loss is a scalar tensor."""
    labels = None
    if criterion is not None:
        present = [n for n in label_names if n in inputs]
        if present:
            labels = inputs.pop(present[0]) if len(present) == 1 else tuple(inputs.pop(n) for n in present)
    outputs = model(**inputs)
    if criterion is not None:
        logits = outputs[0] if isinstance(outputs, (tuple, list)) and len(outputs) == 1 else outputs
        loss = criterion(logits, labels)
        outputs = (loss, logits)
    elif isinstance(outputs, dict):
        if "loss" not in outputs:
            raise ValueError(f"the model returned a dict without 'loss' (keys: {sorted(outputs)}); pass labels or a criterion")
        loss = outputs["loss"]
    elif isinstance(outputs, (tuple, list)):
        loss = outputs[0]
    else:
        loss = outputs
    if not isinstance(loss, paddle.Tensor) or loss.size != 1:
        raise ValueError(
            "the model must return a scalar loss first (or give Trainer a criterion); got "
            f"{type(loss).__name__} of shape {getattr(loss, 'shape', '?')}"
        )
    return loss, outputs
