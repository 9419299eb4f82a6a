"""Resume from a checkpoint directory written by PaddleNLP 3.0.0b4's Trainer (its non-unified format).

This is the only place paddletrainer reads pickles: PaddleNLP stores weights, optimizer state and scheduler
with ``paddle.save`` (``*.pdparams``, ``*.pdopt``), and loading a pickle can run code. Our own loader
(:mod:`.load`) refuses pickles. Here every pickle is read by the allowlist unpickler of
:mod:`.restricted_pickle` (arrays, tensors, numbers, strings, containers, RNG states; anything else is refused
naming the file and the class), never by ``paddle.load``. The Trainer calls this only for the exact directory
the user named (``resume_from_checkpoint=<path>``), never for one it found itself (``true``, ``auto``, the
trainer state's ``best_model_checkpoint``).

What is read (this rank's files for the current layout, PaddleNLP's naming):

* ``model_state[.<suffix>].pdparams`` — the model's ``state_dict`` (structured names); for a
  ``paddlenlp.peft.LoRAModel`` ``lora_model_state.pdparams`` instead: the trainable adapters only, under their
  names inside the base model, merged over tensor-parallel ranks (PaddleNLP's Trainer saves them with
  ``merge_tensor_parallel``), so any tensor-parallel degree splits them again as PaddleNLP's resume does;
* ``optimizer[.<suffix>].pdopt`` — the Paddle optimizer's ``state_dict`` (keyed by parameter names, which
  match when the model is built the same way as in the PaddleNLP run, e.g. the same script);
* ``scheduler.pdparams``, ``trainer_state.json`` (step, consumed samples, best metric), ``rng_state[_<world>].pth``.

``<suffix>`` is PaddleNLP's: ``tpXX`` when tensor parallel, ``ppXX`` when pipeline parallel, joined by ``_``,
plus ``shardXX`` for the optimizer under sharding (e.g. ``model_state.tp01_pp00.pdparams``,
``optimizer.tp01_pp00_shard00.pdopt``). A PaddleNLP checkpoint therefore resumes under the layout that wrote
it; resharding it is not supported. ``unified_checkpoint`` directories (safetensors) are read by
:mod:`.paddlenlp_unified`, in any layout.
"""
from __future__ import annotations

import json
import os
import random
from typing import List, Tuple

import numpy as np
import paddle
from paddle.distributed import fleet

from ..parallel.wrappers import unwrap_model
from .placement import CheckpointError, CheckpointMismatchError
from .load import LoadedCheckpoint
from .read import MAX_SMALL_FILE_BYTES, read_member
from .peft import peft_type
from .restricted_pickle import load_pickle
from .validate import InvalidCheckpointFileError, validate_scheduler_state, validate_trainer_state

__all__ = ["load_paddlenlp_checkpoint", "load_paddlenlp_extras", "paddlenlp_name_suffix"]


def paddlenlp_name_suffix(topology, optimizer: bool = False) -> str:
    """PaddleNLP's per-rank file-name suffix for this rank ("" on one process)."""
    parts = []
    if topology is not None and topology.tp_degree > 1:
        parts.append(f"tp{topology.tp_rank:0>2d}")
    if topology is not None and topology.pp_degree > 1:
        parts.append(f"pp{topology.pp_rank:0>2d}")
    if optimizer and topology is not None and topology.sharding_degree > 1:
        parts.append(f"shard{topology.sharding_rank:0>2d}")
    return "_".join(parts)


def _named(ckpt_dir: str, stem: str, ext: str, suffix: str) -> str:
    path = os.path.join(ckpt_dir, f"{stem}.{suffix}.{ext}" if suffix else f"{stem}.{ext}")
    if not os.path.isfile(path):
        present = sorted(n for n in os.listdir(ckpt_dir) if n.startswith(stem))
        raise CheckpointError(f"{ckpt_dir} is a PaddleNLP checkpoint without {os.path.basename(path)} for this "
                              f"rank's layout (files there: {present}); resume it with the layout that wrote it")
    return path


def _rng_states(ckpt_dir: str, name: str, topology) -> dict:
    """This rank's entry of ``rng_state[_<world>].pth``, every part checked by applying it to a scratch generator
    first: a damaged file is refused naming its field before any of this process's generators is touched."""
    path = os.path.join(ckpt_dir, name)
    states = load_pickle(path, return_numpy=True)
    if name != "rng_state.pth":  # one entry per rank
        rank = getattr(topology, "rank", 0)
        if not isinstance(states, (list, tuple)) or not 0 <= rank < len(states):
            raise InvalidCheckpointFileError(path, "", f"holds no RNG state of rank {rank} (a list per rank)")
        states, path = states[rank], f"{path}[{rank}]"
    if not isinstance(states, dict):
        raise InvalidCheckpointFileError(path, "", "is not a dict of RNG states")
    core = paddle.framework.core
    checks = (("python", lambda v: random.Random().setstate(v)),
              ("numpy", lambda v: np.random.RandomState().set_state(v)),
              ("cpu", _generator_state), ("cuda", lambda v: [_generator_state(x) for x in v]))
    for field, check in checks:
        if field not in states and field == "cuda":
            continue
        try:
            check(states[field])
        except Exception as e:  # noqa: BLE001 - whatever the value makes the setter raise: one line naming it
            raise InvalidCheckpointFileError(path, field, f"not a {field} RNG state ({type(e).__name__}: "
                                             f"{str(e)[:120]})") from None
    tracker = states.get("hybrid_parallel_rng_state_tracker")
    if tracker is not None and not (isinstance(tracker, dict) and all(  # name -> paddle.get_rng_state()'s list
            isinstance(k, str) and isinstance(v, (list, tuple)) and all(isinstance(x, core.GeneratorState) for x in v)
            for k, v in tracker.items())):
        raise InvalidCheckpointFileError(path, "hybrid_parallel_rng_state_tracker", "not a dict of generator state "
                                                                                  "lists")
    return states


