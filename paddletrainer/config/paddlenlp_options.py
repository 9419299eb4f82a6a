"""PaddleNLP compatibility: which ``paddlenlp.trainer.TrainingArguments`` options paddletrainer refuses, accepts
with no effect or translates, and the checks that apply those tables. ``training_args`` keeps the fields and calls
these functions from ``TrainingArguments.__post_init__``; this module knows PaddleNLP's option names and nothing
imports ``training_args`` from here (the arguments object is passed in).

Where we differ from PaddleNLP on purpose (each is an error with one clear line instead of a silent change; the
layout rules — the first four items — are checked by ``parallel.config`` (``resolve_layout``, ``ParallelConfig``) and
``training_args``, the rest here):

* ``tensor_parallel_degree``/``pipeline_parallel_degree`` > 1 on a world they do not divide (including a single
  process) raise; PaddleNLP quietly drops them on one process, and the model would then be built for TP/PP.
* ``sharding_parallel_degree`` > 1 without ``sharding`` raises (PaddleNLP warns and builds an unused group).
* ``sharding`` with an *explicit* ``sharding_parallel_degree=1`` in a multi-process run raises (a contradiction).
  When the degree is *derived* (-1) and the world leaves room for 1 only, sharding is dropped with a warning,
  as PaddleNLP does, so configs written for a bigger cluster still run. On one process sharding is dropped.
* ``gradient_accumulation_steps`` below the pipeline degree raises (the pipeline could not be filled).
* expert tensor parallel (and sep together with context parallel), auto-parallel and ``to_static`` are
  parsed but refused when switched on.
* ``expert_parallel_degree`` / ``use_expert_parallel`` (``expert_parallel_degree_of``): PaddleNLP asserts dp == 1
  with ep > 1 (ep carved from the sharding ranks only); here the ep group is carved from all data ranks (dp and
  sharding), and both names given must agree.
* PaddleFormers 1.2's renamed parallel options are accepted as aliases (``PADDLEFORMERS_NAMES``:
  ``tensor_model_parallel_size``, ``pipeline_model_parallel_size``, ``sharding_parallel_size``,
  ``context_parallel_size``, ``expert_model_parallel_size``, ``expert_tensor_model_parallel_size``); two names of
  one degree that disagree are an error, ``data_parallel_size`` is checked against the resolved layout and
  ``virtual_pipeline_model_parallel_size`` is ``virtual_pp_degree``.
* Options whose PaddleNLP behaviour paddletrainer does not have are refused when set, never silently
  ignored: ``skip_data_intervals``, ``offload_optim``. ``metrics_output_path`` (as PaddleNLP): every rank appends
  its logs as JSON lines to ``<metrics_output_path>/metrics_rank<rank>.json``.
* The ``*_parallel_config`` names PaddleNLP accepts only in its static-graph auto-parallel mode
  (``INERT_PARALLEL_OPTIONS``: ``replace_with_parallel_cross_entropy``, ``enable_split_backward``, every
  ``data_parallel_config`` name ...) are accepted and a warning names each as without effect; any other name is
  an error naming the valid ones.
* ``use_async_save`` and ``unified_checkpoint_config=async_save`` (PaddleNLP's async checkpoints) switch on
  ``checkpoint_async_save``. ``fp16_full_eval``/``bf16_full_eval`` warn that they have no effect (PaddleNLP
  ignores them too).
* ``distributed_dataloader``: PaddleNLP reads data on tp/pp rank 0 and broadcasts it; here every rank reads
  its own share (the global order is layout-free and the token files are memory-mapped), so
  ``should_load_dataset`` is true on every rank and scripts that build datasets only where it is true work.
* Accepted without effect, because they tune machinery paddletrainer does not use or have no behaviour of
  their own: ``unified_checkpoint`` (a warning says so: our format is written, PaddleNLP's unified one is read
  whatever it says, ``paddletrainer-export-paddlenlp-unified`` converts ours), the ``unified_checkpoint_config``/
  ``save_sharded_model``/``load_sharded_model``/``force_reshard_pp`` family (every checkpoint is sharded and
  loads into any layout), ``release_grads``, ``ordered_save_group_size``,
  ``save_on_each_node``, ``lazy_data_processing``, ``past_index``, ``output_signal_dir``,
  ``pdc_download_*``, ``wandb_*``, ``sharding_comm_buffer_size_MB``, ``expert_*_capacity``, and the script-level ``do_train``/``do_eval``/
  ``do_predict``.
"""
import dataclasses
import logging
import re
from typing import Any, Dict, FrozenSet, List

