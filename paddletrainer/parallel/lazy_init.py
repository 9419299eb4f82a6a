"""Sharding stage 3 of a model built under ``paddle.LazyGuard``: each rank materialises only its own slices.

Under ``paddle.LazyGuard`` (Paddle 3.3.1) a parameter is created without storage: its initializer is recorded
as ``param._init_func`` (``functools.partial`` of the initializer's ``forward``) and runs at
``param.initialize()``. :func:`materialize_stage3` gives every parameter ``GroupShardedStage3`` will slice
only this rank's flat slice (``parallel.sharding._ReduceScatterStage3`` installs it as the slice storage, so
no rank ever holds the whole model) and initialises the small, unsliced ones whole.

The values are those of one process that built the model eagerly from the same RNG state: every rank
draws each sliced parameter's whole random stream, in creation order, in flat chunks of ``CHUNK`` elements,
keeping only the part inside its slice, so the peak is one chunk. That is exact on Paddle's CPU kernels for
the initializers of :data:`_STREAMED` (uniform and truncated-normal draw one engine value per element; the
normal draws pairs, hence an even ``CHUNK``; Xavier/Kaiming get the whole parameter's fans). Any other
initializer (or another device, whose generators are offset-based) initialises the parameter whole and
keeps the slice: exact too, with a peak of that one parameter. An initializer that ignores ``LazyGuard``
(Paddle 3.3.1's ``Orthogonal``; a PaddleNLP ``_init_weights`` that ``set_value``s each weight) fills its
parameter at construction, whole and from the stream as it is then: such parameters are not lazy here.
"""
from __future__ import annotations

import copy
import functools
import itertools
import types

import paddle
from paddle.distributed.fleet.meta_parallel.sharding.group_sharded_stage3 import GroupShardedStage3
from paddle.nn.initializer import constant, initializer, kaiming, normal, uniform, xavier

from ..paddle_contract import diagonal_uniform, lazy_init_func

__all__ = ["is_lazy", "lazy_parameter_names", "check_lazy_model", "start_lazy_model", "stage3_slice_ranges",
           "materialize_stage3", "SLICE_ATTR", "ORDER_ATTR", "STAGE3_EXCLUDED_LAYERS"]

SLICE_ATTR = "_paddletrainer_stage3_slice"  # the rank's slice, until GroupShardedStage3 takes it as fw_storage
STAGE3_EXCLUDED_LAYERS = ("GroupNorm",)  # layer classes parallel.sharding keeps unsliced under stage 3
CHUNK = 1 << 20  # elements per draw; even (the CPU normal kernel draws pairs)

# initializer class -> the attribute names of the fans it would compute from the parameter's shape
_STREAMED = {
    normal.NormalInitializer: (), normal.TruncatedNormalInitializer: (), constant.ConstantInitializer: (),
    uniform.UniformInitializer: (), xavier.XavierInitializer: ("_fan_in", "_fan_out"),
    kaiming.MSRAInitializer: ("_fan_in",),
}


ORDER_ATTR = "_paddletrainer_creation_order"  # when the parameter was created under LazyGuard (see below)
_created = itertools.count()


def _record_creation_order() -> None:
    """Stamp every parameter Paddle creates under ``LazyGuard`` with a running number.

    One process draws the initial values at creation, in creation order; ``model.parameters()`` lists a
    layer's own parameters before its sublayers', whatever order ``__init__`` created them in. So the draws
    follow the stamps. Paddle 3.3.1 records every lazy initializer through ``Initializer._lazy_init`` (its
    ``__call__`` under ``lazy_init_helper().state``); wrapped once, when this module is imported (the Trainer
    imports it), so a model must be built after ``import paddletrainer.trainer`` (``from paddletrainer import
    Trainer``), which :func:`check_lazy_model` checks.
    """
    original = initializer.Initializer._lazy_init
    if getattr(original, "__paddletrainer_fill__", False):
        return

    @functools.wraps(original)
    def lazy_init(self, param, block=None):
        setattr(param, ORDER_ATTR, next(_created))
        return original(self, param, block)

    lazy_init.__paddletrainer_fill__ = True
    initializer.Initializer._lazy_init = lazy_init


_record_creation_order()


def _is_lazy_parameter(param) -> bool:
    return lazy_init_func(param) is not None and not param._is_initialized()


def lazy_parameter_names(model) -> list:
    """The names of ``model``'s parameters created under ``paddle.LazyGuard`` and not initialised yet."""
    return [p.name for p in model.parameters() if _is_lazy_parameter(p)]


def is_lazy(model) -> bool:
    """True when some parameter of ``model`` was built under ``paddle.LazyGuard`` and holds no data yet."""
    return bool(lazy_parameter_names(model))


