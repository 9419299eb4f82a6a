"""``paddlenlp.trainer.utils.helper``: the nested-output helpers, re-exported from :mod:`paddletrainer.data.nested`."""
from ..data.nested import distributed_concat, nested_concat, nested_detach, nested_numpify, nested_truncate

__all__ = ["distributed_concat", "nested_concat", "nested_detach", "nested_numpify", "nested_truncate"]