from ..trainer_utils import ShardingOption

__all__ = [
    "DEGREE_OPTIONS",
    "INERT_PARALLEL_OPTIONS",
    "PADDLEFORMERS_NAMES",
    "PIPELINE_PARALLEL_OPTIONS",
    "REFINED_RECOMPUTE_OPS",
    "REFUSED_PARALLEL_OPTIONS",
    "SHARDING_PARALLEL_OPTIONS",
    "TENSOR_PARALLEL_OPTIONS",
    "UNIFIED_CHECKPOINT_OPTIONS",
    "apply_deprecated_sharding_degree",
    "apply_options_without_behaviour",
    "apply_paddleformers_names",
    "check_data_parallel_size",
    "expert_parallel_degree_of",
    "hybrid_parallel_options",
    "with_expert_parallel",
    "parse_parallel_config",
    "parse_refined_recompute",
    "parse_unified_checkpoint_options",
    "refuse_unproven_parallel_options",
    "refuse_unsupported_parallel",
    "warn_inert_parallel_options",
]

logger = logging.getLogger(__name__)

# Option names accepted in the *_parallel_config strings: PaddleNLP 3.0.0b4's lists for dynamic-graph hybrid
# parallel (its __post_init__ rejects anything else when the axis is active; we reject typos always).
PIPELINE_PARALLEL_OPTIONS = frozenset({
    "disable_p2p_cache_shape", "disable_partial_send_recv", "enable_delay_scale_loss", "enable_dp_comm_overlap",
    "enable_sharding_comm_overlap", "enable_timer", "enable_release_grads", "enable_clear_every_step_cache",
    "enable_overlap_p2p_comm", "disable_batch_p2p_comm", "best_unbalanced_scheduler", "use_dualpipev",
})
SHARDING_PARALLEL_OPTIONS = frozenset({
    "enable_stage1_tensor_fusion", "enable_stage1_overlap", "enable_stage2_overlap", "split_param",
    "disable_stage1_reduce_avg", "enable_stage1_broadcast_overlap", "enable_stage1_allgather_overlap",
    "enable_release_grads", "enable_fuse_optimizer_states",
})
TENSOR_PARALLEL_OPTIONS = frozenset({
    "enable_mp_async_allreduce", "enable_mp_skip_c_identity", "enable_mp_fused_linear_param_grad_add",
    "enable_sp_async_reduce_scatter", "enable_delay_scale_loss", "sync_param", "sync_grad", "sync_moment",
})
# Options of an *active* axis that paddletrainer refuses, with the reason. Every other name in the lists above
# reaches Paddle's strategy (parallel/topology.build_strategy) or the training loop; test_parallel_options
# checks both halves for every name. PaddleNLP ignores the options of an inactive axis, and so do we.
REFUSED_PARALLEL_OPTIONS = {
    "pipeline_parallel_config": {
        "enable_dp_comm_overlap": "its fused dp buffers all-reduce during backward, outside the gradient sync the "
                                  "global norm and overflow check run after; not proven here",
        "enable_sharding_comm_overlap": "it needs amp_master_grad under pipeline parallel (refused) and reduces "
                                        "sharding grads during backward; not proven here",
        "enable_release_grads": "it only acts on the comm-overlap buffers and the sharding optimizer's release "
                                "path, neither proven here",
        "enable_overlap_p2p_comm": "it needs the interleaved (virtual) pipeline schedule, which paddletrainer does "
                                   "not run",
        "best_unbalanced_scheduler": "it needs the interleaved (virtual) pipeline schedule",
        "use_dualpipev": "the DualPipeV schedule is not supported",
    },
    "sharding_parallel_config": {
        "enable_stage1_tensor_fusion": "the norm, clip and overflow check over fused comm buffers are not proven",
        "enable_stage1_overlap": "the norm, clip and overflow check over fused comm buffers are not proven",
        "enable_stage1_broadcast_overlap": "parameters would be broadcast during the next forward; not proven here",
        "enable_stage1_allgather_overlap": "split_param's parameters would be all-gathered during the next "
                                           "forward (pre-forward hooks); not proven here",
        "enable_stage2_overlap": "stage2 would reduce gradients during backward; not proven here",
        "enable_release_grads": "released gradient buffers are not proven with the gradient norm and clip",
        "enable_fuse_optimizer_states": "checkpoints read per-parameter optimizer states",
    },
    "tensor_parallel_config": {
        "enable_mp_async_allreduce": "async tp all-reduce needs CUDA kernels and is not proven",
        "enable_mp_skip_c_identity": "only valid together with enable_mp_async_allreduce (refused)",
        "enable_mp_fused_linear_param_grad_add": "fused CUDA gradient kernels that write main_grad; not proven",
        "enable_sp_async_reduce_scatter": "async sequence-parallel CUDA path; not proven",
        "enable_delay_scale_loss": "no tensor-parallel loop in Paddle 3.3.1 reads it (use the pipeline option)",
    },
}
# Names PaddleNLP 3.0.0b4 accepts only in its static-graph auto-parallel mode (``enable_auto_parallel``: its
# __post_init__ hands them to ``fleet.auto.Strategy``). They switch passes of that engine, which paddletrainer does
# not run; they are accepted so that PaddleNLP's configs load, and a warning names each one given as without effect.
INERT_PARALLEL_OPTIONS = {
    "tensor_parallel_config": {
        "replace_with_c_embedding": "a PIR auto-parallel rewrite of the column-split embedding",
        "replace_with_parallel_cross_entropy": "a PIR static-graph rewrite of the loss op (a model's own "
                                               "tensor_parallel_output decides the parallel loss here)",
    },
    "pipeline_parallel_config": {
        "enable_send_recv_overlap": "an auto-parallel pipeline pass",
        "enable_split_backward": "a static-graph auto-parallel VPP pass",
    },
    "sharding_parallel_config": {
        "enable_tensor_fusion": "the auto-parallel spelling of enable_stage1_tensor_fusion (refused here)",
        "enable_overlap": "the auto-parallel spelling of the stage1/stage2 overlap options (refused here)",
    },
    "data_parallel_config": {
        "enable_allreduce_avg_in_gradinent_scale": "the data-parallel gradient is already the mean over replicas",
        "gradient_sync_after_accumulate": "gradients are already synced once per step, after the last micro-batch",
    },
    "sequence_parallel_config": {
        "enable_allreduce_avg_in_gradinent_scale": "an auto-parallel gradient-scaling pass",
    },
}
UNIFIED_CHECKPOINT_OPTIONS = frozenset({
    "skip_save_model_weight", "master_weight_compatible", "remove_master_weight", "async_save",
    "enable_all_options", "ignore_merge_optimizer",
})
_ACTIVE_PARALLEL_OPTIONS = {
    "tensor_parallel_config": TENSOR_PARALLEL_OPTIONS, "pipeline_parallel_config": PIPELINE_PARALLEL_OPTIONS,
    "sharding_parallel_config": SHARDING_PARALLEL_OPTIONS, "data_parallel_config": frozenset(),
    "sequence_parallel_config": frozenset(),
}
REFINED_RECOMPUTE_OPS = ("mlp_row_ln", "attention_row_ln", "attention_column_ln", "mlp_column_ln", "flash_attn")
_TP_ONLY_RECOMPUTE_OPS = ("mlp_row_ln", "attention_row_ln", "attention_column_ln", "mlp_column_ln")

