"""Hybrid parallelism on Paddle's fleet: layout and config, topology, per-axis wrappers, step helpers.

Typical use (what the Trainer does)::

    topology = init_topology(args.parallel_config)
    model, optimizer = parallelize(model, optimizer, topology, args.parallel_config)
    # non-pipeline step, GA micro-batches:
    for i, batch in enumerate(micro_batches):
        ctx = no_sync(model) if i < len(micro_batches) - 1 else contextlib.nullcontext()
        with ctx:
            (loss_fn(model, batch) / len(micro_batches)).backward()
    optimizer.sync_gradients()
    norm = clip_grad_norm(model, optimizer, topology, max_norm)
    optimizer.step(); optimizer.clear_grad()
    # pipeline step: loss = pipeline.train_batch(model, micro_batches), then the same sync/clip/step.

``parallel.layout`` and ``parallel.config`` are pure (``TrainingArguments`` builds them without importing
paddle); the names below that need paddle are resolved on first use, so importing this package (which Python
does before any of its modules) stays paddle-free. Every name is also importable from its own module.
"""
import ast
import importlib
from pathlib import Path

from .config import ParallelConfig, resolve_layout
from .layout import AXES, Axis, Layout, coordinates_of

# The modules that need paddle, imported on first attribute access (PEP 562): the public names of
# _NAME_MODULES (read from each one's ``__all__`` without importing it, so no table is written by hand) and the
# _SUBMODULES themselves (``parallel.pipeline``).
_NAME_MODULES = ("topology", "apply", "optimizer", "data_parallel", "collectives", "clipping")
_SUBMODULES = ("pipeline",)
_EAGER = {"AXES", "Axis", "Layout", "ParallelConfig", "resolve_layout", "coordinates_of"}


def _exports(module: str):
    tree = ast.parse((Path(__file__).parent / f"{module}.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
            return ast.literal_eval(node.value)
    return []


# public name -> the module that defines it
_PADDLE_NAMES = {name: module for module in _NAME_MODULES for name in _exports(module) if name not in _EAGER}

__all__ = sorted(_EAGER | set(_SUBMODULES) | set(_PADDLE_NAMES))


def __getattr__(name):
    if name in _SUBMODULES:
        return importlib.import_module("." + name, __name__)
    if name in _PADDLE_NAMES:
        module = importlib.import_module("." + _PADDLE_NAMES[name], __name__)
        return getattr(module, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
