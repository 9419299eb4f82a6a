"""``TrainingArguments``: every option of ``paddlenlp.trainer.TrainingArguments`` (3.0.0b4), same names, defaults
and meanings, plus a few of ours; validated and resolved at construction, with no distributed side effects.

Construction reads the launch environment (``PADDLE_TRAINERS_NUM``, ``PADDLE_RANK_IN_NODE``/``PADDLE_LOCAL_RANK``,
via ``parallel.layout``) so that parallel degrees are checked before any process group exists; it never creates
one. It exposes the typed config of each subsystem (``parallel_config``, whose construction runs every layout
check and is redone when a script changes a field it is built from; ``amp_config``, ``rollback_config``,
``metrics_config``: read-only attributes of :mod:`paddletrainer.config.derived_values`), built by
:mod:`paddletrainer.config.builders`. Degree fields keep the values given.

Ranks (``tensor_parallel_rank`` ...) need the real process groups: the first lookup in a multi-process run calls
``paddletrainer.parallel.topology.init_topology(self.parallel_config)``. That function-level import (in
:mod:`paddletrainer.config.arguments_base`, the base class with the ranks and the serialization) is the one place
where the arguments reach into ``parallel.topology`` (which imports paddle; they stay importable without it).

PaddleNLP options refused, accepted without effect or translated (and where we differ on purpose): the tables and
checks of :mod:`paddletrainer.config.paddlenlp_options`; the layout rules: :mod:`paddletrainer.parallel.config`.
"""

import logging
import os
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Dict, List, Literal, Optional

from .config import arg_checks
from .config import paddlenlp_options
from .argparser import RAW_VALUE
# re-exported: these names have been importable from here
from .config.paddlenlp_options import (PIPELINE_PARALLEL_OPTIONS, REFUSED_PARALLEL_OPTIONS, SHARDING_PARALLEL_OPTIONS,  # noqa: F401
                     TENSOR_PARALLEL_OPTIONS, UNIFIED_CHECKPOINT_OPTIONS, parse_parallel_config, parse_sharding)
from .config.builders import parallel_config_of, parallel_inputs
# re-exported: the builders of the derived configs (config.derived_values uses them) have been importable from here
from .config.builders import amp_settings_of, metrics_config_of, replica_check_config_of, rollback_config_of  # noqa: F401
from .config.derived_values import DerivedValues
from .config.hf_options import HFOptions
from .config.arguments_base import ArgumentsRanksAndSerialization
from .parallel.config import STAGE3_DEFAULT_SEGMENT_SIZE, resolve_layout
from .parallel.layout import DEFAULT_TOPO_ORDER, Layout, launch_local_rank, launch_world_size, option_axes
from .checkpoint.discovery import check_resume_value
from .trainer_utils import (IntervalStrategy, OptimizerNames, SchedulerType,  # noqa: F401
                            ShardingOption, default_logdir, normalize_report_to)

# The resolved layout type and its arithmetic, under the names this module has always exported.
ParallelDegrees = Layout
resolve_parallel_degrees = resolve_layout

__all__ = [
    "TrainingArguments",
    "ParallelDegrees",
    "default_logdir",
    "PIPELINE_PARALLEL_OPTIONS",
    "REFUSED_PARALLEL_OPTIONS",
    "SHARDING_PARALLEL_OPTIONS",
    "TENSOR_PARALLEL_OPTIONS",
    "UNIFIED_CHECKPOINT_OPTIONS",
    "parse_parallel_config",
    "parse_sharding",
    "resolve_parallel_degrees",
]

logger = logging.getLogger(__name__)


def _enum(enum_cls, value, option: str):
    """``enum_cls(value)`` with an error naming the option, the value and the valid values."""
    try:
        return enum_cls(value.value if isinstance(value, Enum) else value)
    except ValueError:
        valid = ", ".join(m.value for m in enum_cls)
        raise ValueError(f"{option}={value!r} is not valid; choose one of: {valid}") from None


def _choice(value, valid, option: str) -> None:
    if value not in valid:
        raise ValueError(f"{option}={value!r} is not valid; choose one of: {', '.join(map(str, valid))}")