def check_lazy_model(model, config, weights_cast: bool = False) -> None:
    """Refuse a model built under ``paddle.LazyGuard`` on a layout where its parameters cannot be started from
    this rank's slices: anything but sharding stage 3 (``sharding="stage3"``), stage 3 with ``offload``, or
    ``weights_cast`` (AMP O2 casts every weight before the sharding wrapper exists). Needs no process group.
    ``config``: the run's ``ParallelConfig``."""
    if not is_lazy(model):
        return
    unstamped = [p.name for p in model.parameters() if _is_lazy_parameter(p) and not hasattr(p, ORDER_ATTR)]
    if unstamped:
        raise ValueError(f"{type(model).__name__} was built under paddle.LazyGuard before paddletrainer's Trainer "
                         f"was imported ({unstamped[0]} has no recorded creation order): import it first, then "
                         "build the model (its initial values are drawn in creation order, as one process does)")
    if config.sharding_stage != 3:
        raise ValueError(f"{type(model).__name__} was built under paddle.LazyGuard (its parameters hold no data): "
                         "only sharding stage 3 (sharding=\"stage3\", sharding_parallel_degree > 1) starts such a "
                         "model, from each rank's slices; build the model without LazyGuard for this layout")
    if config.sharding_offload or weights_cast:
        what = "sharding offload" if config.sharding_offload else "fp16_opt_level O2 (it casts every weight first)"
        raise ValueError(f"{type(model).__name__} was built under paddle.LazyGuard: stage 3 starts it from slices "
                         f"only without {what}; drop that option or build the model without LazyGuard")


def start_lazy_model(model, topology, config, *, rewind_rng: bool, weights_cast: bool = False) -> None:
    """Materialise ``model``'s lazy parameters for stage 3 on ``topology``'s sharding group (see the module
    docstring), drawing from paddle's RNG state as it is now; ``rewind_rng``: then set that state back (a
    model built before the caller seeded: one process drew its values before that seed). No-op for None or a
    model without lazy parameters; refuses the layouts :func:`check_lazy_model` refuses (``weights_cast``: AMP O2)."""
    if model is None or not is_lazy(model):
        return
    check_lazy_model(model, config, weights_cast)
    device = paddle.get_device().split(":")[0]  # what parallel.sharding gives GroupShardedStage3
    state = paddle.get_rng_state() if rewind_rng else None
    materialize_stage3(model, stage3_slice_ranges(model, rank=topology.sharding_rank,
                                                  nranks=topology.sharding_degree, device=device,
                                                  segment_size=config.stage3_segment_size,
                                                  exclude_layer=STAGE3_EXCLUDED_LAYERS))
    if rewind_rng:
        paddle.set_rng_state(state)


def stage3_slice_ranges(model, *, rank: int, nranks: int, segment_size: int, device: str,
                        exclude_layer=()) -> dict:
    """``{param name: (start, end)}``: the flat range (padding included) of each parameter ``GroupShardedStage3``
    slices that rank ``rank`` keeps — Paddle 3.3.1's ``_flatten_layer_params``: a parameter of more than
    ``segment_size`` elements outside the excluded layer classes, aligned by Paddle's ``_param2align`` for
    ``device``, padded to a multiple of ``nranks``, cut in ``nranks`` equal ranges. ``_ReduceScatterStage3``
    checks each range against Paddle's own when it installs the slice."""
    aligner = types.SimpleNamespace(_default_device=device)
    ranges = {}
    for layer in model.sublayers(include_self=True):
        if type(layer).__name__ in exclude_layer:
            continue
        for param in layer.parameters(include_sublayers=False):
            if param._numel() <= segment_size or param.name in ranges:
                continue
            size = GroupShardedStage3._param2align(aligner, param) + param._numel()
            size += -size % nranks
            ranges[param.name] = (rank * size // nranks, (rank + 1) * size // nranks)
    return ranges


def materialize_stage3(model, ranges: dict) -> None:
    """Initialise ``model``'s lazy parameters in model order: those in ``ranges`` only as their flat slice
    (stored as ``param.<SLICE_ATTR>``, zero beyond the parameter as Paddle's padding), the others whole, in
    the order they were created (see :func:`_record_creation_order`)."""
    lazy = [p for p in model.parameters() if _is_lazy_parameter(p)]
    for param in sorted(lazy, key=lambda p: getattr(p, ORDER_ATTR)):
        if param.name in ranges:
            setattr(param, SLICE_ATTR, _slice_of(param, *ranges[param.name]))
            param._init_func = None  # the parameter itself stays without storage
        else:
            param.initialize()


def _streamable(param):
    """The parameter's initializer when its stream can be drawn in chunks here, else None."""
    func = param._init_func
    init = getattr(getattr(func, "func", None), "__self__", None)
    if not paddle.get_device().startswith("cpu") or init is None:
        return None
    base = next((cls for cls in _STREAMED if type(init).forward is cls.forward), None)
    if base is None or diagonal_uniform(init):  # a diagonal uniform depends on positions
        return None
    init = copy.copy(init)
    fans = init._compute_fans(param)
    for attr, value in zip(_STREAMED[base], fans):
        if getattr(init, attr) is None:
            setattr(init, attr, value)
    return init


@paddle.autograd.no_grad()
def _slice_of(param, start: int, end: int):
    """Elements ``[start, end)`` of ``param``'s flattened initial value, zero past its end."""
    numel, kept = param._numel(), paddle.zeros([end - start], dtype=param.dtype)
    init = _streamable(param)
    if init is None:  # whole parameter, then the slice (peak: this one parameter)
        param.initialize()
        flat = param.flatten()
        if start < numel:
            kept[: min(end, numel) - start] = flat[start:min(end, numel)]
        param._clear_data()
        return kept
    for first in range(0, numel, CHUNK):
        count = min(CHUNK, numel - first)
        chunk = paddle.empty([count], dtype=param.dtype)
        init.forward(chunk, None)  # draws the next `count` values of the parameter's stream
        low, high = max(first, start), min(first + count, end)
        if low < high:
            kept[low - start:high - start] = chunk[low - first:high - first]
    return kept
