"""Input checks: each raises one ``ValueError`` naming the option, the value and what would be valid.

``check_model_for_layout`` (TP/PP asked of a model not built for it — before any process group exists),
``check_pipeline_split``, ``check_batch_keys`` (``remove_unused_columns=False`` with keys the forward does not
take), ``check_dataset`` (empty data set), ``check_output_dir`` (a previous run's checkpoints would be mixed with
this run's, or entries paddletrainer did not write are in the way), ``check_checkpoint_collisions`` (a step this
run may save is taken by such an entry).
"""
from __future__ import annotations

import os
from typing import Iterable, Sequence

import paddle
from paddle.distributed.fleet.meta_parallel import PipelineLayer

from .data.collate import forward_parameters
from .paddle_contract import optimizer_param_groups, pipeline_stages
from .parallel.context import has_cp_path
from .parallel.segment import has_sep_path
from .checkpoint.discovery import foreign_checkpoint_entries, requested_resume
from .checkpoint.placement import parse_checkpoint_step
from .trainer_utils import has_length

__all__ = [
    "check_batch_keys",
    "check_checkpoint_collisions",
    "check_dataset",
    "check_model_for_layout",
    "check_model_for_cp",
    "check_model_for_sep",
    "check_optimizer_for_layout",
    "check_output_dir",
    "check_pipeline_split",
]


_TP_LAYER_NAMES = ("ColumnParallelLinear", "RowParallelLinear", "VocabParallelEmbedding", "ParallelCrossEntropy",
                   "ColumnSequenceParallelLinear", "RowSequenceParallelLinear")


def check_pipeline_split(num_layers: int, pp_degree: int, option: str = "num_hidden_layers") -> None:
    """Every pipeline stage needs at least one layer: ``num_layers >= pp_degree``. Call it before building a
    ``...Pipe`` model (Paddle's own check is an assertion deep inside ``PipelineLayer``)."""
    if pp_degree > 1 and num_layers < pp_degree:
        raise ValueError(
            f"{option}={num_layers} cannot be split over pipeline_parallel_degree={pp_degree} stages: every stage "
            f"needs at least one layer; use pipeline_parallel_degree <= {max(num_layers, 1)} or a deeper model")


def check_optimizer_for_layout(optimizer, config) -> None:
    """A user's optimizer that the layout of ``config`` (a ``ParallelConfig``) cannot honour, refused by name.

    Parameter groups under sharding stage 1: Paddle's stage-1 sharding optimizers take one flat parameter list
    (``DygraphShardingOptimizer`` raises ``TypeError: Do not support param_groups now``, V2 likewise), so each
    group's learning rate, weight decay and clip would be lost.
    """
    groups = optimizer_param_groups(optimizer, "paddletrainer/checks.py")
    if groups and isinstance(groups[0], dict) and config.layout.sharding > 1 and config.sharding_stage == 1:
        raise ValueError("optimizers: parameter groups are not supported with --sharding stage1 (Paddle's stage-1 "
                         "sharding optimizer takes one parameter list); use --sharding stage2 or stage3, or one "
                         "parameter list with apply_decay_param_fun")