# PaddleNLP's degree options. Those with an axis in parallel.layout.AXES are read into the layout; the others are
# refused when > 1 (refuse_unsupported_parallel), so giving an axis its AXES entry is what lifts the refusal.
DEGREE_OPTIONS = ("sharding_parallel_degree", "tensor_parallel_degree", "pipeline_parallel_degree",
                  "sep_parallel_degree", "context_parallel_degree", "expert_parallel_degree",
                  "expert_tensor_parallel_degree")

# PaddleFormers 1.2 name -> the PaddleNLP TrainingArguments field it aliases.
PADDLEFORMERS_NAMES = {
    "tensor_model_parallel_size": "tensor_parallel_degree",
    "pipeline_model_parallel_size": "pipeline_parallel_degree",
    "sharding_parallel_size": "sharding_parallel_degree",
    "context_parallel_size": "context_parallel_degree",
    "expert_model_parallel_size": "expert_parallel_degree",
    "expert_tensor_model_parallel_size": "expert_tensor_parallel_degree",
}


def parse_parallel_config(text: Any, valid: FrozenSet[str], option: str) -> FrozenSet[str]:
    """Split a ``*_parallel_config`` string (space or comma separated) into a frozenset of known names."""
    if text is None:
        return frozenset()
    items = text if isinstance(text, (list, tuple, set, frozenset)) else re.split(r"[,\s]+", str(text))
    names = frozenset(str(x).strip() for x in items if str(x).strip())
    unknown = sorted(names - valid)
    if unknown:  # each name and their number cut short: the string can be any length
        shown = ", ".join(n if len(n) <= 40 else n[:37] + "..." for n in unknown[:8])
        more = f" (and {len(unknown) - 8} more)" if len(unknown) > 8 else ""
        raise ValueError(f"{option}: unknown option(s) {shown}{more}; valid: {', '.join(sorted(valid))}")
    return names


