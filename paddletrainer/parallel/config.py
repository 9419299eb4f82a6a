"""``ParallelConfig``: what the parallel package needs from the arguments, typed, and every layout check.

Built by ``TrainingArguments`` from its fields (``args.parallel_config``; the builder is
``paddletrainer.config.builders.parallel_config_of``, rebuilt when a script changes one of those fields), so each check
here raises before any process group exists, with one line naming the option. Pure: no paddle, and nothing from the
arguments layer (the PaddleNLP option tables and their refusals are the builder's); the checks that depend on
the device (:meth:`ParallelConfig.check_device`) take the device as an argument and are called by
``init_topology`` before it creates a group.

A ``ParallelConfig`` is the one way into the parallel package: ``init_topology``, ``build_strategy``,
``parallelize`` and ``apply_sharding`` take one (:func:`expect_config` refuses anything else) and trust its
checks; none of them checks a combination again.

The degrees themselves are a :class:`~paddletrainer.parallel.layout.Layout` (``config.layout``); the
arithmetic that resolves them from PaddleNLP's options is :func:`resolve_layout`.
"""
from __future__ import annotations

import dataclasses
import math
from typing import FrozenSet, Mapping, Optional

from .layout import DEFAULT_TOPO_ORDER, Layout, option_axes

__all__ = ["ParallelConfig", "expect_config", "resolve_layout", "STAGE3_DEFAULT_SEGMENT_SIZE"]

# Under sharding stage 3, parameters with more elements than this are sliced across the sharding group;
# smaller ones stay whole on every rank (Paddle's default). On CPU every slice is padded to a 4096-byte
# boundary (1024 fp32 elements), so slicing tiny tensors only adds padding.
STAGE3_DEFAULT_SEGMENT_SIZE = 2**20


def _named(axis, degree: int) -> bool:
    """Whether messages name ``axis``: the first four always, a later axis (sep, cp) when active."""
    return axis.named_at_degree_1 or degree > 1


