"""What every fill's Paddle-assumption check is made of.

Each fill module lists the facts about Paddle it relies on (its ``assumptions()``: an :class:`Assumption` per
fact) next to the code that relies on them. :func:`broken_assumptions` evaluates one module's list and words
each broken fact as ``"<that module's file>: <what changed>"``, so a Paddle upgrade names the file to edit.
:func:`paddle_source` and :func:`params_of` read Paddle's own function behind a fill's wrapper.
"""
from __future__ import annotations

import inspect
from types import ModuleType
from typing import Callable, NamedTuple

__all__ = ["Assumption", "broken_assumptions", "fill_file", "paddle_source", "params_of"]


class Assumption(NamedTuple):
    """One fact about Paddle a fill relies on: ``holds()`` is True while it does; ``broken`` says what changed.

    ``holds`` reads Paddle when called (never when the list is built), so a symbol that vanished fails its own
    assumption rather than the whole check.
    """

    holds: Callable[[], bool]
    broken: str


def params_of(func) -> list:
    """The parameter names of Paddle's ``func``, through decorators and a fill's wrapper (``__wrapped_paddle__``)."""
    func = getattr(func, "__wrapped_paddle__", func)
    return list(inspect.signature(inspect.unwrap(func)).parameters)


def paddle_source(func) -> str:
    """The source of Paddle's ``func`` itself, through decorators and the fills' wrappers (``__wrapped_paddle__``):
    what the checks of patched or reproduced Paddle code read (here and in ``parallel.sharding``)."""
    func = getattr(func, "__wrapped_paddle__", func)
    return inspect.getsource(inspect.unwrap(func))


def fill_file(module: ModuleType) -> str:
    """``module``'s file as the repository spells it, e.g. ``paddletrainer/parallel/cpu/group_stores.py``."""
    return module.__name__.replace(".", "/") + ".py"


def broken_assumptions(module: ModuleType) -> list:
    """The assumptions of fill ``module`` that no longer hold, each ``"<its file>: <what changed>"``."""
    problems = []
    for assumption in module.assumptions():
        detail = ""
        try:
            ok = assumption.holds()
        except Exception as exc:  # noqa: BLE001 - any failure to inspect the symbol is a broken assumption
            ok, detail = False, f" ({type(exc).__name__}: {exc})"
        if not ok:
            problems.append(f"{fill_file(module)}: {assumption.broken}{detail}")
    return problems
