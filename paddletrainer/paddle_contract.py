"""Everything paddletrainer relies on inside Paddle and PaddleNLP that is not their public API, in one place.

A Paddle upgrade starts here. :data:`SYMBOLS` lists every third-party symbol the library patches, subclasses
(overriding private methods), reads or writes privately: the symbol, the kind of reliance, the file that relies
on it (the file to edit when it changes), how a change is caught and whether it is relied on on every device or
only on the CPU-only build. :func:`check` runs every guard and returns one line per broken fact, each starting
with that file; :func:`paddletrainer.parallel.topology.init_topology` runs it once per process and a unit test
runs it on the pinned Paddle.

The guards, by kind:

* ``predicate``: the CPU fills' ``assumptions()`` (``parallel/cpu/*``, words from ``parallel/cpu/paddle_checks``),
  facts next to the code that relies on them;
* ``digest``: the sha256 of the normalised source of the Paddle functions the stage-2/3 subclasses in
  ``parallel/sharding.py`` replace or rely on (:data:`STAGE2_SOURCES`, :data:`STAGE3_SOURCES`), recorded on
  :data:`DIGESTED_ON`, the one version ``runtime.paddle_requirement.TESTED`` admits;
* ``accessor``: the optional private attributes read through this module's accessors (below); :func:`check`
  asserts that Paddle's class still sets each one, and an accessor raises :class:`PaddleContractError` naming
  the Paddle version if the attribute is gone, never a silent default;
* ``tests``: private names read directly (``obj._name``: an ``AttributeError`` if renamed, never a default) whose
  behaviour the unit and launch tests compare with Paddle's own results.
"""
from __future__ import annotations

import hashlib
import importlib
import inspect
import io
import linecache
import re
import sys
import textwrap
import tokenize
from typing import NamedTuple, Tuple

import paddle
from paddle.distributed.fleet.fleet import Fleet
from paddle.distributed.fleet.meta_optimizers.dygraph_optimizer.dygraph_sharding_optimizer import (
    DygraphShardingOptimizer,
)
from paddle.distributed.fleet.meta_parallel.meta_parallel_base import MetaParallelBase
from paddle.distributed.fleet.meta_parallel.parallel_layers.pp_layers import PipelineLayer
from paddle.distributed.fleet.meta_parallel.pipeline_parallel import PipelineParallel
from paddle.distributed.fleet.meta_parallel.sharding.group_sharded_stage2 import GroupShardedStage2
from paddle.distributed.fleet.meta_parallel.sharding.group_sharded_stage3 import GroupShardedStage3
from paddle.io.dataloader import dataloader_iter
from paddle.nn.initializer.uniform import UniformInitializer

from .parallel import cpu as cpu_fills
from .parallel import packed_attention
from .parallel.cpu.paddle_checks import paddle_source
from .runtime.paddle_requirement import PADDLE_PIN

__all__ = ["SYMBOLS", "Symbol", "check", "digest_problems", "PaddleContractError", "DIGESTED_ON",
           "STAGE2_SOURCES", "STAGE3_SOURCES", "PATCH", "OVERRIDE", "READ", "WRITE", "PREDICATE", "DIGEST",
           "ACCESSOR", "TESTS", "delays_loss_scaling", "optimizer_grad_clip", "optimizer_param_groups",
           "optimizer_default_dict", "optimizer_master_weights", "optimizer_accumulators", "creates_accumulators",
           "fleet_hybrid_group", "wrapped_layer", "stage1_owner_ranks", "pipeline_inputs_hook", "pipeline_stages",
           "lazy_init_func", "diagonal_uniform", "loader_reader_state", "auto_sharded"]

# kinds of reliance
PATCH = "patch"  # a Paddle/PaddleNLP module or class attribute replaced
OVERRIDE = "override"  # a private method overridden in a subclass
READ = "read"  # private attributes read (or private functions called)
WRITE = "write"  # private attributes of Paddle objects written
# guards
PREDICATE, DIGEST, ACCESSOR, TESTS = "predicate", "digest", "accessor", "tests"
CPU, EVERY = "cpu build", "every device"


class Symbol(NamedTuple):
    """One reliance: ``owner`` (the file to edit) relies, as ``kind``, on ``names`` of the Paddle/PaddleNLP
    ``symbol``, caught by ``guard``, on ``devices`` (``CPU``: installed or read only on the CPU-only build)."""

    symbol: str
    names: Tuple[str, ...]
    kind: str
    owner: str
    guard: str
    devices: str