def hybrid_parallel_options(text: Any, option: str) -> FrozenSet[str]:
    """The names of ``option`` (a ``*_parallel_config`` field) that act here: its string checked against PaddleNLP's
    names (``*_PARALLEL_OPTIONS`` and the auto-parallel ones of ``INERT_PARALLEL_OPTIONS``), the inert ones left out."""
    inert = frozenset(INERT_PARALLEL_OPTIONS[option])
    return parse_parallel_config(text, _ACTIVE_PARALLEL_OPTIONS[option] | inert, option) - inert


def warn_inert_parallel_options(args) -> None:
    """Check every ``*_parallel_config`` string (``data_parallel_config`` and ``sequence_parallel_config`` have no
    name that acts here) and warn once for each ``INERT_PARALLEL_OPTIONS`` name given."""
    for option, reasons in INERT_PARALLEL_OPTIONS.items():
        given = parse_parallel_config(getattr(args, option), _ACTIVE_PARALLEL_OPTIONS[option] | set(reasons), option)
        for name in sorted(given & reasons.keys()):
            logger.warning("%s=%s has no effect in paddletrainer: %s", option, name, reasons[name])


def parse_sharding(value: Any) -> List[ShardingOption]:
    """``"stage2 offload"``, ``["stage2", "offload"]``, ``True`` (= stage1), ``False``/``""`` → ShardingOptions."""
    if isinstance(value, bool):
        value = "stage1" if value else ""
    items = re.split(r"[,\s]+", value.strip()) if isinstance(value, str) else list(value or [])
    options = []
    for item in (i for i in items if i != ""):
        try:
            options.append(ShardingOption(item.value if isinstance(item, ShardingOption) else item))
        except ValueError:
            valid = ", ".join(m.value for m in ShardingOption)
            raise ValueError(f"sharding={item!r} is not valid; choose one of: {valid}") from None
    stages = [o for o in options if o != ShardingOption.OFFLOAD]
    if options and not stages:
        raise ValueError("sharding='offload' needs a stage: use 'stage3 offload' (the only stage with offload "
                         "paddletrainer supports)")
    if len(stages) > 1:
        raise ValueError(f"sharding={value!r} names {len(stages)} stages; give exactly one of stage1, stage2, stage3")
    return options


def apply_paddleformers_names(args) -> None:
    """PaddleFormers 1.2 renamed the parallel options (``PADDLEFORMERS_NAMES``): copy a value given under the
    new name to the PaddleNLP field, refusing two names that disagree."""
    for new, old in PADDLEFORMERS_NAMES.items():
        value = getattr(args, new)
        if value is None:
            continue
        current = getattr(args, old)
        if current not in (-1, value) and not (current in (-1, 1) and value in (-1, 1)):
            raise ValueError(f"{new}={value} and {old}={current} disagree: they name the same degree; set one")
        setattr(args, old, value)


def check_data_parallel_size(dp, degrees) -> None:
    """PaddleFormers' ``data_parallel_size`` must match the resolved layout (``degrees``: ``ParallelDegrees``)."""
    if dp not in (None, -1) and dp != degrees.dp:
        d = degrees
        others = "".join(f" × {name} {n}" for name, n in d.degrees.items()
                         if name not in ("dp", "sharding", "tp", "pp") and n > 1)  # a later axis, when active
        raise ValueError(f"data_parallel_size={dp} does not match the layout: {d.world_size} processes / "
                         f"(tp {d.tp} × pp {d.pp} × sharding {d.sharding}{others}) leave data parallel {d.dp}")


