"""Hybrid parallelism on Paddle's fleet: topology, per-axis wrappers, and the training-step helpers.

Typical use (what the Trainer does)::

    topology = init_topology(args)
    model, optimizer = parallelize(model, optimizer, topology, args)
    # non-pipeline step, GA micro-batches:
    for i, batch in enumerate(micro_batches):
        ctx = no_sync(model) if i < len(micro_batches) - 1 else contextlib.nullcontext()
        with ctx:
            (loss_fn(model, batch) / len(micro_batches)).backward()
    norm = clip_grad_norm(model, optimizer, topology, max_norm)
    optimizer.step(); optimizer.clear_grad()
    # pipeline step: loss = pipeline.train_batch(model, micro_batches), then the same clip/step.
"""
from . import pipeline
from .apply import parallelize
from .collectives import (
    all_gather_object,
    all_gather_object_over_data_group,
    clip_grad_norm,
    global_grad_norm,
    mean_over_data_group,
)
from .data_parallel import no_sync
from .optimizer import ParallelOptimizer
from .topology import Topology, coordinates_of, get_topology, init_topology

__all__ = [
    "Topology",
    "init_topology",
    "get_topology",
    "coordinates_of",
    "parallelize",
    "ParallelOptimizer",
    "no_sync",
    "clip_grad_norm",
    "global_grad_norm",
    "mean_over_data_group",
    "all_gather_object",
    "all_gather_object_over_data_group",
    "pipeline",
]