_P = "paddletrainer/"
_FLEET = "paddle.distributed.fleet."
_STAGE2_OPT = _FLEET + "meta_parallel.sharding.group_sharded_optimizer_stage2.GroupShardedOptimizerStage2"
_STAGE3 = _FLEET + "meta_parallel.sharding.group_sharded_stage3"
_V2 = _FLEET + "meta_optimizers.dygraph_optimizer.dygraph_sharding_optimizer.DygraphShardingOptimizerV2"
_OPT = "paddle.optimizer.Optimizer"

SYMBOLS: Tuple[Symbol, ...] = (
    # the CPU fills (parallel/cpu/): Paddle functions replaced on the CPU-only build, each fill's assumptions()
    Symbol("paddle.distributed.collective", ("_new_process_group_impl", "new_group", "_default_store"), PATCH,
           _P + "parallel/cpu/group_stores.py", PREDICATE, CPU),
    Symbol("paddle.distributed.new_group, group_sharded_optimizer_stage2.new_group", ("new_group",), PATCH,
           _P + "parallel/cpu/group_stores.py", PREDICATE, CPU),
    Symbol(_FLEET + "layers.mpu.mp_ops, paddle.distributed.collective",
           ("_c_identity", "_c_split", "_c_concat", "_mp_allreduce", "_c_softmax_with_cross_entropy"), PATCH,
           _P + "parallel/cpu/tp_ops.py", PREDICATE, CPU),
    Symbol(_FLEET + "utils.hybrid_parallel_util, meta_parallel.tensor_parallel", ("broadcast_input_data",), PATCH,
           _P + "parallel/cpu/tp_ops.py", PREDICATE, CPU),
    Symbol("paddle.distributed.collective", ("_get_default_group",), READ, _P + "parallel/cpu/tp_ops.py", PREDICATE,
           CPU),
    Symbol(_FLEET + "meta_parallel.pp_utils.p2p_communication",
           ("_send_on_calc_stream", "_recv_on_calc_stream", "send_meta", "recv_meta"), PATCH,
           _P + "parallel/cpu/pipeline_p2p.py", PREDICATE, CPU),
    Symbol("paddle.distributed.ParallelEnv, the hcg", ("_device_id", "_get_p2p_next_rank", "_get_p2p_prev_rank"),
           PATCH, _P + "parallel/cpu/pipeline_p2p.py", PREDICATE, CPU),
    Symbol(_FLEET + "meta_parallel.pp_utils.p2p_communication, pipeline_parallel",
           ("_batched_p2p_ops", "_check_sanity", "_p2p_helper", "_get_p2p_next_rank", "_get_p2p_prev_rank",
            "send_forward_recv_forward", "send_forward_backward_recv_forward_backward"), PATCH,
           _P + "parallel/cpu/interleave.py", PREDICATE, CPU),
    Symbol("paddle.distributed.reduce_scatter, communication.reduce_scatter, the stream reduce_scatter",
           ("reduce_scatter", "_reduce_scatter_tensor_in_dygraph", "_reduce_scatter_in_dygraph"), PATCH,
           _P + "parallel/cpu/reduce_scatter.py", PREDICATE, CPU),
    Symbol("paddle.base.core, paddle.get_device, group_sharded_storage.ParamStorage",
           ("is_compiled_with_cuda", "get_device", "add_rank_params", "_redefine_opt_step"), PATCH,
           _P + "parallel/cpu/sharding_construction.py", PREDICATE, CPU),
    Symbol(_STAGE3, ("_device2cpu", "_cpu2device", "_clear_gradients", "_clear_data", "_share_buffer_to"), PATCH,
           _P + "parallel/cpu/stage3_offload.py", PREDICATE, CPU),
    Symbol("paddle.distributed.communication.stream.all_to_all, moe_layer",
           ("_all_to_all_tensor_in_dygraph", "_all_to_all_in_dygraph", "_alltoall_single_in_dygraph", "_AllToAll"),
           PATCH, _P + "parallel/cpu/all_to_all.py", PREDICATE, CPU),
    Symbol("paddlenlp.transformers.segment_parallel_utils", ("_reshard_qkv",), PATCH,
           _P + "parallel/cpu/all_to_all.py", PREDICATE, EVERY),  # PaddleNLP's bug, not the build's
    Symbol("paddle.distributed.collective", ("_get_global_group",), READ, _P + "parallel/cpu/blocking.py", TESTS, CPU),
    # patches outside the fills
    Symbol("paddle.nn.initializer.Initializer", ("_lazy_init",), PATCH, _P + "parallel/lazy_init.py", TESTS, EVERY),
    Symbol("paddlenlp.transformers.llama.fusion_ops", ("RingFlashAttention",), PATCH, _P + "parallel/context.py",
           TESTS, CPU),
    # per model, off a CUDA device: each Llama/Qwen2 attention layer's attn_func wrapped for packed rows' masks
    Symbol("paddlenlp.transformers.llama.modeling.LlamaAttention, qwen2.modeling.Qwen2Attention (instances)",
           ("attn_func",), PATCH, _P + "parallel/packed_attention.py", PREDICATE, CPU),
    # ... and, under sep, their forward hooked to note whole position_ids; the rope table and function read
    Symbol("paddlenlp.transformers.llama.modeling.LlamaAttention (instances), llama.modeling.rotate_half",
           ("reshard_layer", "rotary_emb", "config", "rotate_half"), READ, _P + "parallel/packed_attention.py",
           PREDICATE, CPU),
    Symbol("paddle.amp.grad_scaler", ("_dygraph_tracer",), PATCH, _P + "optim/amp.py", TESTS, CPU),
    Symbol("paddle.amp.GradScaler", ("_cache_found_inf",), WRITE, _P + "optim/overflow.py", TESTS, EVERY),
    # stage 2/3: subclasses overriding Paddle's private methods, on every device, guarded by the source digests
    Symbol(_STAGE2_OPT, ("_segment_params", "_update_task", "_GroupShardedOptimizerStage2__segment_params",
                         "_local_params", "_comm_task", "_reduce_overlap"), OVERRIDE,
           _P + "parallel/sharding.py", DIGEST, EVERY),
    Symbol(_STAGE3 + ".GroupShardedStage3", ("_sync_params_and_buffers", "_param_storage", "_get_allreduce_fn",
                                             "_offload", "_task_flow", "_param2buffer", "_dp_group",
                                             "_global_root_rank", "_world_size_scaling", "_device2cpu", "_group",
                                             "_rank", "_param2buffer_size"), OVERRIDE,
           _P + "parallel/sharding.py", DIGEST, EVERY),
    Symbol(_STAGE3, ("_create_params_grad",), PATCH, _P + "parallel/sharding.py", DIGEST, EVERY),
    Symbol(_STAGE3 + ".ForwardPostHooks", ("backward",), READ, _P + "parallel/sharding.py", DIGEST, EVERY),
    Symbol(_FLEET + "meta_parallel.sharding.group_sharded_stage2.GroupShardedStage2",
           ("_layer", "_grad_reduced", "_trainable_params", "_clear_counters"), WRITE, _P + "parallel/sharding.py",
           DIGEST, EVERY),
    Symbol(_V2 + " and its comm buffers", ("_comm_buffer_list", "_sharding_param_grad_view", "_slice_params",
                                            "_slice_grad", "_param_begin", "_param_end", "_index",
                                            "_assign_slice_grad", "_parameter_list", "_numel"), READ,
           _P + "parallel/sharding.py", TESTS, EVERY),
    # the optimizer interface over Paddle's wrappers
    Symbol(_FLEET + "HybridParallelOptimizer", ("_inner_opt", "_hybrid_sync_grad", "_step"), READ,
           _P + "parallel/hybrid.py", TESTS, EVERY),
    Symbol(_FLEET + "meta_optimizers.dygraph_optimizer.dygraph_sharding_optimizer.DygraphShardingOptimizer",
           ("_param2rank",), READ, _P + "parallel/hybrid.py", ACCESSOR, EVERY),
    Symbol(_FLEET + "meta_parallel.sharding: GroupShardedStage2/3 and their optimizers",
           ("_grad_scale", "_dp_allreduce", "_update_params_slice", "_param2rank", "_unslice_params",
            "_param_groups"), READ, _P + "parallel/sharding.py", TESTS, EVERY),
    Symbol(_OPT, ("_parameter_list",), READ, _P + "parallel/data_parallel.py", TESTS, EVERY),
    Symbol(_OPT, ("_grad_clip", "_param_groups", "_default_dict", "_parameter_list"), WRITE,
           _P + "parallel/clipping.py", ACCESSOR, EVERY),
    Symbol(_OPT, ("_grad_clip", "_param_groups"), READ, _P + "parallel/apply.py", ACCESSOR, EVERY),
    Symbol(_OPT, ("_param_groups",), READ, _P + "checks.py", ACCESSOR, EVERY),
    Symbol(_OPT + " (what the experts' separate step runs)", ("_apply_optimize", "_parameter_list"), WRITE,
           _P + "parallel/expert.py", TESTS, EVERY),
    Symbol("paddle.Tensor", ("_copy_gradient_from",), READ, _P + "parallel/expert.py", TESTS, EVERY),
    Symbol("paddle.Tensor (gradient buffers)", ("_slice", "_set_dims", "_copy_gradient_from",
                                                "_register_backward_hook"), READ,
           _P + "parallel/data_parallel.py", TESTS, EVERY),
    Symbol("paddle.Tensor", ("_register_backward_hook",), READ, _P + "parallel/sequence.py", TESTS, EVERY),
    Symbol("paddle.Tensor", ("_slice",), READ, _P + "parallel/cpu/reduce_scatter.py", TESTS, CPU),
    Symbol("paddle.distributed.collective", ("_get_default_group",), READ, _P + "parallel/collectives.py", TESTS,
           EVERY),
    Symbol("paddle.distributed.collective", ("_get_default_group",), READ, _P + "parallel/topology.py", TESTS,
           EVERY),
    Symbol(_FLEET + "meta_parallel.PipelineParallel",
           ("_layers", "_loss_fn", "_broadcast_final_loss", "_p2p_helper", "_prepare_pipeline_inputs_func"), READ,
           _P + "parallel/pipeline.py", TESTS, EVERY),
    Symbol("paddle.DataParallel, fleet's meta-parallel wrappers and optimizers, GroupShardedStage2/3",
           ("_layers", "_layer", "_inner_opt", "_optim"),
           READ, _P + "parallel/wrappers.py", ACCESSOR, EVERY),
    Symbol("paddle.base.framework.EagerParamBase, paddle.nn.initializer",
           ("_init_func", "_is_initialized", "_numel", "_clear_data", "_compute_fans", "_param2align"),
           READ, _P + "parallel/lazy_init.py", TESTS, EVERY),
    Symbol("paddle.base.framework.EagerParamBase, paddle.nn.initializer.UniformInitializer",
           ("_init_func", "_diag_num"), READ, _P + "parallel/lazy_init.py", ACCESSOR, EVERY),
    Symbol(_FLEET + "fleet.Fleet", ("_hcg",), READ, _P + "parallel/broadcast.py", ACCESSOR, EVERY),
    Symbol(_FLEET + "fleet.Fleet", ("_hcg",), READ, _P + "runtime/seeding.py", ACCESSOR, EVERY),
    Symbol(_FLEET + "meta_parallel.PipelineLayer", ("_num_stages",), READ, _P + "checks.py", ACCESSOR, EVERY),
    Symbol(_FLEET + "meta_parallel.PipelineLayer", ("_loss_fn", "_prepare_pipeline_inputs_func"), WRITE,
           _P + "trl/dpo_pipeline.py", TESTS, EVERY),
    Symbol("paddle.base.framework.EagerParamBase (auto parallel's mark)", ("_need_shard_auto",), READ,
           _P + "optim/adamw.py", ACCESSOR, EVERY),
    Symbol(_FLEET + "meta_parallel.PipelineParallel", ("_delay_scale_loss",), READ, _P + "optim/overflow.py",
           ACCESSOR, EVERY),
    # optimizer state and the faster AdamW step (its results are compared with Paddle's AdamW by the tests)
    Symbol(_OPT, ("_accumulators", "_master_weights", "_create_accumulators", "_parameter_list", "_is_initialized"),
           READ, _P + "checkpoint/local_state.py", ACCESSOR, EVERY),
    Symbol("paddle.optimizer.AdamW", ("_accumulators", "_already_create_accumulator", "_amsgrad",
                                      "_apply_decay_param_fun", "_beta1", "_beta2", "_beta1_pow_acc_str",
                                      "_beta2_pow_acc_str", "_moment1_acc_str", "_moment2_acc_str",
                                      "_create_accumulators", "_create_global_learning_rate", "_epsilon",
                                      "_get_auxiliary_var", "_global_learning_rate", "_grad_clip", "_grad_ivar",
                                      "_is_dtype_fp16_or_bf16", "_is_initialized", "_lazy_mode", "_learning_rate",
                                      "_lr_ratio", "_multi_precision", "_name", "_param_groups",
                                      "_parameter_list", "_set_warmup", "_use_fusion_storage", "_weight_decay"),
           READ, _P + "optim/adamw.py", TESTS, EVERY),
    Symbol("paddle.Tensor", ("_copy_to",), READ, _P + "checkpoint/snapshot.py", TESTS, EVERY),
    Symbol("paddle.io.dataloader.dataloader_iter._DataLoaderIter*",
           ("_shutdown", "_workers", "_thread", "_thread_done_event", "_blocking_queue", "_try_shutdown_all"), READ,
           _P + "data/loader.py", ACCESSOR, EVERY),
    Symbol("paddle.io.DistributedBatchSampler", ("_acc_steps",), READ, _P + "data/sampling.py", TESTS, EVERY),
    Symbol("paddle.Tensor", ("_is_initialized",), READ, _P + "runtime/replica_check.py", TESTS, EVERY),
    Symbol("paddle.Tensor", ("_is_initialized",), READ, _P + "tools/gpu_smoke.py", TESTS, EVERY),
    Symbol("paddlenlp.peft.LoRAModel", ("_convert_tensor_parallel",), READ, _P + "checkpoint/paddlenlp_interop.py",
           TESTS, EVERY),
    Symbol("PaddleNLP's argument dataclasses (optional)", ("_argument_group_name",), READ, _P + "argparser.py",
           TESTS, EVERY),
)

