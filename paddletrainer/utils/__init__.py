"""``paddlenlp.trainer.utils`` as a thin alias layer, so scripts written for PaddleNLP import unchanged.

Only the names PaddleNLP's scripts and tests import from this path live here; each is defined elsewhere in
paddletrainer (``paddletrainer.data.nested``) or is a few-line docstring decorator (:mod:`.doc`). New code should
import from those modules directly.
"""
from .doc import add_start_docstrings, add_start_docstrings_to_model_forward, add_end_docstrings
from .helper import distributed_concat, nested_concat, nested_detach, nested_numpify, nested_truncate

__all__ = [
    "add_start_docstrings",
    "add_start_docstrings_to_model_forward",
    "add_end_docstrings",
    "distributed_concat",
    "nested_concat",
    "nested_detach",
    "nested_numpify",
    "nested_truncate",
]
