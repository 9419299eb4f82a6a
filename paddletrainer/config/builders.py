"""The typed config of each subsystem, built from ``TrainingArguments``' fields — part of the arguments layer.

With ``training_args.py`` and ``paddlenlp_options.py`` this is the only place that reads PaddleNLP's option names; every
subsystem takes the typed value instead (``args.parallel_config``, ``args.amp_config``,
``args.rollback_config``, ``args.metrics_config``, ``args.replica_check_config`` call the builders here). Pure:
no paddle, so ``TrainingArguments`` imports it. The configs of subsystems that import paddle (AMP, rollback,
metrics, the replica check) are defined here for that reason; ``ParallelConfig`` lives in the pure ``parallel.config``.

``parallel_inputs()`` lists the fields ``ParallelConfig`` is built from: PaddleNLP scripts change arguments after
parsing (``gradient_accumulation_steps``, ``per_device_train_batch_size`` ...), and ``TrainingArguments``
rebuilds — and re-checks — its parallel config when one of them has changed. The degree options among them come
from the layout's axes (``parallel.layout.option_axes``), so a new axis's option is included without an edit here.
"""
from __future__ import annotations

import dataclasses
import os
from typing import Optional, Tuple

from . import paddlenlp_options
from ..parallel.config import ParallelConfig
from ..parallel.layout import Layout, option_axes
from ..trainer_utils import default_logdir, normalize_report_to

__all__ = ["AmpSettings", "RollbackConfig", "MetricsConfig", "ReplicaCheckConfig", "PARALLEL_INPUTS", "parallel_inputs",
           "parallel_config_of", "sharding_stage_of", "amp_settings_of", "rollback_config_of", "metrics_config_of",
           "replica_check_config_of"]

# The fields a ParallelConfig (and its Layout) is built from besides the axes' degree options (parallel_inputs()
# adds those); a change to any of them rebuilds it.
PARALLEL_INPUTS = (
    "sharding", "sharding_degree", "hybrid_parallel_topo_order", "sharding_parallel_config",
    "pipeline_parallel_config", "tensor_parallel_config",
    "sequence_parallel", "fuse_sequence_parallel_allreduce", "sharding_stage3_segment_size",
    "virtual_pipeline_model_parallel_size", "gradient_accumulation_steps", "per_device_train_batch_size", "seed",
    "ddp_find_unused_parameters", "data_parallel_size", "amp_master_grad", "split_inputs_sequence_dim",
    "expert_parallel_degree", "use_expert_parallel",  # expert parallel is carved from the data ranks: not an AXES entry
)


def parallel_inputs() -> Tuple[str, ...]:
    """Every field a ``ParallelConfig`` is built from: ``PARALLEL_INPUTS`` and the degree option of each axis."""
    return PARALLEL_INPUTS + tuple(a.option for a in option_axes())


@dataclasses.dataclass(frozen=True)
class AmpSettings:
    """Mixed precision as asked for (``amp.AmpConfig.for_device`` resolves it against the device)."""

    enabled: bool = False
    dtype: str = "float32"  # "float16" | "bfloat16" when enabled
    level: str = "O1"  # "O1" (per-op casting) | "O2" (weights cast, fp32 master weights)
    custom_white_list: Tuple[str, ...] = ()
    custom_black_list: Tuple[str, ...] = ()
    use_scaler: bool = False  # dynamic loss scaling: fp16 only (bf16 has fp32's exponent range)
    init_loss_scaling: float = 2.0**15
    master_grad: bool = False
    fp32_dry_run: bool = False  # on a device without AMP kernels: run the wiring in fp32 instead of refusing


@dataclasses.dataclass(frozen=True)
class RollbackConfig:
    """What ``nan_inf_policy=rollback`` does (see :mod:`paddletrainer.runtime.rollback`)."""

    output_dir: str
    max_retries: int
    lr_factor: float


@dataclasses.dataclass(frozen=True)
class MetricsConfig:
    """Where and to which writers a ``MetricsCallback`` logs: the ``report_to`` writer names (normalised,
    validated by ``metrics.writers``), the ``logging_dir`` and the ``run_name``."""

    report_to: Tuple[str, ...]
    logging_dir: str
    run_name: Optional[str] = None