def _positive(value, option: str, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if value is None or isinstance(value, bool) or value <= 0:
        raise ValueError(f"{option}={value!r} is invalid: must be a positive number")


def _help(text: str, **extra) -> Dict[str, Any]:
    return {"help": text, **extra}


@dataclass
class TrainingArguments(HFOptions, ArgumentsRanksAndSerialization, DerivedValues):
    """Options of the training loop, as in ``paddlenlp.trainer.TrainingArguments``; the derived values
    (``parallel_config``, ``parallel_degrees``, ``sharding_stage``, ``*_parallel_options``, batch sizes) come from
    :class:`~paddletrainer.config.derived_values.DerivedValues`, the rank properties from
    :class:`~paddletrainer.config.arguments_base.ArgumentsRanksAndSerialization`. ``PdArgumentParser(TrainingArguments)`` turns every field into ``--field``."""
    _option_aliases = {**paddlenlp_options.PADDLEFORMERS_NAMES, "sharding_degree": "sharding_parallel_degree"}  # errors name them

    # ---------------------------------------------------------------- run, phases
    output_dir: str = field(metadata=_help("Where checkpoints, logs and predictions are written."))
    overwrite_output_dir: bool = field(default=False, metadata=_help(
        "Overwrite the content of output_dir (use it to restart a run that left checkpoints there)."))
    do_train: bool = field(default=False, metadata=_help("Run training (read by your script)."))
    do_eval: bool = field(default=False, metadata=_help(
        "Run evaluation on the dev set (set automatically when evaluation_strategy is not 'no')."))
    do_predict: bool = field(default=False, metadata=_help("Run prediction on the test set (read by your script)."))
    do_export: bool = field(default=False, metadata=_help("Export an inference model (read by your script)."))
    evaluation_strategy: IntervalStrategy = field(default="no", metadata=_help(
        "When to evaluate during training: no, steps (every eval_steps) or epoch."))
    prediction_loss_only: bool = field(default=False, metadata=_help("In evaluation and prediction, return only the loss."))

    # ---------------------------------------------------------------- batch sizes, optimizer, schedule
    per_device_train_batch_size: int = field(default=8, metadata=_help("Training batch size per process."))
    per_device_eval_batch_size: int = field(default=8, metadata=_help("Evaluation batch size per process."))
    gradient_accumulation_steps: int = field(default=1, metadata=_help(
        "Micro-batches whose gradients are accumulated before each optimizer step (the pipeline's micro-batches "
        "under pipeline parallel)."))
    eval_accumulation_steps: Optional[int] = field(default=None, metadata=_help(
        "Prediction steps to accumulate on the device before moving outputs to the host (None: keep all)."))
    learning_rate: float = field(default=5e-5, metadata=_help("Peak learning rate."))
    weight_decay: float = field(default=0.0, metadata=_help(
        "Decoupled weight decay, applied to all parameters but biases and norms."))
    adam_beta1: float = field(default=0.9, metadata=_help("beta1 of Adam/AdamW."))
    adam_beta2: float = field(default=0.999, metadata=_help("beta2 of Adam/AdamW."))
    adam_epsilon: float = field(default=1e-8, metadata=_help("epsilon of Adam/AdamW."))
    max_grad_norm: float = field(default=1.0, metadata=_help(
        "Clip gradients to this global norm (over all parallel groups); <= 0 disables clipping."))
    num_train_epochs: float = field(default=1.0, metadata=_help("Number of training epochs (may be fractional)."))
    max_steps: int = field(default=-1, metadata=_help(
        "If > 0, total number of optimizer steps; overrides num_train_epochs."))
    lr_scheduler_type: SchedulerType = field(default="linear", metadata=_help(
        "Learning-rate schedule: linear, cosine, constant, constant_with_warmup or polynomial."))
    warmup_ratio: float = field(default=0.0, metadata=_help(
        "Fraction of the total steps used for linear warmup (ignored when warmup_steps > 0)."))
    warmup_steps: int = field(default=0, metadata=_help("Number of linear warmup steps."))
    num_cycles: float = field(default=0.5, metadata=_help("Number of cosine waves of the cosine schedule."))
    lr_end: float = field(default=1e-7, metadata=_help("Final learning rate of the polynomial schedule."))
    power: float = field(default=1.0, metadata=_help("Power of the polynomial schedule."))
    min_learning_rate: float = field(default=0.0, metadata=_help(
        "Floor of the linear and cosine schedules (PaddleNLP's LLM scripts' option); 0 decays to zero."))

    # ---------------------------------------------------------------- logging and saving
    log_on_each_node: bool = field(default=True, metadata=_help(
        "In multi-node runs, log on the first process of every node instead of only on process 0."))
    logging_dir: Optional[str] = field(default=None, metadata=_help(
        "Directory of the metric logs; None means output_dir/runs/<time>_<host>."))
    output_signal_dir: Optional[str] = field(default=None, metadata=_help(
        "Directory of the asynchronous-save signal files; None means output_dir."))
    logging_strategy: IntervalStrategy = field(default="steps", metadata=_help(
        "When to log: no, steps (every logging_steps) or epoch."))
    logging_first_step: bool = field(default=False, metadata=_help("Also log the first step."))
    logging_steps: int = field(default=500, metadata=_help("Log every N optimizer steps."))
    save_strategy: IntervalStrategy = field(default="steps", metadata=_help(
        "When to save a checkpoint: no, steps (every save_steps) or epoch."))
    save_steps: int = field(default=500, metadata=_help("Save a checkpoint every N optimizer steps."))
    save_total_limit: Optional[int] = field(default=None, metadata=_help(
        "Keep at most this many checkpoints in output_dir, deleting the oldest (the best one is kept)."))
    save_on_each_node: bool = field(default=False, metadata=_help(
        "In multi-node runs, save on every node (for node-local disks) instead of only on process 0."))
    no_cuda: bool = field(default=False, metadata=_help("Do not use an accelerator even when one is available."))
    seed: int = field(default=42, metadata=_help("Random seed set at the start of training."))

    # ---------------------------------------------------------------- mixed precision
    bf16: bool = field(default=False, metadata=_help("Train with bfloat16 mixed precision."))
    fp16: bool = field(default=False, metadata=_help("Train with float16 mixed precision (with loss scaling)."))
    fp16_opt_level: Literal["O0", "O1", "O2"] = field(default="O1", metadata=_help(
        "AMP level: O1 casts per op by allow/block lists, O2 keeps float16/bfloat16 parameters with fp32 masters."))
    amp_master_grad: bool = field(default=False, metadata=_help(
        "With O2, keep float32 gradients for clipping, weight decay and the update (needs fp16 or bf16)."))
    bf16_full_eval: bool = field(default=False, metadata=_help("Evaluate fully in bfloat16."))
    fp16_full_eval: bool = field(default=False, metadata=_help("Evaluate fully in float16."))
    amp_custom_black_list: Optional[List[str]] = field(default=None, metadata=_help(
        "Ops kept in float32 under AMP (numerically dangerous ops)."))
    amp_custom_white_list: Optional[List[str]] = field(default=None, metadata=_help(
        "Ops run in float16/bfloat16 under AMP (numerically safe, performance-critical ops)."))
    scale_loss: float = field(default=2**15, metadata=_help("Initial loss scale for fp16."))

    # ---------------------------------------------------------------- parallelism
    sharding: str = field(default="", metadata=_help(
        "ZeRO sharding: stage1 (optimizer state), stage2 (+ gradients) or stage3 (+ parameters); add ' offload' "
        "to stage2/3 to keep the sharded state in host memory. Becomes a list of ShardingOption.", **{RAW_VALUE: True}))
    sharding_degree: int = field(default=-1, metadata=_help("Deprecated: use sharding_parallel_degree."))
    sharding_parallel_degree: int = field(default=-1, metadata=_help(
        "Size of a sharding group; -1 with sharding set: all processes left after tensor and pipeline parallel."))
    sharding_parallel_mesh_dimension: str = field(default="dp", metadata=_help(
        "Mesh dimension used for sharding (PaddleNLP auto-parallel option; kept for config compatibility)."))
    sharding_comm_buffer_size_MB: int = field(default=-1, metadata=_help(
        "Size of the fused gradient buffer of sharding communication; -1 keeps Paddle's default (256 MB)."))
    save_sharded_model: bool = field(default=False, metadata=_help(
        "With sharding stage1, each sharding rank saves only its part of the model."))
    load_sharded_model: bool = field(default=False, metadata=_help("Load a model saved with save_sharded_model."))
    tensor_parallel_degree: int = field(default=-1, metadata=_help(
        "Tensor (model) parallel degree: each layer is split over this many processes; the model must be "
        "written with tensor-parallel layers. -1: off."))
    pipeline_parallel_degree: int = field(default=-1, metadata=_help(
        "Pipeline parallel degree: the layers are cut into this many stages; the model must be a PipelineLayer. "
        "-1: off."))
    sep_parallel_degree: int = field(default=-1, metadata=_help(
        "Sequence-segment parallel degree (Ulysses): the ranks of a sep group read the same samples, each keeps "
        "1/sep of every sequence; the model needs a sep path (PaddleNLP's Llama with config.sep_parallel_degree). "
        "-1: off."))
    split_inputs_sequence_dim: bool = field(default=True, metadata=_help(
        "Under sep/context parallel, split the inputs along the sequence dimension."))
    context_parallel_degree: int = field(default=-1, metadata=_help(
        "Ring context parallel degree: the ranks of a cp group read the same samples, each keeps chunks r and "
        "2*cp-1-r of 2*cp chunks of every sequence; the model needs a cp path (PaddleNLP's Llama with "
        "config.context_parallel_degree and use_flash_attention). -1: off."))
    expert_parallel_degree: int = field(default=-1, metadata=_help(
        "Expert parallel degree (MoE): that many data ranks split the experts; must divide dp × sharding."))
    expert_tensor_parallel_degree: int = field(default=-1, metadata=_help(
        "Expert tensor parallel degree (unsupported in PaddleNLP too): must stay -1 or 1."))
    data_parallel_config: str = field(default="", metadata=_help(
        "Data-parallel options of PaddleNLP's auto-parallel mode (kept for config compatibility)."))
    sequence_parallel: bool = field(default=False, metadata=_help(
        "Megatron-style sequence parallel inside tensor parallel (the model must support it)."))
    fuse_sequence_parallel_allreduce: bool = field(default=False, metadata=_help(
        "Fuse the sequence-parallel gradient all-reduces."))
    sequence_parallel_config: str = field(default="", metadata=_help(
        "Sequence-parallel options of PaddleNLP's auto-parallel mode (kept for config compatibility)."))
    tensor_parallel_config: str = field(default="", metadata=_help(
        "Tensor-parallel options, space or comma separated: " + ", ".join(sorted(TENSOR_PARALLEL_OPTIONS)) + "."))
    pipeline_parallel_config: str = field(default="", metadata=_help(
        "Pipeline-parallel options, space or comma separated: " + ", ".join(sorted(PIPELINE_PARALLEL_OPTIONS)) + "."))
    sharding_parallel_config: str = field(default="", metadata=_help(
        "Sharding options, space or comma separated: " + ", ".join(sorted(SHARDING_PARALLEL_OPTIONS)) + "."))
    hybrid_parallel_topo_order: Optional[Literal["pp_first", "sharding_first"]] = field(default=None, metadata=_help(
        "Order of the hybrid axes: pp_first (dp, pp, sharding, mp) or sharding_first (dp, sharding, pp, mp); "
        "None means pp_first."))
    recompute: bool = field(default=False, metadata=_help(
        "Recompute activations in the backward pass to save memory (transformer blocks)."))
    refined_recompute: str = field(default="", metadata=_help(
        "Per-op recompute skip counts, e.g. 'flash_attn:-1,mlp_row_ln:5' (ops: "
        + ", ".join(paddlenlp_options.REFINED_RECOMPUTE_OPS) + "); becomes a dict.", **{RAW_VALUE: True}))

    # ---------------------------------------------------------------- evaluation and data
    minimum_eval_times: Optional[int] = field(default=None, metadata=_help(
        "If evaluating every eval_steps would evaluate fewer times than this, eval_steps is lowered."))
    local_rank: int = field(default=-1, metadata=_help(
        "Rank of the process on its node (set from PADDLE_RANK_IN_NODE / PADDLE_LOCAL_RANK when launched)."))
    dataloader_drop_last: bool = field(default=False, metadata=_help("Drop the last incomplete batch."))
    eval_steps: Optional[int] = field(default=None, metadata=_help("Evaluate every N steps; None means logging_steps."))
    max_evaluate_steps: int = field(default=-1, metadata=_help("If > 0, evaluate on at most this many batches."))
    dataloader_num_workers: int = field(default=0, metadata=_help(
        "Data-loading subprocesses; 0 loads in the main process."))
    past_index: int = field(default=-1, metadata=_help(
        "If >= 0, that output of the model is fed back as the past state at the next step."))
    run_name: Optional[str] = field(default=None, metadata=_help("Name of the run for loggers; None means output_dir."))
    device: Optional[str] = field(default="gpu", metadata=_help("Device: cpu, gpu, xpu, npu ..."))
    disable_tqdm: Optional[bool] = field(default=None, metadata=_help("Disable the progress bars."))
    remove_unused_columns: Optional[bool] = field(default=True, metadata=_help(
        "Drop dataset columns that the model's forward does not take."))
    label_names: Optional[List[str]] = field(default=None, metadata=_help("Input keys that hold the labels."))
    load_best_model_at_end: Optional[bool] = field(default=False, metadata=_help(
        "Load the best checkpoint (by metric_for_best_model) at the end of training."))
    metric_for_best_model: Optional[str] = field(default=None, metadata=_help(
        "Metric that ranks checkpoints; None means 'loss' when load_best_model_at_end."))
    greater_is_better: Optional[bool] = field(default=None, metadata=_help(
        "Whether a larger metric_for_best_model is better; None means False for losses, True otherwise."))
    ignore_data_skip: bool = field(default=False, metadata=_help(
        "On resume, do not skip the data already seen (faster start, different data order)."))
    optim: OptimizerNames = field(default="adamw", metadata=_help(
        "Optimizer: " + ", ".join(m.value for m in OptimizerNames) + "."))
    report_to: Optional[List[str]] = field(default=None, metadata=_help(
        "Metric loggers; None means visualdl, 'none' means no logger."))
    ddp_find_unused_parameters: Optional[bool] = field(default=None, metadata=_help(
        "Plain data parallel: leave no gradient on parameters no rank used in the step (PaddleNLP: "
        "find_unused_parameters of paddle.DataParallel); unset: true unless the model recomputes."))
    wandb_api_key: Optional[str] = field(default=None, metadata=_help("Weights & Biases API key."))
    wandb_http_proxy: Optional[str] = field(default=None, metadata=_help("HTTP proxy for Weights & Biases."))
    resume_from_checkpoint: Optional[str] = field(default=None, metadata=_help(
        "Resume training from: a checkpoint-N directory, true (the newest complete checkpoint in output_dir) or "
        "auto (the newest if there is one, else start fresh; for jobs restarted by the launcher)."))
    auto_parallel_resume_form_hybrid_parallel: Optional[bool] = field(default=False, metadata=_help(
        "PaddleNLP auto-parallel option (kept for config compatibility)."))
    skip_memory_metrics: bool = field(default=True, metadata=_help(
        "Do not add memory reports to the metrics (False: host RSS and GPU memory deltas of train/eval/predict)."))
    flatten_param_grads: Optional[bool] = field(default=False, metadata=_help(
        "Flatten parameters and gradients in the optimizer (NPU only)."))
    lazy_data_processing: Optional[bool] = field(default=True, metadata=_help("Process data lazily."))

    # ---------------------------------------------------------------- checkpoints
    use_async_save: Optional[bool] = field(default=False, metadata=_help("Save the optimizer asynchronously."))
    ordered_save_group_size: int = field(default=0, metadata=_help(
        "Save checkpoints in groups of this many processes in turn; 0: all at once."))
    metrics_output_path: Optional[str] = field(default=None, metadata=_help(
        "A directory where every rank appends its logs as JSON lines to metrics_rank<rank>.json (None: do not)."))
    skip_profile_timer: Optional[bool] = field(default=True, metadata=_help(
        "Skip PaddleNLP's framework timers (see log_phase_timers for ours)."))
    distributed_dataloader: Optional[bool] = field(default=False, metadata=_help(
        "Only tensor/pipeline rank 0 reads data and broadcasts it (forced off without tp or pp)."))
    unified_checkpoint: Optional[bool] = field(default=False, metadata=_help(
        "PaddleNLP's unified checkpoint. Ours are always layout-independent; PaddleNLP's unified files are not "
        "written (a warning says so; paddletrainer-export-paddlenlp-unified converts a checkpoint) and are read "
        "whatever this option says."))
    to_static: Optional[bool] = field(default=False, metadata=_help(
        "Train in static-graph mode. Not supported by paddletrainer: must stay False."))
    unified_checkpoint_config: Optional[str] = field(default="", metadata=_help(
        "Unified-checkpoint options, space separated: " + ", ".join(sorted(UNIFIED_CHECKPOINT_OPTIONS)) + "."))
    ckpt_quant_stage: Literal["O0", "O1", "O2"] = field(default="O0", metadata=_help(
        "Checkpoint quantization: O0 off, O1 int8, O2 int4 optimizer states."))
    ignore_load_lr_and_optim: Optional[bool] = field(default=False, metadata=_help(
        "On resume, load weights only, not the optimizer and scheduler."))
    ignore_save_lr_and_optim: Optional[bool] = field(default=False, metadata=_help(
        "Save weights only, not the optimizer and scheduler."))
    force_reshard_pp: Optional[bool] = field(default=False, metadata=_help(
        "Reshard pipeline stages on load even when the pipeline degree is unchanged."))
    enable_auto_parallel: Optional[bool] = field(default=False, metadata=_help(
        "PaddleNLP's semi-auto parallel mode. Not supported by paddletrainer: must stay False."))
    use_expert_parallel: Optional[bool] = field(default=False, metadata=_help(
        "MoE expert parallel over the data-parallel group: expert_parallel_degree = dp (experts marked is_expert, "
        "as paddletrainer.moe.MoELayer does; PaddleNLP's own MoELayer is refused under it)."))
    expert_max_capacity: Optional[int] = field(default=2**32, metadata=_help("MoE expert max token capacity."))
    expert_min_capacity: Optional[int] = field(default=1, metadata=_help("MoE expert min token capacity."))
    release_grads: Optional[bool] = field(default=False, metadata=_help(
        "Release gradient memory after each optimizer step."))
    skip_data_intervals: Optional[List[List[int]]] = field(default=None, metadata=_help(
        "Global-step intervals [start, end] whose data is skipped (counted, not trained)."))
    offload_optim: Optional[bool] = field(default=False, metadata=_help(
        "Move optimizer states to host memory after each step."))
    save_sharding_stage1_model_include_freeze_params: Optional[bool] = field(default=False, metadata=_help(
        "With save_sharded_model, also save frozen parameters."))
    pdc_download_ckpt: Optional[bool] = field(default=False, metadata=_help(
        "PaddleCloud: download the checkpoint from the remote cluster."))
    pdc_download_timeout: Optional[int] = field(default=300, metadata=_help(
        "PaddleCloud: checkpoint download timeout in seconds."))
    count_trained_tokens: bool = field(default=False, metadata=_help("Count the trained (non-pad) tokens."))
    pad_token_id: int = field(default=0, metadata=_help("Id of the padding token (for count_trained_tokens)."))

    # ---------------------------------------------------------------- PaddleFormers 1.2 names (aliases)
    tensor_model_parallel_size: Optional[int] = field(default=None, metadata=_help(
        "PaddleFormers' name for tensor_parallel_degree."))
    pipeline_model_parallel_size: Optional[int] = field(default=None, metadata=_help(
        "PaddleFormers' name for pipeline_parallel_degree."))
    virtual_pipeline_model_parallel_size: Optional[int] = field(default=None, metadata=_help(
        "Interleaved pipeline: model chunks per pipeline stage (PaddleFormers' name; the ...Pipe model splits the "
        "layers into pipeline_parallel_degree x this chunks). PaddleNLP's llm scripts take it as the *model* "
        "argument virtual_pp_degree (or, decorated by llmmetaclass, a field of their TrainingArguments subclass) and "
        "copy it to the model config; the Trainer then reads the chunk "
        "count from the model. None/1: off."))
    sharding_parallel_size: Optional[int] = field(default=None, metadata=_help(
        "PaddleFormers' name for sharding_parallel_degree."))
    data_parallel_size: Optional[int] = field(default=None, metadata=_help(
        "PaddleFormers' data-parallel degree; here it is what the world size leaves, and a value is checked "
        "against it."))
    context_parallel_size: Optional[int] = field(default=None, metadata=_help(
        "PaddleFormers' name for context_parallel_degree."))
    expert_model_parallel_size: Optional[int] = field(default=None, metadata=_help(
        "PaddleFormers' name for expert_parallel_degree."))
    expert_tensor_model_parallel_size: Optional[int] = field(default=None, metadata=_help(
        "PaddleFormers' name for expert_tensor_parallel_degree."))

    # ---------------------------------------------------------------- paddletrainer's own options
    checkpoint_async_save: bool = field(default=False, metadata=_help(
        "Write checkpoints in a background thread; the state is copied to host memory before the next optimizer "
        "step, and nothing (e.g. an on_save callback) may change weights in place until then: it would be saved."))
    loss_average: Literal["global_batch", "micro_batch"] = field(default="global_batch", metadata=_help(
        "global_batch: a step's loss and eval_loss are means over every trained token (labels != ignore index; a loss "
        "per sample: every sample) of the global batch, on any layout; micro_batch: PaddleNLP's mean of batch means."))
    nan_inf_policy: Literal["error", "skip", "rollback"] = field(default="error", metadata=_help(
        "On a NaN/Inf loss or gradient: error (stop with a report), skip (drop the step and go on) or rollback "
        "(reload the newest checkpoint and skip the samples trained on since it). Under fp16 with a loss scale "
        "above 1 an overflow is always skipped and the scale halved."))
    nan_inf_rollback_max_retries: int = field(default=3, metadata=_help(
        "nan_inf_policy=rollback: rollbacks allowed in one train() call before a NaN/Inf step is an error."))
    nan_inf_rollback_lr_factor: float = field(default=1.0, metadata=_help(
        "nan_inf_policy=rollback: multiply the learning rate by this after each rollback (1.0: unchanged)."))
    replica_check_steps: int = field(default=100, metadata=_help(
        "Every N optimizer steps the data-parallel/sharding replicas compare a checksum of their weights (0: off)."))
    collective_timeout_seconds: Optional[int] = field(default=None, metadata=_help(
        "Timeout of collective operations in seconds (None: Paddle's default)."))
    log_phase_timers: bool = field(default=False, metadata=_help(
        "Log per-phase times (data, forward-backward, gradient sync, optimizer, checkpoint)."))
    peak_flops_per_device: Optional[float] = field(default=None, metadata=_help(
        "Peak FLOP/s of one device, to report MFU (None: MFU is not logged)."))
    amp_on_cpu: Literal["error", "fp32_dry_run"] = field(default="error", metadata=_help(
        "What fp16/bf16 does on a CPU-only Paddle: error, or fp32_dry_run (run in float32 with a loud warning)."))
    sharding_stage3_segment_size: int = field(default=STAGE3_DEFAULT_SEGMENT_SIZE, metadata=_help(
        "Sharding stage3: parameters with more elements than this are sliced across the sharding group; "
        "smaller ones stay whole on every rank (Paddle's default 2**20; lower it to slice a small model, "
        "0 slices every parameter)."))

    # ================================================================ construction
    def __post_init__(self):
        self._world_size = launch_world_size()
        arg_checks.check_option_values(self)  # NaN/inf, int64 and the RANGES table, for every field
        self._normalize_paths()
        self._apply_hf_options()  # hf_options: refusals and the name-level translations (use_cpu, save_only_model)
        self._normalize_schedule_and_strategies()
        self._check_sizes()
        self._check_best_model()
        self._check_precision()
        paddlenlp_options.apply_paddleformers_names(self)
        self._resolve_parallel()
        paddlenlp_options.apply_options_without_behaviour(self)
        self._normalize_checkpoint_and_misc()
        # checkable before training: a bad resume path is a usage error, not a failure after model building
        check_resume_value(self.resume_from_checkpoint, self.output_dir)

    def _normalize_paths(self) -> None:
        local = launch_local_rank()
        if local is not None and self._world_size > 1:
            self.local_rank = local
        self.output_dir = arg_checks.usable_output_dir(self.output_dir)  # "~" expanded; "", a file refused
        if self.logging_dir is None and self.output_dir is not None:
            self.logging_dir = os.path.join(self.output_dir, default_logdir())
        if self.logging_dir is not None:
            self.logging_dir = os.path.expanduser(self.logging_dir)
        if self.output_signal_dir is None:
            self.output_signal_dir = self.output_dir
        if self.output_signal_dir is not None:
            self.output_signal_dir = os.path.expanduser(self.output_signal_dir)
        if self.run_name is None:
            self.run_name = self.output_dir
        if self.disable_tqdm is None:
            self.disable_tqdm = False

    def _normalize_schedule_and_strategies(self) -> None:
        self.evaluation_strategy = _enum(IntervalStrategy, self.evaluation_strategy, "evaluation_strategy")
        self.logging_strategy = _enum(IntervalStrategy, self.logging_strategy, "logging_strategy")
        self.save_strategy = _enum(IntervalStrategy, self.save_strategy, "save_strategy")
        self.lr_scheduler_type = _enum(SchedulerType, self.lr_scheduler_type, "lr_scheduler_type")
        self.optim = _enum(OptimizerNames, self.optim, "optim")
        _choice(self.fp16_opt_level, ("O0", "O1", "O2"), "fp16_opt_level")
        _choice(self.ckpt_quant_stage, ("O0", "O1", "O2"), "ckpt_quant_stage")
        _choice(self.nan_inf_policy, ("error", "skip", "rollback"), "nan_inf_policy")
        _choice(self.loss_average, ("global_batch", "micro_batch"), "loss_average")
        if isinstance(self.nan_inf_rollback_max_retries, bool) or self.nan_inf_rollback_max_retries < 0:
            raise ValueError(f"nan_inf_rollback_max_retries={self.nan_inf_rollback_max_retries!r} is invalid: "
                             "must be >= 0")
        if not 0 < self.nan_inf_rollback_lr_factor <= 1:
            raise ValueError(f"nan_inf_rollback_lr_factor={self.nan_inf_rollback_lr_factor!r} is invalid: must lie "
                             "in (0, 1]")
        _choice(self.amp_on_cpu, ("error", "fp32_dry_run"), "amp_on_cpu")
        if self.hybrid_parallel_topo_order is None:  # as PaddleNLP: the field reads the default after parsing
            self.hybrid_parallel_topo_order = DEFAULT_TOPO_ORDER
        _choice(self.hybrid_parallel_topo_order, ("pp_first", "sharding_first"), "hybrid_parallel_topo_order")
        # As PaddleNLP: an evaluation strategy implies do_eval, and do_eval alone implies evaluating by steps.
        if self.evaluation_strategy != IntervalStrategy.NO:
            self.do_eval = True
        elif self.do_eval:
            logger.warning("do_eval=True with evaluation_strategy='no': evaluating every eval_steps instead")
            self.evaluation_strategy = IntervalStrategy.STEPS
        if self.evaluation_strategy == IntervalStrategy.STEPS and not self.eval_steps:
            if self.logging_steps <= 0:
                raise ValueError("evaluation_strategy='steps' needs eval_steps > 0 (or logging_steps > 0 to copy)")
            self.eval_steps = self.logging_steps
        if self.logging_strategy == IntervalStrategy.STEPS and self.logging_steps <= 0:
            raise ValueError(f"logging_steps={self.logging_steps} is invalid with logging_strategy='steps': must be > 0")
        if self.save_strategy == IntervalStrategy.STEPS and self.save_steps <= 0:
            raise ValueError(f"save_steps={self.save_steps} is invalid with save_strategy='steps': must be > 0")
        if not 0.0 <= self.warmup_ratio <= 1.0:
            raise ValueError(f"warmup_ratio={self.warmup_ratio} is invalid: must lie in [0, 1]")
        if self.warmup_steps < 0:
            raise ValueError(f"warmup_steps={self.warmup_steps} is invalid: must be >= 0")
        if self.warmup_ratio > 0 and self.warmup_steps > 0:
            logger.info("both warmup_ratio and warmup_steps are set: warmup_steps wins")

    def _check_sizes(self) -> None:
        _positive(self.per_device_train_batch_size, "per_device_train_batch_size")
        _positive(self.per_device_eval_batch_size, "per_device_eval_batch_size")
        _positive(self.gradient_accumulation_steps, "gradient_accumulation_steps")
        _positive(self.eval_accumulation_steps, "eval_accumulation_steps", allow_none=True)
        _positive(self.collective_timeout_seconds, "collective_timeout_seconds", allow_none=True)
        _positive(self.peak_flops_per_device, "peak_flops_per_device", allow_none=True)
        arg_checks.check_sizes(self)  # upper bounds: what a tensor and a machine hold

    def _check_best_model(self) -> None:
        if self.load_best_model_at_end:
            if self.evaluation_strategy != self.save_strategy:
                raise ValueError(
                    f"load_best_model_at_end needs save_strategy to match evaluation_strategy, got "
                    f"save_strategy='{self.save_strategy}' and evaluation_strategy='{self.evaluation_strategy}'")
            if self.evaluation_strategy == IntervalStrategy.STEPS and self.save_steps % self.eval_steps:
                raise ValueError(
                    f"load_best_model_at_end needs save_steps to be a multiple of eval_steps, got save_steps="
                    f"{self.save_steps} and eval_steps={self.eval_steps}")
            if self.metric_for_best_model is None:
                self.metric_for_best_model = "loss"
        if self.greater_is_better is None and self.metric_for_best_model is not None:
            self.greater_is_better = self.metric_for_best_model not in ("loss", "eval_loss")

    def _check_precision(self) -> None:
        if self.fp16 and self.bf16:
            raise ValueError("fp16=True and bf16=True are exclusive: choose one mixed-precision dtype")
        if self.fp16_full_eval and self.bf16_full_eval:
            raise ValueError("fp16_full_eval=True and bf16_full_eval=True are exclusive: choose one")
        if self.amp_master_grad and not (self.fp16 or self.bf16):
            logger.warning("amp_master_grad=True needs fp16 or bf16: turning it off")
            self.amp_master_grad = False

    def _resolve_parallel(self) -> None:
        """The layout (PaddleNLP's arithmetic) and the typed :class:`ParallelConfig`, whose construction runs
        every layout check; what stays here is PaddleNLP's option handling around it."""
        self.sharding = parse_sharding(self.sharding)
        paddlenlp_options.apply_deprecated_sharding_degree(self)
        paddlenlp_options.refuse_unsupported_parallel(self, [a.option for a in option_axes()])
        if self.sharding_parallel_degree > 1 and not self.sharding:
            raise ValueError(
                f"sharding_parallel_degree={self.sharding_parallel_degree} has no effect without sharding: "
                f"set sharding to stage1, stage2 or stage3, or drop the degree")
        layout = resolve_layout(  # each axis's degree from the option its AXES entry names
            self._world_size, bool(self.sharding), {a.name: getattr(self, a.option) for a in option_axes()},
            self.hybrid_parallel_topo_order)
        layout = paddlenlp_options.with_expert_parallel(self, layout)  # Layout checks: ep divides the data ranks
        arg_checks.check_samples_per_step(self, layout.data_world_size)
        if self.sharding and layout.sharding == 1:
            self._drop_sharding_of_degree_one()
        paddlenlp_options.check_data_parallel_size(self.data_parallel_size, layout)
        self._parallel = parallel_config_of(self, layout)
        self._parallel_inputs = self._current_parallel_inputs()
        if self.amp_master_grad and layout.world_size > 1:
            raise ValueError(
                f"amp_master_grad=True is supported in one process only (world size {layout.world_size}): Paddle's "
                "master-grad hook replaces gradients behind the data/tensor/pipeline/sharding wrappers; use it "
                "without amp_master_grad (O2 keeps fp32 master weights either way)")
        if self.distributed_dataloader and layout.tp <= 1 and layout.pp <= 1:
            logger.warning("distributed_dataloader needs tensor or pipeline parallel: turning it off")
            self.distributed_dataloader = False
        if self.flatten_param_grads and self.device != "npu":
            raise ValueError(f"flatten_param_grads=True is only supported on npu, but device={self.device!r}")

    def _current_parallel_inputs(self) -> tuple:
        return tuple(tuple(v) if isinstance(v, list) else v for v in (getattr(self, f) for f in parallel_inputs()))

    def _parallel_config(self):
        """The parallel config, rebuilt (and re-checked) when a script changed one of its fields after parsing."""
        if self._current_parallel_inputs() != self._parallel_inputs:
            self._check_sizes()
            self._resolve_parallel()
        return self._parallel

    def _drop_sharding_of_degree_one(self) -> None:
        requested = " ".join(o.value for o in self.sharding)
        if self._world_size > 1 and self.sharding_parallel_degree == 1:
            raise ValueError(
                f"sharding='{requested}' contradicts sharding_parallel_degree=1 in a {self._world_size}-process run: "
                f"set sharding_parallel_degree > 1 (or -1), or drop sharding")
        if self._world_size > 1:
            logger.warning(
                "sharding='%s' dropped: tensor/pipeline parallel leave a sharding group of 1 in a %d-process run",
                requested, self._world_size)
        else:
            logger.info("sharding='%s' ignored in a single-process run", requested)
        self.sharding = []

    def _normalize_checkpoint_and_misc(self) -> None:
        # the stage of the config just built (not the view, which would compare every input again)
        self._unified_checkpoint_options = paddlenlp_options.parse_unified_checkpoint_options(self, self._parallel.sharding_stage)
        self.report_to = normalize_report_to(self.report_to)
        self.refined_recompute = paddlenlp_options.parse_refined_recompute(self.refined_recompute, self._parallel.layout.tp)

    def __str__(self) -> str:
        lines = [f"  parallel_degrees={self._parallel_config().layout}"]
        lines += [f"  {k}={v!r}" for k, v in sorted(self.to_dict().items())]
        return f"{type(self).__name__}(\n" + ",\n".join(lines) + "\n)"

    __repr__ = __str__