def check_model_for_layout(model, degrees) -> None:
    """Refuse a model that is not built for the requested tensor/pipeline parallel layout.

    ``degrees``: ``args.parallel_degrees`` (``tp``/``pp`` attributes). Needs no process group, so the Trainer
    calls it before ``init_topology``. Checks:

    * pp > 1: the model is a ``PipelineLayer`` with ``pp`` stages, each holding at least one layer;
    * tp > 1: a model whose class builds tensor-parallel layers (PaddleNLP's Llama, Qwen2, GPT ...) has a config
      whose ``tensor_parallel_degree`` equals tp; then the model has tensor-parallel layers (``ColumnParallelLinear``
      ...): one whose class has none (ERNIE, a plain Layer) is told so, not asked to set its config.
    """
    tp, pp = degrees.tp, degrees.pp
    name = type(model).__name__
    if pp > 1:
        if not isinstance(model, PipelineLayer):
            raise ValueError(
                f"pipeline_parallel_degree={pp} needs a PipelineLayer model (e.g. LlamaForCausalLMPipe), but "
                f"{name} is a plain paddle.nn.Layer; build the ...Pipe variant of the model or use "
                f"pipeline_parallel_degree=1")
        stages = pipeline_stages(model)
        if stages is not None and int(stages) != pp:
            raise ValueError(
                f"pipeline_parallel_degree={pp} but the {name} was built for {stages} stages; build it after the "
                f"training arguments (its num_stages must equal pipeline_parallel_degree)")
        parts = list(getattr(model, "segment_parts", None) or [])
        empty = [i for i in range(len(parts) - 1) if parts[i + 1] <= parts[i]]
        if empty:
            raise ValueError(
                f"pipeline_parallel_degree={pp}: {name} has {parts[-1] if parts else 0} layers split as "
                f"{parts}, which leaves stage(s) {empty} empty; every stage needs at least one layer")
    check_model_for_sep(model, degrees)
    check_model_for_cp(model, degrees)
    config = getattr(model, "config", None)
    if tp > 1:
        config_tp = getattr(config, "tensor_parallel_degree", None) if config is not None else None
        splittable = _has_tp_layers(model) or _class_builds_tp_layers(model)
        if splittable and config_tp is not None and int(config_tp) != tp:
            raise ValueError(
                f"tensor_parallel_degree={tp} but {name}.config.tensor_parallel_degree={config_tp}; set "
                f"config.tensor_parallel_degree = training_args.tensor_parallel_degree (and tensor_parallel_rank) "
                f"before building the model")
        if not _has_tp_layers(model):
            raise ValueError(
                f"tensor_parallel_degree={tp}: {name} has no tensor-parallel layers (ColumnParallelLinear / "
                f"RowParallelLinear / VocabParallelEmbedding) and cannot be split over {tp} ranks; use "
                f"tensor_parallel_degree=1 (sharding or data parallel divide the work instead) or a model family "
                f"that has them (PaddleNLP's Llama, Qwen2, GPT ..., built after setting config.tensor_parallel_degree)")


def check_model_for_sep(model, degrees) -> None:
    """sep > 1 (``degrees``: ``args.parallel_degrees``): the model has a sep path (PaddleNLP's ``ReshardLayer``,
    built from ``config.sep_parallel_degree``), and its heads, key/value heads and ``seq_length`` split as the
    sep attention splits them (heads over tp·sep, sequences over sep). Refused, never run as plain attention."""
    sep, tp = getattr(degrees, "sep", 1), degrees.tp
    if sep == 1:
        return
    name, config = type(model).__name__, getattr(model, "config", None)
    config_sep = getattr(config, "sep_parallel_degree", None)
    if config_sep is None or int(config_sep) != sep or not has_sep_path(model):
        raise ValueError(
            f"sep_parallel_degree={sep} needs a model with a sep attention path (PaddleNLP's Llama: set "
            f"config.sep_parallel_degree = training_args.sep_parallel_degree before building it, after the topology "
            f"exists); {name} has config.sep_parallel_degree={config_sep} and "
            f"{'a' if has_sep_path(model) else 'no'} ReshardLayer")
    for option in ("num_attention_heads", "num_key_value_heads"):
        heads = getattr(config, option, None)
        if heads is not None and int(heads) % (tp * sep):
            raise ValueError(f"{name}.config.{option}={heads} is not divisible by tensor_parallel_degree x "
                             f"sep_parallel_degree = {tp} x {sep}: every rank needs whole heads")
    seq = getattr(config, "seq_length", None)
    if seq is None or int(seq) % sep:
        raise ValueError(f"{name}.config.seq_length={seq} is not divisible by sep_parallel_degree={sep}: set "
                         f"seq_length to the training sequence length, a multiple of {sep}")