def apply_options_without_behaviour(args) -> None:
    """PaddleNLP options paddletrainer cannot honour: an error when set, not a silent no-op; the ones that have no
    effect warn, and PaddleNLP's async-save spellings switch on ``checkpoint_async_save``."""
    warn_inert_parallel_options(args)
    unsupported = {
        "skip_data_intervals": (args.skip_data_intervals, "drop those samples from the dataset instead"),
        "offload_optim": (args.offload_optim, "sharding 'stage3 offload' keeps optimizer state in host memory"),
    }
    for option, (value, instead) in unsupported.items():
        if value not in (None, False, [], ""):
            raise ValueError(f"{option}={value!r} is not supported by paddletrainer: {instead}")
    for option in ("fp16_full_eval", "bf16_full_eval"):
        if getattr(args, option):  # PaddleNLP accepts and ignores them too
            logger.warning("%s=True has no effect: evaluation runs under the training autocast (--fp16/--bf16)",
                           option)
    async_in_unified = args.unified_checkpoint and "async_save" in str(args.unified_checkpoint_config or "")
    if (args.use_async_save or async_in_unified) and not args.checkpoint_async_save:
        source = "use_async_save" if args.use_async_save else "unified_checkpoint_config=async_save"
        logger.info("%s: writing checkpoints in the background (checkpoint_async_save)", source)
        args.checkpoint_async_save = True
    if args.distributed_dataloader:
        logger.warning("distributed_dataloader: every rank reads its own share of the data (memory-mapped); "
                       "should_load_dataset is true on every rank and nothing is broadcast")


def apply_deprecated_sharding_degree(args) -> None:
    """PaddleNLP's deprecated ``sharding_degree`` becomes ``sharding_parallel_degree`` (with a warning)."""
    if args.sharding_degree > 0:
        if args.sharding_parallel_degree > 0 and args.sharding_parallel_degree != args.sharding_degree:
            raise ValueError(
                f"sharding_degree={args.sharding_degree} (deprecated alias) contradicts sharding_parallel_degree="
                f"{args.sharding_parallel_degree}; set only sharding_parallel_degree")
        logger.warning("sharding_degree is deprecated: use sharding_parallel_degree")
        args.sharding_parallel_degree = args.sharding_degree
        args.sharding_degree = -1  # consumed, so that to_dict → from_dict does not warn again


def refuse_unsupported_parallel(args, axis_options) -> None:
    """A ``DEGREE_OPTIONS`` degree > 1 that is not among ``axis_options`` (the options of the layout's axes,
    ``parallel.layout.option_axes``, nor expert parallel: today expert tensor parallel), auto-parallel and
    ``to_static`` are parsed but refused when switched on."""
    if args.sep_parallel_degree > 1 and args.context_parallel_degree > 1:  # PaddleNLP asserts it too
        raise ValueError(f"sep_parallel_degree={args.sep_parallel_degree} and context_parallel_degree="
                         f"{args.context_parallel_degree} cannot both be > 1 (both run on fleet's sep axis): pick one")
    # expert parallel is carved from the data ranks (Layout.ep, with_expert_parallel), not an axis of the grid
    for option in (o for o in DEGREE_OPTIONS if o not in set(axis_options) | {"expert_parallel_degree"}):
        if getattr(args, option) > 1:
            raise ValueError(f"{option}={getattr(args, option)} is not supported by paddletrainer: use -1 or 1")
    for option in ("enable_auto_parallel", "to_static"):
        if option == "enable_auto_parallel" and getattr(type(args), "auto_parallel_on_our_layout", False):
            continue  # auto_training_args.AutoTrainingArguments: the degrees build our layout
        if getattr(args, option):
            raise ValueError(f"{option}=True is not supported by paddletrainer: use False")


def with_expert_parallel(args, layout):
    """``layout`` with its expert-parallel degree (:func:`expert_parallel_degree_of`) set."""
    ep = expert_parallel_degree_of(args, layout.dp)
    return dataclasses.replace(layout, ep=ep) if ep > 1 else layout


def expert_parallel_degree_of(args, dp: int) -> int:
    """The expert-parallel degree from PaddleNLP's two names: ``expert_parallel_degree`` (> 1: that many data
    ranks split the experts) and ``use_expert_parallel`` (the experts split over the data-parallel group, as PaddleNLP's
    ``MoELayer`` does there: the degree is ``dp``; the model's experts must be marked ``is_expert``, as
    :class:`paddletrainer.moe.MoELayer`'s are). Both given must agree. Unlike PaddleNLP 3.0.0b4, which asserts
    dp == 1 and carves ep from the sharding ranks only, the ep group may span dp and sharding ranks."""
    degree = args.expert_parallel_degree
    if isinstance(degree, bool) or not isinstance(degree, int) or degree == 0 or degree < -1:
        raise ValueError(f"expert_parallel_degree={degree!r} is invalid: use -1 (unset) or a positive integer")
    if not args.use_expert_parallel:
        return max(degree, 1)
    if degree > 1 and degree != dp:
        raise ValueError(f"use_expert_parallel=True splits the experts over the data-parallel group (dp={dp}) but "
                         f"expert_parallel_degree={degree}: set only one of them")
    return max(dp, 1)


