"""Names a module resolves on first use (PEP 562), from a literal table written beside them.

A package ``__init__`` (and ``trainer_utils``, PaddleNLP's module path for names that need paddle) lists what it
exports in a literal dict: public name -> the module that defines it, relative to the module's package
(``"optim.schedules"``), or ``(module, attribute path)`` for a name that is an attribute of a class there. It keeps
a ``TYPE_CHECKING`` mirror of the table beside it for type checkers, and takes its ``__getattr__``/``__dir__``
from :func:`lazy_attributes`: the defining module is imported at the first lookup, so importing the package
does not import it (a paddle-free submodule stays importable without paddle, and ``import paddletrainer``
without paddlenlp).

The tables stay literals in their own modules: ``tests/unit/test_lazy_name_mirrors.py`` compares each with its
mirror and ``tests/unit/test_import_graph.py`` reads them as import edges, both without importing anything.
Stdlib only: ``import paddletrainer`` imports this module before anything else of ours.
"""
import importlib
from typing import Callable, Dict, Iterable, List, Tuple, Union

__all__ = ["lazy_attributes"]

# the module defining a name, or (that module, the attribute path of the name in it)
Target = Union[str, Tuple[str, str]]


def lazy_attributes(namespace: dict, names: Dict[str, Target], submodules: Iterable[str] = ()
                    ) -> Tuple[Callable[[str], object], Callable[[], List[str]]]:
    """``(__getattr__, __dir__)`` for the module whose ``globals()`` is ``namespace``.

    ``names``: public name -> :data:`Target`, modules relative to the module's package. ``submodules``: the
    package's own submodules that are attributes too (``parallel.pipeline``). A name resolved once is stored in
    ``namespace``: the next lookup is a plain attribute. Anything else raises ``AttributeError``, as Python does.
    """
    module_name, package = namespace["__name__"], namespace["__package__"]
    submodules = frozenset(submodules)

    def __getattr__(name: str):
        if name in submodules:
            return importlib.import_module(f".{name}", package)
        target = names.get(name)
        if target is None:
            raise AttributeError(f"module {module_name!r} has no attribute {name!r}")
        module, path = target if isinstance(target, tuple) else (target, name)
        value = importlib.import_module(f".{module}", package)
        for attribute in path.split("."):
            value = getattr(value, attribute)
        namespace[name] = value
        return value

    def __dir__() -> List[str]:
        return sorted(set(namespace) | set(names) | submodules)

    return __getattr__, __dir__