_GSO2 = (_FLEET + "meta_parallel.sharding.group_sharded_optimizer_stage2", "GroupShardedOptimizerStage2")
_GS2 = (_FLEET + "meta_parallel.sharding.group_sharded_stage2", "GroupShardedStage2")
_GS3 = (_STAGE3, "GroupShardedStage3")
_GS3_MODULE = (_STAGE3, "group_sharded_stage3")

# The Paddle functions parallel/sharding.py's _ReduceScatterStage3 reproduces or relies on, each with the sha256 of
# its normalised source (_normalised_source) on DIGESTED_ON, and what to re-check there when a Paddle version
# changes it. Any difference fails, even one that looks harmless: a step added to Paddle's hook (a found_inf check,
# async communication, another scaling) would otherwise be skipped by ours without a word.

DIGESTED_ON = PADDLE_PIN  # the Paddle version the source digests were recorded on

STAGE3_SOURCES = (
    (_GS3, "_get_allreduce_fn",
     "ad900188d41b4fbce7f8ac8411e4c1155da71b94641535aaccf88120dd2c4a68",
     "that every step of its gradient branch is in _reduce_scatter_into_slice (1/N scale, dp scale and all-reduce, "
     "bw_storage accumulation with and without offload, main_grad/grad release) and that it still skips a "
     "gradient no longer in task_flow.full_grad"),
    (_GS3, "_flatten_layer_params",
     "7bca3ee7f3173b9c7a12d5f10934329053add20f16483960cbe6f8085f61ec74",
     "that each sliced buffer is still padded to a multiple of the group size and _param2buffer still holds "
     "equal per-rank slices (what makes the reduce-scatter legal)"),
    (_GS3, "_register_backward_hooks",
     "0e7bf60c05aec4095d3a0d4d03b0bc93151fbd3214ac96ae67f7fa66b37e621f",
     "that the backward hook of every sliced parameter is still built by self._get_allreduce_fn, once"),
    ((_STAGE3, "ForwardPostHooks"), "backward",
     "dada0d1280a28d07114acd8f209215657d009a5091ead647c8de2c4f4d5b756a",
     "that it still creates the layer's gradient buffers through the module's _create_params_grad, looked up at "
     "call time, after gathering the layer's parameters (what _create_params_grad_where_padded replaces)"),
    (_GS3_MODULE, "_create_params_grad",
     "549139a61f7eabf7f32bbf07f85e11b97c1d0f2b9248238aab739236d9e509e1",
     "that full_grad still holds the padded gradient buffer, fp32 when the parameter has main_grad"),
    (_GS3, "_sync_params_and_buffers",
     "e537fbb4a5f710df2b5d800bbfd9a3af149d3c70ea4dd99da8407980af4fdab4",
     "that it still only broadcasts every parameter over the group, then dp (the lazy override skips the "
     "sliced lazy ones)"),
    (_GS3, "_param_storage",
     "474094b3aac2cd1abbdede5ba265ecb77c91500ff5fe73724c79d6f314fe788c",
     "that for an fp32 parameter without offload it still only sets fw_storage ('slice@' name) to the rank's "
     "range and status 'part', then clears the parameter (what the lazy override does)"),
)

