"""``paddlenlp.trainer.utils.doc``: decorators that prepend or append text to a docstring.

PaddleNLP scripts use ``@add_start_docstrings(TrainingArguments.__doc__)`` on their ``TrainingArguments``
subclasses so ``--help`` and the class docs keep the parent's option list.
"""
from __future__ import annotations

__all__ = ["add_start_docstrings", "add_start_docstrings_to_model_forward", "add_end_docstrings"]


def add_start_docstrings(*docstr: str):
    """Decorator: the decorated object's docstring becomes ``"".join(docstr)`` followed by its own."""

    def decorate(obj):
        obj.__doc__ = "".join(d or "" for d in docstr) + (obj.__doc__ or "")
        return obj

    return decorate


def add_start_docstrings_to_model_forward(*docstr: str):
    """Like :func:`add_start_docstrings`, for a model's ``forward`` (the same text placement)."""
    return add_start_docstrings(*docstr)


def add_end_docstrings(*docstr: str):
    """Decorator: ``"".join(docstr)`` is appended to the decorated object's docstring."""

    def decorate(obj):
        obj.__doc__ = (obj.__doc__ or "") + "".join(d or "" for d in docstr)
        return obj

    return decorate