def refuse_unproven_parallel_options(degrees, pipeline: FrozenSet[str], sharding: FrozenSet[str],
                                     tensor: FrozenSet[str]) -> None:
    """Raise for a ``REFUSED_PARALLEL_OPTIONS`` name given for an active axis (inactive axes' options are ignored,
    as PaddleNLP does)."""
    d = degrees
    given = {
        "pipeline_parallel_config": pipeline if d.pp > 1 else frozenset(),
        "sharding_parallel_config": sharding if d.sharding > 1 else frozenset(),
        "tensor_parallel_config": tensor if d.tp > 1 else frozenset(),
    }
    for config, options in given.items():
        for option in sorted(options & REFUSED_PARALLEL_OPTIONS[config].keys()):
            raise ValueError(f"{config}={option} is not supported by paddletrainer: "
                             f"{REFUSED_PARALLEL_OPTIONS[config][option]}")


UNIFIED_CHECKPOINT_WRITES = (
    "unified_checkpoint=True: paddletrainer writes its own checkpoint format, which already loads into any layout; "
    "it does not write PaddleNLP's unified files, so PaddleNLP's Trainer cannot resume these checkpoints as they "
    "are: convert one with `paddletrainer-export-paddlenlp-unified <checkpoint-N> <new dir>`. A PaddleNLP "
    "unified checkpoint named as resume_from_checkpoint is read whatever this option says")


def parse_unified_checkpoint_options(args, sharding_stage: int) -> FrozenSet[str]:
    """``unified_checkpoint_config`` (accepted without effect: every checkpoint is sharded) as a checked set;
    ``unified_checkpoint`` is turned off under sharding stage3, as PaddleNLP does. ``unified_checkpoint`` changes
    nothing we write or read: a warning says so and how to get a PaddleNLP-resumable directory."""
    if args.unified_checkpoint and sharding_stage == 3:
        logger.warning("unified_checkpoint does not support sharding stage3: turning it off")
        args.unified_checkpoint = False
    options = parse_parallel_config(
        args.unified_checkpoint_config if args.unified_checkpoint else "", UNIFIED_CHECKPOINT_OPTIONS,
        "unified_checkpoint_config")
    if {"skip_save_model_weight", "ignore_merge_optimizer"} <= options:
        raise ValueError("unified_checkpoint_config: skip_save_model_weight and ignore_merge_optimizer are exclusive")
    if args.unified_checkpoint:
        logger.warning(UNIFIED_CHECKPOINT_WRITES)
    return options


def parse_refined_recompute(value: Any, tp_degree: int) -> Dict[str, int]:
    """``"flash_attn:-1,mlp_row_ln:5"`` → ``{"flash_attn": -1, "mlp_row_ln": 5, ...}`` as PaddleNLP: every op
    gets a count (0 = recompute), the TP-only ops are ignored without TP, and all-zero means ``{}``."""
    if value in (None, "", {}):
        return {}
    if isinstance(value, dict):
        pairs = list(value.items())
    else:
        pairs = []
        for item in str(value).split(","):
            name, sep, count = item.strip().partition(":")
            if not sep or not re.fullmatch(r"-?\d+", count.strip()):
                raise ValueError(f"refined_recompute: {item.strip()!r} is not 'op:count' (e.g. 'flash_attn:-1')")
            pairs.append((name.strip(), int(count)))
    result = dict.fromkeys(REFINED_RECOMPUTE_OPS, 0)
    for name, count in pairs:
        if name not in result:
            raise ValueError(f"refined_recompute: unknown op {name!r}; valid: {', '.join(REFINED_RECOMPUTE_OPS)}")
        if name in _TP_ONLY_RECOMPUTE_OPS and tp_degree <= 1:
            logger.warning("refined_recompute: %s only applies with tensor parallel; ignored", name)
            continue
        result[name] = int(count)
    return result if any(result.values()) else {}