# The Paddle stage-2 code parallel/sharding.py's _BalancedStage2Optimizer replaces or relies on, as STAGE3_SOURCES.
STAGE2_SOURCES = (
    (_GSO2, "_segment_params",
     "66a74117f9945de05b941c078d7577257bd5bbbc6cf748ae08f945b5fa5bb953",
     "that it still only assigns whole parameters to ranks (one list per rank, each parameter once), cached in "
     "self.__segment_params, and balanced_partition still does what it does"),
    (_GSO2, "param2rank",
     "b1af2971712324b042b4fbddd42f2b048d8ce858fb3dc5e27da981c1a67368a3",
     "that the owner of each parameter is still read from self._segment_params()"),
    (_GSO2, "dtype_rank_params",
     "06385806b660da6cb36ef4891f3132974a6b722ea7b202ddf397052c128a8a2f",
     "that the per-rank parameter lists are still built from param2rank"),
    (_GSO2, "_clear_cache",
     "ec3b8c580f0e1917d07e33fed63166cd1e0b25e770ce73b74a4a123088897e1f",
     "that it still empties self.__segment_params, the cache _BalancedStage2Optimizer._segment_params fills"),
    (_GS2, "_fresh_trainable",
     "91f0e535e9097dfff006abb0239ee0e3206ba98aec481eb9131f44d59fa9d15d",
     "that the gradient storages still take each parameter's rank from the optimizer's param2rank"),
    (_GSO2, "_update_task",
     "d2954e9e969bdeb1cfb5f0c3a229efbcf0fd1ae2f73a3754e0d8311b910f3be4",
     "that it still only keeps the last reduce task in self._comm_task (which _update_task drops without overlap)"),
    (_GS2, "_get_reduce_fn",
     "eabc28c91f9964b6ee2394ba2ba56f6b4a151a4758d75d97a98616ab4f586146",
     "that every reduce is still synchronous unless self._reduce_overlap and its task goes to _update_task"),
    (_GS2, "_redefine_opt_step",
     "f5d96d64ff903080af1466a1c1adb49cd9d646ec421fc2a7f6cb9a99e323aff0",
     "that the step still reads _comm_task only under reduce_overlap (without it _update_task keeps none)"),
)


