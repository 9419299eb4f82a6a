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
from typing import TYPE_CHECKING

from ..lazy_exports import lazy_attributes
from .config import ParallelConfig, resolve_layout
from .layout import AXES, Axis, Layout, coordinates_of

# The modules that need paddle, imported on first attribute access (PEP 562). A literal table, not read from
# the modules' source at import (that breaks a .pyc-only or zipped install); tests/unit/test_parallel_package.py
# checks it against each module's ``__all__``, and tests/unit/test_import_graph.py reads it as import edges.
# public name -> the module that defines it
_PADDLE_NAMES = {
    "Topology": "topology", "init_topology": "topology", "get_topology": "topology", "hybrid_order": "topology",
    "build_strategy": "topology", "check_cpu_options": "topology", "needs_cpu_backend": "topology",
    "reset_for_tests": "topology", "expert_group_ranks": "topology",
    "expert_parallel_group": "expert", "expert_data_parallel_group": "expert", "token_group": "expert",
    "is_expert": "expert", "expert_parameters": "expert", "check_expert_model": "expert",
    "broadcast_initial_state": "expert", "keep_experts": "expert", "shard_dense_parameters": "expert",
    "ExpertGradients": "expert",
    "NUM_EXPERTS_FIELDS": "expert",
    "parallelize": "apply", "wrap_captures_accumulation": "apply",
    "ParallelOptimizer": "optimizer", "LocalOptimizer": "data_parallel", "HybridOptimizer": "hybrid",
    "GradientBuffers": "data_parallel", "apply_data_parallel": "data_parallel", "gradient_buffers": "data_parallel",
    "no_sync": "data_parallel",
    "mean_over_data_group": "collectives", "sum_over_data_group": "collectives",
    "all_gather_object": "collectives",
    "all_gather_object_over_data_group": "collectives", "global_grad_norm": "collectives",
    "GradientClip": "clipping", "take_gradient_clip": "clipping", "clip_gradients": "clipping",
    "check_gradient_clip": "clipping", "clip_grad_norm": "clipping", "clip_named_gradients": "clipping",
}
# modules reachable as attributes themselves (``parallel.pipeline``)
_SUBMODULES = ("pipeline",)
_EAGER = {"AXES", "Axis", "Layout", "ParallelConfig", "resolve_layout", "coordinates_of"}

if TYPE_CHECKING:  # the same names for type checkers and editors' go-to-definition (never executed)
    from . import pipeline
    from .apply import parallelize, wrap_captures_accumulation
    from .clipping import (GradientClip, check_gradient_clip, clip_grad_norm, clip_gradients, clip_named_gradients,
                           take_gradient_clip)
    from .collectives import (all_gather_object, all_gather_object_over_data_group, global_grad_norm,
                              mean_over_data_group, sum_over_data_group)
    from .data_parallel import GradientBuffers, LocalOptimizer, apply_data_parallel, gradient_buffers, no_sync
    from .expert import (ExpertGradients, NUM_EXPERTS_FIELDS, broadcast_initial_state, check_expert_model,
                         expert_data_parallel_group, expert_parallel_group, expert_parameters, is_expert, keep_experts,
                         shard_dense_parameters, token_group)
    from .hybrid import HybridOptimizer
    from .optimizer import ParallelOptimizer
    from .topology import (Topology, build_strategy, check_cpu_options, expert_group_ranks, get_topology,
                           hybrid_order, init_topology, needs_cpu_backend, reset_for_tests)

__all__ = sorted(_EAGER | set(_SUBMODULES) | set(_PADDLE_NAMES))
__getattr__, __dir__ = lazy_attributes(globals(), _PADDLE_NAMES, _SUBMODULES)