@dataclasses.dataclass(frozen=True)
class ReplicaCheckConfig:
    """The replica-divergence check (see :mod:`paddletrainer.runtime.replica_check`): every ``every_steps`` optimizer
    steps (0: off); ``sharding_stage`` decides which ranks hold identical weights (stage 3: the dp group only)."""

    every_steps: int
    sharding_stage: int = 0


def sharding_stage_of(options) -> int:
    """The stage number of a parsed ``sharding`` option list (``["stage2", "offload"]`` → 2; none → 0)."""
    stages = [int(str(o)[len("stage"):]) for o in options if str(o).startswith("stage")]
    return max(stages, default=0)


def parallel_config_of(args, layout: Layout) -> ParallelConfig:
    """The :class:`ParallelConfig` of ``args`` (``sharding`` already parsed) for its resolved ``layout``.

    ``args.sharding`` is empty when the layout leaves no sharding group (``TrainingArguments`` drops it, as
    PaddleNLP does), so the stage is read as given: ``ParallelConfig`` refuses a stage without a group. Its
    construction checks the layout; then the ``REFUSED_PARALLEL_OPTIONS`` of the active axes are refused
    here, where PaddleNLP's option names are known (in that order, so a bad layout is reported first).
    """
    config = ParallelConfig(
        layout=layout,
        sharding_stage=sharding_stage_of(args.sharding),
        sharding_offload=any(str(o) == "offload" for o in args.sharding),
        sharding_options=paddlenlp_options.hybrid_parallel_options(args.sharding_parallel_config,
                                                                   "sharding_parallel_config"),
        pipeline_options=paddlenlp_options.hybrid_parallel_options(args.pipeline_parallel_config,
                                                                   "pipeline_parallel_config"),
        tensor_options=paddlenlp_options.hybrid_parallel_options(args.tensor_parallel_config,
                                                                   "tensor_parallel_config"),
        sequence_parallel=bool(args.sequence_parallel),
        fuse_sequence_parallel_allreduce=bool(args.fuse_sequence_parallel_allreduce),
        stage3_segment_size=args.sharding_stage3_segment_size,
        virtual_pp_degree=(1 if args.virtual_pipeline_model_parallel_size is None
                           else args.virtual_pipeline_model_parallel_size),
        accumulate_steps=args.gradient_accumulation_steps,
        micro_batch_size=args.per_device_train_batch_size,
        seed=args.seed,
        find_unused_parameters=args.ddp_find_unused_parameters,
        split_inputs_sequence_dim=bool(args.split_inputs_sequence_dim),
    )
    paddlenlp_options.refuse_unproven_parallel_options(layout, config.pipeline_options, config.sharding_options,
                                            config.tensor_options)
    return config


def amp_settings_of(args) -> AmpSettings:
    """``fp16``/``bf16``, ``fp16_opt_level``, the custom lists, ``scale_loss``, ``amp_master_grad``, ``amp_on_cpu``."""
    if not (args.fp16 or args.bf16):
        return AmpSettings()
    return AmpSettings(
        enabled=True,
        dtype="float16" if args.fp16 else "bfloat16",
        level=args.fp16_opt_level,
        custom_white_list=tuple(args.amp_custom_white_list or ()),
        custom_black_list=tuple(args.amp_custom_black_list or ()),
        use_scaler=bool(args.fp16),
        init_loss_scaling=float(args.scale_loss),
        master_grad=bool(args.amp_master_grad),
        fp32_dry_run=args.amp_on_cpu == "fp32_dry_run",
    )


def rollback_config_of(args) -> Optional[RollbackConfig]:
    """``None`` unless ``nan_inf_policy='rollback'``."""
    if args.nan_inf_policy != "rollback":
        return None
    return RollbackConfig(args.output_dir, args.nan_inf_rollback_max_retries, args.nan_inf_rollback_lr_factor)


def metrics_config_of(args) -> MetricsConfig:
    """``report_to`` (normalised again: scripts may assign it after parsing), ``logging_dir`` (or
    ``<output_dir>/runs/<time>_<host>``) and ``run_name``."""
    return MetricsConfig(report_to=tuple(normalize_report_to(args.report_to)),
                         logging_dir=args.logging_dir or os.path.join(args.output_dir or ".", default_logdir()),
                         run_name=args.run_name)


def replica_check_config_of(args) -> ReplicaCheckConfig:
    """``replica_check_steps`` and the sharding stage of ``args.parallel_config``."""
    return ReplicaCheckConfig(int(args.replica_check_steps), args.parallel_config.sharding_stage)