class PaddleContractError(RuntimeError):
    """A private Paddle attribute paddletrainer reads is gone: the installed Paddle is not the one it was checked
    against."""


def _gone(obj, name: str, owner: str) -> PaddleContractError:
    return PaddleContractError(
        f"{owner}: {type(obj).__name__}.{name} is gone in Paddle {paddle.__version__} (paddletrainer was checked "
        f"against Paddle {DIGESTED_ON}; paddletrainer/paddle_contract.py lists what it relies on)")


def _read(obj, name: str, owner: str):
    """``obj.<name>``, which Paddle's class sets: a :class:`PaddleContractError` naming ``owner`` if it does not."""
    try:
        return getattr(obj, name)  # a Layer's sublayers and parameters are attributes too
    except AttributeError:
        raise _gone(obj, name, owner) from None


# ---- accessors: private attributes that only some objects carry; the isinstance test decides, not a default

def delays_loss_scaling(model) -> bool:
    """True for a ``PipelineParallel`` built with ``enable_delay_scale_loss`` (optim/overflow.py)."""
    return isinstance(model, PipelineParallel) and bool(_read(model, "_delay_scale_loss", "paddletrainer/optim/overflow.py"))


def _is_paddle_optimizer(optimizer) -> bool:
    return isinstance(optimizer, paddle.optimizer.Optimizer)