def check_model_for_cp(model, degrees) -> None:
    """cp > 1 (``degrees``: ``args.parallel_degrees``): the model has a ring-attention path (PaddleNLP's Llama
    built with ``config.context_parallel_degree`` = cp and ``use_flash_attention``), no alibi, fused rope only on
    a GPU (PaddleNLP's fused rope asserts one under cp), and a ``seq_length`` that splits into 2·cp chunks.
    Refused, never run as plain attention over a part of each sequence."""
    cp = getattr(degrees, "cp", 1)
    if cp == 1:
        return
    name, config = type(model).__name__, getattr(model, "config", None)
    config_cp = getattr(config, "context_parallel_degree", None)
    if config_cp is None or int(config_cp) != cp or not has_cp_path(model):
        raise ValueError(
            f"context_parallel_degree={cp} needs a model with a ring-attention path (PaddleNLP's Llama: set "
            f"config.context_parallel_degree = training_args.context_parallel_degree before building it); {name} "
            f"has config.context_parallel_degree={config_cp}")
    if not getattr(config, "use_flash_attention", False):
        raise ValueError(f"context_parallel_degree={cp}: {name}.config.use_flash_attention is False; PaddleNLP's "
                         f"Llama runs ring attention only on its flash-attention path: set it True")
    if getattr(config, "alibi", False):
        raise ValueError(f"context_parallel_degree={cp}: {name}.config.alibi=True; ring attention takes no alibi")
    if getattr(config, "use_fused_rope", False) and "gpu" not in paddle.device.get_device():
        raise ValueError(f"context_parallel_degree={cp}: {name}.config.use_fused_rope=True needs a GPU under context "
                         f"parallel (PaddleNLP asserts it); set use_fused_rope=False on {paddle.device.get_device()}")
    seq = getattr(config, "seq_length", None)
    if seq is None or int(seq) % (2 * cp):
        raise ValueError(f"{name}.config.seq_length={seq} is not divisible by 2 x context_parallel_degree = {2 * cp}: "
                         f"set seq_length to the training sequence length, a multiple of {2 * cp}")


def _has_tp_layers(model) -> bool:
    return any(type(m).__name__ in _TP_LAYER_NAMES for m in model.sublayers(include_self=True))


def _class_builds_tp_layers(model) -> bool:
    """Whether the model's class builds tensor-parallel layers from ``config.tensor_parallel_degree``: a PaddleNLP
    class with its own ``_get_tensor_parallel_mappings`` (the split its ``from_pretrained`` needs under tp; the
    base class's raises ``NotImplementedError``, as for ERNIE, which has no tensor-parallel layers)."""
    owner = next((c for c in type(model).__mro__ if "_get_tensor_parallel_mappings" in vars(c)), None)
    return owner is not None and owner.__name__ != "ConversionMixin"


def check_batch_keys(model, keys: Iterable[str], popped: Sequence[str] = ()) -> None:
    """Raise when a batch holds keys ``model.forward`` does not accept (``remove_unused_columns=False``).

    ``popped``: keys the trainer removes before calling the model (the label names when a criterion is used).
    Models whose forward takes ``**kwargs`` and ``PipelineLayer`` models (they take one packed input) pass.
    """
    allowed = forward_parameters(model)  # None for **kwargs and PipelineLayer models: nothing to check
    if allowed is None:
        return
    unexpected = sorted(set(keys) - set(allowed) - set(popped))
    if unexpected:
        raise ValueError(
            f"remove_unused_columns=False passes every batch key to the model, but {type(model).__name__}.forward"
            f"({', '.join(allowed)}) does not accept {unexpected}; drop or rename those columns, or set "
            f"remove_unused_columns=True to drop them automatically")