def _generator_state(value):
    if not isinstance(value, paddle.framework.core.GeneratorState):
        raise TypeError(f"a {type(value).__name__}, not a Paddle GeneratorState")


def _restore_rng(ckpt_dir: str, topology) -> bool:
    world = getattr(topology, "world_size", 1) if topology is not None else 1
    name = "rng_state.pth" if world <= 1 else f"rng_state_{world}.pth"
    if not os.path.lexists(os.path.join(ckpt_dir, name)):
        return False
    states = _rng_states(ckpt_dir, name, topology)
    random.setstate(states["python"])
    np.random.set_state(states["numpy"])
    core = paddle.framework.core
    core.default_cpu_generator().set_state(states["cpu"])
    if core.is_compiled_with_cuda():
        for i, state in enumerate(states.get("cuda", [])[: core.get_cuda_device_count()]):
            core.default_cuda_generator(i).set_state(state)
    tracker = states.get("hybrid_parallel_rng_state_tracker")
    if tracker is not None and getattr(topology, "use_hybrid", False):
        if topology.tp_degree <= 1:
            tracker.pop("model_parallel_rng", None)
        ours = fleet.meta_parallel.get_rng_state_tracker()
        # PaddleNLP's Trainer also registers global_seed/local_seed (set_hyrbid_parallel_seed); a state this
        # process never registered cannot be drawn from here, so only the registered ones are restored
        registered = ours.get_states_tracker()
        ours.set_states_tracker({name: state for name, state in tracker.items() if name in registered})
    return True


def _trainer_state(ckpt_dir: str) -> dict:
    """``trainer_state.json`` (``{}`` without one): a regular file inside ``ckpt_dir``, bounded, every field of
    ``TrainerState`` checked (:func:`.validate.validate_trainer_state`), so nothing fails after the resume began."""
    path = os.path.join(ckpt_dir, "trainer_state.json")
    try:
        raw = read_member(ckpt_dir, "trainer_state.json", MAX_SMALL_FILE_BYTES, "trainer state")
    except FileNotFoundError:
        return {}
    try:
        doc = json.loads(raw)
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise InvalidCheckpointFileError(path, "", f"not JSON ({str(e)[:120]})") from None
    return validate_trainer_state(doc, path, resume=True)


def _pickled_dict(ckpt_dir: str, name: str, return_numpy: bool = False) -> dict:
    path = os.path.join(ckpt_dir, name)
    state = load_pickle(path, return_numpy=return_numpy)
    if not isinstance(state, dict):
        raise InvalidCheckpointFileError(path, "", f"is a {type(state).__name__}, not a state dict")
    return state


def load_paddlenlp_extras(ckpt_dir: str, *, lr_scheduler=None, scaler=None, topology=None,
                          load_rng: bool = True) -> Tuple[dict, bool]:
    """What both PaddleNLP formats (unified or not) store alike: ``scheduler.pdparams`` into ``lr_scheduler``,
    ``scaler.pdparams`` into ``scaler`` (pickles, read with the allowlist unpickler), the RNG of this rank from
    ``rng_state[_<world>].pth`` when the world size is the one that saved it. Returns the ``trainer_state.json``
    dict (``{}`` without one) and whether the RNG was restored. Each file is checked before any is applied."""
    trainer_state = _trainer_state(ckpt_dir)
    scheduler_state = scaler_state = None
    if lr_scheduler is not None and os.path.lexists(os.path.join(ckpt_dir, "scheduler.pdparams")):
        scheduler_state = validate_scheduler_state(_pickled_dict(ckpt_dir, "scheduler.pdparams"),
                                                   os.path.join(ckpt_dir, "scheduler.pdparams"))
    if scaler is not None and os.path.lexists(os.path.join(ckpt_dir, "scaler.pdparams")):
        scaler_state = _pickled_dict(ckpt_dir, "scaler.pdparams", return_numpy=True)
    if scheduler_state is not None:
        lr_scheduler.set_state_dict(scheduler_state)
    if scaler_state is not None:
        scaler.load_state_dict(scaler_state)
    rng = _restore_rng(ckpt_dir, topology) if load_rng else False
    return trainer_state, rng