def optimizer_grad_clip(optimizer, owner: str):
    """A Paddle optimizer's own ``grad_clip`` (None for an object that is not a Paddle optimizer)."""
    return _read(optimizer, "_grad_clip", owner) if _is_paddle_optimizer(optimizer) else None


def optimizer_param_groups(optimizer, owner: str) -> list:
    """A Paddle optimizer's parameter groups (dicts when built with groups), [] for anything else."""
    return (_read(optimizer, "_param_groups", owner) or []) if _is_paddle_optimizer(optimizer) else []


def optimizer_default_dict(optimizer, owner: str):
    """The defaults a Paddle optimizer gives groups added later, or None for anything else."""
    return _read(optimizer, "_default_dict", owner) if _is_paddle_optimizer(optimizer) else None


def optimizer_master_weights(optimizer, owner: str) -> dict:
    """A Paddle optimizer's fp32 master weights by parameter name ({} for anything else)."""
    return dict(_read(optimizer, "_master_weights", owner) or {}) if _is_paddle_optimizer(optimizer) else {}


def optimizer_accumulators(optimizer, owner: str) -> dict:
    """A Paddle optimizer's accumulators, ``{kind: {parameter name: tensor}}`` ({} for anything else)."""
    return (_read(optimizer, "_accumulators", owner) or {}) if _is_paddle_optimizer(optimizer) else {}