def check_dataset(dataset, option: str = "train_dataset") -> None:
    """An empty map-style data set is an error naming the option (iterable data sets cannot be checked)."""
    if dataset is None or not has_length(dataset):  # paddle.io.IterableDataset.__len__ raises RuntimeError
        return
    if len(dataset) == 0:
        raise ValueError(f"{option} is empty (0 samples): there is nothing to "
                         f"{'train on' if option.startswith('train') else 'evaluate'}; check the data path and split")


def check_output_dir(args, resume_from_checkpoint=None) -> None:
    """Refuse to train into an ``output_dir`` that holds a previous run's checkpoints.

    Raises when ``overwrite_output_dir`` is False, no ``resume_from_checkpoint`` is given (argument or
    ``args.resume_from_checkpoint``) and ``output_dir`` has

    * ``checkpoint-N`` entries paddletrainer did not write (a PaddleNLP checkpoint, a user's directory or file:
      :func:`~paddletrainer.checkpoint.discovery.foreign_checkpoint_entries`) — this run's saves would collide with
      them, and they are never deleted or renamed; checked for every ``train()``;
    * with ``args.do_train`` (as PaddleNLP's scripts check), checkpoints of ours — the new run's checkpoints would
      be interleaved with (and rotated against) the old ones.
    """
    if args.overwrite_output_dir:
        return
    resume = resume_from_checkpoint if resume_from_checkpoint is not None else args.resume_from_checkpoint
    out = args.output_dir
    if requested_resume(resume) is not None or not out or not os.path.isdir(out):
        return
    foreign = foreign_checkpoint_entries(out)
    if foreign:
        raise ValueError(
            f"output_dir={out!r} holds entries named like checkpoints that paddletrainer did not write "
            f"({_entry_list(out, foreign)}); this run's saves would collide with them and paddletrainer never "
            f"deletes or renames them: move them out of output_dir or choose another output_dir (with "
            f"--overwrite_output_dir a run may start beside them as long as it cannot save one of those steps)")
    if not args.do_train:
        return
    found = sorted((n for n in os.listdir(out) if parse_checkpoint_step(n) is not None), key=parse_checkpoint_step)
    if found:
        shown = ", ".join(found[-3:]) + (f" (+{len(found) - 3} more)" if len(found) > 3 else "")
        raise ValueError(
            f"output_dir={out!r} already holds checkpoints of a previous run ({shown}); pass "
            f"--resume_from_checkpoint true to continue it, --overwrite_output_dir to train over it, or choose "
            f"another output_dir")


def _entry_list(folder: str, entries, limit: int = 10) -> str:
    shown = [name + (" (a file)" if not os.path.isdir(os.path.join(folder, name)) else "") for _, name in entries]
    return ", ".join(shown[:limit]) + (f" (+{len(shown) - limit} more)" if len(shown) > limit else "")


def check_checkpoint_collisions(output_dir: str, first_step: int, max_steps: int, resume=None) -> None:
    """Refuse to start a run that could save a ``checkpoint-N`` where an entry paddletrainer did not write lies.

    ``first_step``: the step training starts from (after any resume); every ``N`` in ``(first_step, max_steps]``
    may be saved (``save_steps``, epoch ends, a stop on SIGTERM), so a foreign ``checkpoint-N`` in that range
    is refused — also with ``overwrite_output_dir``, which never makes paddletrainer delete what it did not
    write. ``resume``: the checkpoint resumed from (never in the way of itself)."""
    resumed = os.path.abspath(resume) if resume else None
    blocking = [(step, name) for step, name in foreign_checkpoint_entries(output_dir)
                if first_step < step <= max_steps and os.path.join(os.path.abspath(output_dir), name) != resumed]
    if blocking:
        raise ValueError(
            f"output_dir={output_dir!r} holds entries named like checkpoints that paddletrainer did not write at "
            f"steps this run may save (steps {first_step + 1}..{max_steps}): {_entry_list(output_dir, blocking)}; "
            f"paddletrainer never deletes or renames them, even with --overwrite_output_dir: move them out of "
            f"output_dir or choose another output_dir")