def _weight_problems(weights: dict, model) -> List[str]:
    """Weights of another shape, or another kind of number, than the model's parameter of that name (int8 bytes
    would be cast into float weights without a word)."""
    problems = []
    for name, param in model.state_dict().items():
        value = weights.get(name)
        if value is None or not hasattr(value, "shape"):
            continue
        theirs, ours = str(value.dtype).replace("paddle.", ""), str(param.dtype).replace("paddle.", "")
        if list(value.shape) != list(param.shape):
            problems.append(f"{name}: shape {list(value.shape)} in the checkpoint but {list(param.shape)} in the model")
        elif ("float" in theirs) != ("float" in ours):
            problems.append(f"{name}: dtype {theirs} in the checkpoint but {ours} in the model")
    return problems


def _check_weight_names(ckpt_dir: str, missing, unexpected, warnings: List[str]) -> None:
    if missing:
        raise CheckpointError(f"{ckpt_dir}: the PaddleNLP weights lack {len(missing)} of the model's parameters, "
                              f"e.g. {list(missing)[:3]}")
    if unexpected:
        warnings.append(f"{len(unexpected)} tensors of the PaddleNLP weights are not in the model, e.g. "
                        f"{list(unexpected)[:3]}")


def _load_lora_weights(ckpt_dir: str, lora_model, topology, warnings: List[str]) -> None:
    """A LoRAModel's adapters from ``lora_model_state.pdparams`` (merged over tensor-parallel ranks: split for
    this rank by the model's own ``_convert_tensor_parallel``, as PaddleNLP's resume does) or, as PaddleNLP writes
    them under pipeline parallel or quantization, this rank's ``lora_model_state.<suffix>.pdparams``."""
    merged = os.path.join(ckpt_dir, "lora_model_state.pdparams")
    if os.path.isfile(merged):
        weights = load_pickle(merged, return_numpy=True)
        if lora_model.lora_config.tensor_parallel_degree > 1:
            weights = lora_model._convert_tensor_parallel(weights)
    else:
        weights = load_pickle(_named(ckpt_dir, "lora_model_state", "pdparams", paddlenlp_name_suffix(topology)),
                              return_numpy=True)
    base_state = lora_model.model.state_dict()
    trainable = [n for n, t in base_state.items() if not t.stop_gradient]
    _check_weight_names(ckpt_dir, [n for n in trainable if n not in weights],
                        [n for n in weights if n not in base_state], warnings)
    lora_model.model.set_state_dict({n: w for n, w in weights.items() if n in base_state})


def load_paddlenlp_checkpoint(ckpt_dir: str, *, model, optimizer=None, lr_scheduler=None, scaler=None,
                              topology=None, load_rng: bool = True) -> LoadedCheckpoint:
    """Load a PaddleNLP 3.0.0b4 checkpoint into ``model`` (and ``optimizer``, ``lr_scheduler``, the fp16 loss
    ``scaler`` from ``scaler.pdparams``, RNG); the same keywords as :func:`paddletrainer.checkpoint.load_checkpoint`.

    Returns what :func:`paddletrainer.checkpoint.load_checkpoint` returns; ``data_state`` is None (the
    position is the trainer state's ``consumed_samples``).
    """
    warnings: List[str] = []
    if peft_type(model) == "lora":
        _load_lora_weights(ckpt_dir, unwrap_model(model), topology, warnings)
    else:
        weights = load_pickle(_named(ckpt_dir, "model_state", "pdparams", paddlenlp_name_suffix(topology)))
        if not isinstance(weights, dict):
            raise CheckpointError(f"{ckpt_dir}: the PaddleNLP weights are a {type(weights).__name__}, not a state "
                                  "dict")
        problems = _weight_problems(weights, model)
        if problems:
            raise CheckpointMismatchError([f"{ckpt_dir} (PaddleNLP): {p}" for p in problems])
        missing, unexpected = model.set_state_dict(weights) or ([], [])
        _check_weight_names(ckpt_dir, missing, unexpected, warnings)
    optimizer_restored = False
    if optimizer is not None:
        state = load_pickle(_named(ckpt_dir, "optimizer", "pdopt", paddlenlp_name_suffix(topology, optimizer=True)))
        names = {p.name for p in model.parameters()}
        known = {k for k in state if k not in ("master_weights", "LR_Scheduler")
                 and any(k.startswith(n + "_") for n in names)}
        if state and not known:
            raise CheckpointError(f"{ckpt_dir}: no optimizer state matches the model's parameter names (the "
                                  "model must be built as in the PaddleNLP run that saved it)")
        optimizer.set_state_dict(state)
        optimizer_restored = True
    trainer_state, rng = load_paddlenlp_extras(ckpt_dir, lr_scheduler=lr_scheduler, scaler=scaler,
                                               topology=topology, load_rng=load_rng)
    return LoadedCheckpoint(trainer_state=trainer_state, data_state=None, rng_restored=rng,
                            optimizer_restored=optimizer_restored, warnings=warnings)