def creates_accumulators(optimizer) -> bool:
    """True for a Paddle optimizer (they all create their accumulators in ``_create_accumulators``)."""
    return _is_paddle_optimizer(optimizer)


def fleet_hybrid_group():
    """fleet's hybrid communicate group, or None before ``fleet.init`` set one (``Fleet.init`` sets ``_hcg``)."""
    return paddle.distributed.fleet.fleet.__dict__.get("_hcg")


_WRAPPERS_LAYERS = (paddle.DataParallel, MetaParallelBase)  # keep the wrapped model in _layers
_WRAPPERS_LAYER = (GroupShardedStage2, GroupShardedStage3)  # keep it in _layer


def wrapped_layer(model):
    """The model a Paddle parallel wrapper (or an object shaped like one) wraps, else None (parallel/wrappers.py)."""
    if isinstance(model, _WRAPPERS_LAYERS):
        return _read(model, "_layers", "paddletrainer/parallel/wrappers.py")
    if isinstance(model, _WRAPPERS_LAYER):
        return _read(model, "_layer", "paddletrainer/parallel/wrappers.py")
    # another object shaped like one of them (a user's wrapper, a test's stand-in) is unwrapped the same way
    return getattr(model, "_layers", None) or getattr(model, "_layer", None)


def stage1_owner_ranks(inner_optimizer):
    """Stage 1 (V1)'s parameter name → owning sharding rank, or None for any other optimizer (V2 has none)."""
    if isinstance(inner_optimizer, DygraphShardingOptimizer):
        return _read(inner_optimizer, "_param2rank", "paddletrainer/parallel/hybrid.py")
    return None


def pipeline_inputs_hook(layers):
    """A ``PipelineLayer``'s ``_prepare_pipeline_inputs_func`` (PaddleNLP's models set it), or None."""
    return vars(layers).get("_prepare_pipeline_inputs_func") if isinstance(layers, PipelineLayer) else None


def pipeline_stages(model):
    """The number of stages a ``PipelineLayer`` was built for, or None for any other model."""
    return _read(model, "_num_stages", "paddletrainer/checks.py") if isinstance(model, PipelineLayer) else None


def lazy_init_func(param):
    """The initializer call a parameter built under ``LazyGuard`` keeps until it is initialised, or None."""
    return vars(param).get("_init_func") if isinstance(param, paddle.base.framework.EagerParamBase) else None


def diagonal_uniform(init) -> bool:
    """True for a uniform initializer with a diagonal (its values depend on positions)."""
    return isinstance(init, UniformInitializer) and bool(_read(init, "_diag_num", "paddletrainer/parallel/lazy_init.py"))


def loader_reader_state(batches):
    """``(shut_down, workers, reader_thread)`` of a Paddle DataLoader iterator (data/loader.py); an object shaped
    like one (a test's stand-in) is read the same way, with an iterator's defaults when it lacks them."""
    if not isinstance(batches, dataloader_iter._DataLoaderIterBase):
        return (getattr(batches, "_shutdown", True), getattr(batches, "_workers", None),
                getattr(batches, "_thread", None))
    owner = "paddletrainer/data/loader.py"
    workers = _read(batches, "_workers", owner) if isinstance(batches, dataloader_iter._DataLoaderIterMultiProcess) \
        else None
    return bool(_read(batches, "_shutdown", owner)), workers, _read(batches, "_thread", owner)


def auto_sharded(param) -> bool:
    """True for a parameter that auto parallel marked for sharding (Paddle sets ``_need_shard_auto`` on it)."""
    return "_need_shard_auto" in vars(param)


# ---- check(): every guard of the table