def resolve_layout(world_size: int, sharding_requested: bool, requested: Mapping[str, int],
                   topo_order: str = DEFAULT_TOPO_ORDER) -> Layout:
    """PaddleNLP's topology arithmetic over the axes an option sets (``layout.option_axes()``; ``requested``
    maps their names to the option values, a missing one is -1): degrees are ``max(x, 1)``; an unset (-1)
    sharding degree with sharding requested takes what the other axes leave; dp is the rest. Raises if a
    product does not divide the world size."""
    axes = option_axes()
    raw = {a.name: requested.get(a.name, -1) for a in axes}
    for a in axes:
        degree = raw[a.name]
        if isinstance(degree, bool) or not isinstance(degree, int) or degree == 0 or degree < -1:
            raise ValueError(f"{a.option}={degree!r} is invalid: use -1 (unset) or a positive integer")
    # the model axes (all but sharding, whose unset degree is derived from them)
    model = {a: max(raw[a.name], 1) for a in axes if a.name != "sharding"}
    model_size = math.prod(model.values())
    if world_size % model_size:
        raise ValueError(
            f"{' x '.join(f'{a.option}={d}' for a, d in model.items() if _named(a, d))} = {model_size} does not "
            f"divide the world "
            f"size {world_size} (PADDLE_TRAINERS_NUM); launch a multiple of {model_size} processes or lower the degrees"
        )
    if raw.get("sharding", 1) == -1:
        sharding = world_size // model_size if sharding_requested else 1
    else:
        sharding = raw.get("sharding", 1)
    degrees = {a.name: (sharding if a.name == "sharding" else model[a]) for a in axes}
    size = math.prod(degrees.values())
    if world_size % size:
        raise ValueError(
            f"{' x '.join(f'{a.option}={degrees[a.name]}' for a in axes if _named(a, degrees[a.name]))} = {size} "
            f"does not divide the world size "
            f"{world_size} (PADDLE_TRAINERS_NUM)"
        )
    return Layout(world_size=world_size, dp=world_size // size, **degrees, topo_order=topo_order)


@dataclasses.dataclass(frozen=True)
class ParallelConfig:
    """The layout and every per-axis option the parallel package reads (see each field).

    Construction is the one verdict on the layout: the sharding stage against its degree, pp and tp, offload,
    and the pipeline's micro-batches. The option names PaddleNLP accepts but paddletrainer refuses
    (``REFUSED_PARALLEL_OPTIONS``) are the builder's (``config.builders.parallel_config_of``), which reads those names."""

    layout: Layout
    sharding_stage: int = 0  # 0 (off), 1, 2 or 3
    sharding_offload: bool = False  # sharded state in host memory
    sharding_options: FrozenSet[str] = frozenset()  # names given in sharding_parallel_config
    pipeline_options: FrozenSet[str] = frozenset()  # names given in pipeline_parallel_config
    tensor_options: FrozenSet[str] = frozenset()  # names given in tensor_parallel_config
    sequence_parallel: bool = False  # Megatron-style sequence parallel inside tp
    fuse_sequence_parallel_allreduce: bool = False
    stage3_segment_size: int = STAGE3_DEFAULT_SEGMENT_SIZE
    virtual_pp_degree: int = 1  # model chunks per pipeline stage (interleaved schedule)
    accumulate_steps: int = 1  # gradient_accumulation_steps = the pipeline's micro-batches per step
    micro_batch_size: int = 1  # per_device_train_batch_size
    seed: int = 42  # tensor_init_seed: tp ranks draw the same init streams
    find_unused_parameters: Optional[bool] = None  # ddp_find_unused_parameters; None: PaddleNLP's default
    split_inputs_sequence_dim: bool = True  # under sep the Trainer cuts each batch along the sequence

    def __post_init__(self):
        self._check_sharding()
        self._check_pipeline()
        self._check_segment()
        self._check_expert()

    def _check_expert(self) -> None:
        """Expert parallel (carved from the data ranks; the Layout checks that ep divides them) runs with data,
        tensor and pipeline parallel and with sharding stage 1 (not with pp); the axes whose gradient reduction or
        parameter split is not proven with it (sep, cp, stage 2/3, pp with sharding) are refused."""
        d = self.layout
        if d.ep == 1:
            return
        unproven = [(option, degree) for option, degree in (
            ("sep_parallel_degree", d.sep), ("context_parallel_degree", d.cp)) if degree > 1]
        if d.pp > 1 and d.sharding > 1:  # each proven with ep, not the two together
            unproven.append(("sharding_parallel_degree", d.sharding))
        if unproven:
            option, degree = unproven[0]
            raise ValueError(f"expert_parallel_degree={d.ep} with {option}={degree} is not supported yet: use expert "
                             "parallel with data, tensor and pipeline parallel, or sharding stage 1 without pipeline")
        # stage 1 keeps the experts out of its partition (expert.shard_dense_parameters); stage 2/3 and stage 1's
        # split_param would cut or place them by position, mixing different ranks' experts
        if self.sharding_stage in (2, 3) or "split_param" in self.sharding_options:
            which = "split_param" if self.sharding_stage == 1 else f"sharding='stage{self.sharding_stage}'"
            raise ValueError(f"expert_parallel_degree={d.ep} with {which} is not supported yet: use sharding='stage1' "
                             "without split_param")

    def _check_segment(self) -> None:
        """sep (Ulysses) runs with dp, tp, pp and sharding stage 1, ring context parallel (cp) with dp and tp
        (gradients summed over the sep/cp group by Paddle's ``HybridParallelOptimizer``); the combinations not
        proven equal to one process are refused."""
        d = self.layout
        if d.sep == 1 and d.cp == 1:
            return
        option, degree = ("sep_parallel_degree", d.sep) if d.sep > 1 else ("context_parallel_degree", d.cp)
        if not self.split_inputs_sequence_dim:
            raise ValueError(f"split_inputs_sequence_dim=False with {option}={degree}: paddletrainer cuts "
                             "each batch along the sequence itself (after the global sample order); use True")
        if self.sharding_stage in (2, 3):
            raise ValueError(f"sharding='stage{self.sharding_stage}' cannot be combined with {option}="
                             f"{degree}: its gradient reduction skips the sep group; use sharding='stage1'")
        if self.sequence_parallel:
            raise ValueError(f"sequence_parallel=True with {option}={degree} is not supported yet: use one "
                             "of them")
        if d.cp > 1 and d.pp > 1:
            raise ValueError(f"pipeline_parallel_degree={d.pp} with context_parallel_degree={d.cp} is not supported "
                             "yet: use context parallel with data or tensor parallel")
        if d.cp > 1 and self.sharding_stage == 1:
            raise ValueError(f"sharding='stage1' with context_parallel_degree={d.cp} is not supported yet: use "
                             "context parallel with data or tensor parallel")

    def _check_sharding(self) -> None:
        d, stage = self.layout, self.sharding_stage
        if isinstance(self.stage3_segment_size, bool) or self.stage3_segment_size < 0:
            raise ValueError(f"sharding_stage3_segment_size={self.stage3_segment_size!r} is invalid: "
                             "must be >= 0 (0 slices every parameter)")
        if stage not in (0, 1, 2, 3) or (d.sharding > 1) != (stage > 0):
            raise ValueError(f"sharding stage {stage!r} with sharding_parallel_degree={d.sharding}: a sharding group "
                             f"needs sharding='stage1', 'stage2' or 'stage3', and a stage needs a group (degree > 1)")
        if d.pp > 1 and stage in (2, 3):
            raise ValueError(f"sharding='stage{stage}' cannot be combined with pipeline_parallel_degree={d.pp}: "
                             f"use sharding='stage1' with pipeline parallel")
        if d.tp > 1 and stage == 3:
            raise ValueError(f"sharding='stage3' cannot be combined with tensor_parallel_degree={d.tp}: use "
                             f"sharding='stage1' or 'stage2' with tensor parallel")
        if self.sharding_offload and stage == 1:
            raise ValueError("sharding='stage1 offload': stage1 has no offload; use 'stage3 offload'")
        if self.sharding_offload and stage == 2:
            # Refused in every configuration (fp32, fp16/bf16 O2, with or without dp), so no other hint.
            raise ValueError("sharding='stage2 offload' is not supported by paddletrainer: Paddle steps one fused "
                             "host offload buffer that a checkpoint cannot map back to parameters; use 'stage3 offload'")

    def _check_pipeline(self) -> None:
        """The pipeline needs a micro-batch per stage; virtual_pipeline_model_parallel_size picks Paddle's
        interleaved schedules (fleet picks one from accumulate_steps: >= 2·pp the interleaved 1F1B, pp..2·pp-1
        all-forward-then-backward)."""
        pp, ga, vpp = self.layout.pp, self.accumulate_steps, self.virtual_pp_degree
        if pp > 1 and ga < pp:
            raise ValueError(f"gradient_accumulation_steps={ga} is below pipeline_parallel_degree={pp}: the pipeline "
                             f"needs at least one micro-batch per stage")
        if not isinstance(vpp, int) or vpp < 1:
            raise ValueError(f"virtual_pipeline_model_parallel_size={vpp!r} must be an integer >= 1 (1: no interleaving)")
        if vpp > 1 and pp < 2:
            raise ValueError(f"virtual_pipeline_model_parallel_size={vpp} needs pipeline_parallel_degree >= 2 (got "
                             f"{pp}): the chunks interleave over pipeline stages")
        if vpp > 1 and pp < ga < 2 * pp:
            raise ValueError(f"gradient_accumulation_steps={ga} with virtual_pipeline_model_parallel_size={vpp} and "
                             f"pipeline_parallel_degree={pp}: Paddle's interleaved schedules need {pp} (all forward, "
                             f"then all backward) or >= {2 * pp} (interleaved 1F1B) micro-batches")

    def check_device(self, on_cpu: bool) -> None:
        """Raise for options the device cannot run (``init_topology`` calls it before creating any group)."""
        if not on_cpu:
            if self.layout.pp == 2 and self.virtual_pp_degree > 1:
                raise ValueError(f"virtual_pp_degree={self.virtual_pp_degree} needs pipeline_parallel_degree > 2 on "
                                 "GPU (Paddle's interleaved schedule; its two-stage p2p order is fixed only by the "
                                 "CPU backend)")
            return
        for option in ("enable_stage1_tensor_fusion", "enable_stage1_overlap"):
            if option in self.sharding_options:
                raise NotImplementedError(f"sharding_parallel_config {option} needs GPU tensor fusion; not on CPU")
        if "enable_timer" in self.pipeline_options:
            raise NotImplementedError("pipeline_parallel_config enable_timer needs CUDA: Paddle's pipeline timers "
                                      "call paddle.device.cuda.synchronize; not on CPU")
        if {"enable_mp_async_allreduce", "enable_mp_fused_linear_param_grad_add"} & self.tensor_options:
            raise NotImplementedError("tensor_parallel_config async/fused options need CUDA kernels; not on CPU")


def expect_config(config, caller: str) -> ParallelConfig:
    """``config`` if it is a :class:`ParallelConfig`; a ``TypeError`` naming ``caller`` otherwise (the
    ``TrainingArguments`` themselves are not accepted: pass ``args.parallel_config``)."""
    if not isinstance(config, ParallelConfig):
        raise TypeError(f"{caller} takes a ParallelConfig (TrainingArguments.parallel_config), got "
                        f"{type(config).__name__}")
    return config
