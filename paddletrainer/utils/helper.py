"""``paddlenlp.trainer.utils.helper``: the nested-output helpers, re-exported from :mod:`paddletrainer.data.nested`."""
from ..data.nested import (
    distributed_concat,
    nested_concat,
    nested_detach,
    nested_numpify,
    nested_truncate,
    numpy_pad_and_concatenate,
    paddle_pad_and_concatenate,
)

__all__ = ["distributed_concat", "nested_concat", "nested_detach", "nested_numpify", "nested_truncate",
           "paddle_pad_and_concatenate", "numpy_pad_and_concatenate"]