# (class, attribute, file that reads it through an accessor above)
_ACCESSOR_FACTS = (
    (PipelineParallel, "_delay_scale_loss", "paddletrainer/optim/overflow.py"),
    (paddle.optimizer.Optimizer, "_grad_clip", "paddletrainer/parallel/clipping.py"),
    (paddle.optimizer.Optimizer, "_param_groups", "paddletrainer/parallel/clipping.py"),
    (paddle.optimizer.Optimizer, "_default_dict", "paddletrainer/parallel/clipping.py"),
    (paddle.optimizer.Optimizer, "_master_weights", "paddletrainer/checkpoint/local_state.py"),
    (paddle.optimizer.Optimizer, "_accumulators", "paddletrainer/checkpoint/local_state.py"),
    (paddle.optimizer.Optimizer, "_create_accumulators", "paddletrainer/checkpoint/local_state.py"),
    (Fleet, "_hcg", "paddletrainer/parallel/broadcast.py"),
    (Fleet, "_hcg", "paddletrainer/runtime/seeding.py"),
    (paddle.DataParallel, "_layers", "paddletrainer/parallel/wrappers.py"),
    (MetaParallelBase, "_layers", "paddletrainer/parallel/wrappers.py"),
    (GroupShardedStage2, "_layer", "paddletrainer/parallel/wrappers.py"),
    (GroupShardedStage3, "_layer", "paddletrainer/parallel/wrappers.py"),
    (DygraphShardingOptimizer, "_param2rank", "paddletrainer/parallel/hybrid.py"),
    (PipelineLayer, "_num_stages", "paddletrainer/checks.py"),
    (paddle.base.framework.EagerParamBase, "_init_func", "paddletrainer/parallel/lazy_init.py"),
    (UniformInitializer, "_diag_num", "paddletrainer/parallel/lazy_init.py"),
    (dataloader_iter._DataLoaderIterSingleProcess, "_shutdown", "paddletrainer/data/loader.py"),
    (dataloader_iter._DataLoaderIterMultiProcess, "_workers", "paddletrainer/data/loader.py"),
    (dataloader_iter._DataLoaderIterBase, "_thread", "paddletrainer/data/loader.py"),
)


def _class_sets(cls, name: str) -> bool:
    """True if ``cls`` (or a base) defines ``name`` or its module assigns ``self.<name>`` (read as text: parsing
    each class's source takes a second for the table)."""
    assigns = re.compile(rf"self\.{re.escape(name)}\s*(:[^=]*)?=[^=]")
    for klass in inspect.getmro(cls):
        if name in vars(klass):
            return True
        source = sys.modules.get(klass.__module__)
        path = getattr(source, "__file__", None)
        if path and assigns.search("".join(linecache.getlines(path))):
            return True
    return False


def _accessor_problems() -> list:
    return [f"{owner}: {cls.__name__} no longer sets {name} (paddletrainer/paddle_contract.py reads it)"
            for cls, name, owner in _ACCESSOR_FACTS if not _class_sets(cls, name)]


def _normalised_source(source: str) -> str:
    """``source`` as its tokens: comments, blank lines and spacing dropped, the block structure kept."""
    layout = {tokenize.INDENT: "<indent>", tokenize.DEDENT: "<dedent>", tokenize.NEWLINE: "<newline>"}
    tokens = tokenize.generate_tokens(io.StringIO(textwrap.dedent(source)).readline)
    return " ".join(layout.get(t.type, t.string) for t in tokens if t.type not in (tokenize.COMMENT, tokenize.NL))


_paddle_source = paddle_source  # the digest check's source getter (the tests replace it)


def digest_problems(table: Tuple) -> list:
    """One ``"<file>: ..."`` line per function of ``table`` (:data:`STAGE2_SOURCES`/:data:`STAGE3_SOURCES`) whose
    normalised source is not the one recorded on :data:`DIGESTED_ON`."""
    problems = []
    for (module, owner_name), name, expected, recheck in table:
        label = f"{owner_name}.{name}"
        try:
            owner = importlib.import_module(module)
            owner = getattr(owner, owner_name) if owner_name != module.rsplit(".", 1)[-1] else owner
            func = getattr(owner, name)
            func = func.fget if isinstance(func, property) else func
            func = getattr(func, "__wrapped_paddle__", func)  # Paddle's own, where ours replaced it
            digest = hashlib.sha256(_normalised_source(_paddle_source(func)).encode()).hexdigest()
        except (AttributeError, ImportError, OSError, TypeError, tokenize.TokenError) as exc:
            problems.append(f"{label} cannot be read ({type(exc).__name__}: {exc}); re-check {recheck}")
            continue
        if digest != expected:
            problems.append(f"{label} differs from Paddle {DIGESTED_ON}'s (normalised-source sha256 {digest[:12]}, "
                            f"expected {expected[:12]}); re-check {recheck}")
    return ["paddletrainer/parallel/sharding.py: " + p for p in problems]


def check() -> list:
    """Every broken fact about the installed Paddle/PaddleNLP, one line each starting with the file to edit
    (empty when everything :data:`SYMBOLS` relies on holds)."""
    fills = [line for fill in (*cpu_fills.FILLS, packed_attention)
             for line in cpu_fills.paddle_checks.broken_assumptions(fill)]
    return fills + digest_problems(STAGE2_SOURCES) + digest_problems(STAGE3_SOURCES) + _accessor_problems()
