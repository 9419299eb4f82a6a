"""Replica-divergence check (``replica_check_steps``): the ranks that should hold identical weights compare them.

Data parallel and sharding keep replicas of the weights that every optimizer step must leave bit-identical: the
gradients are synchronised, then every replica applies the same update (sharding stage 1/2: each owner updates
its share and broadcasts it, so after the step every rank of the sharding group holds the full, identical
weights). A flipped bit in memory, a nondeterministic kernel or a bug that touches one rank's gradient after the
sync makes the replicas drift apart silently: the loss, the gradient norm and the checkpoints (written from one
replica) all look normal. Every ``replica_check_steps`` optimizer steps the replicas compare their weights:

1. each rank computes :func:`fingerprint` of its replicated tensors on the device: per tensor, its bits read as
   integers (``float32`` as ``int32``, ``bfloat16``/``float16`` as ``int16``) and summed, and their squares
   summed, in ``int64``. Integer sums do not depend on the summation order, so equal tensors give equal
   fingerprints on any kernel; one changed bit changes the plain sum by ±2^k;
2. one ``all_gather`` of that ``[parameters, 2]`` table over the replica group (the loop's own call);
3. one host read of the gathered table; a row that differs between ranks raises
   :class:`~paddletrainer.errors.ReplicaDivergenceError` naming the step, the first differing parameter and the
   ranks that differ from a strict majority (every disagreeing rank when there is none, e.g. with two
   replicas) — on every rank of the group alike (they all read the same table).
   When the world holds several replica groups (tensor/pipeline parallel cells), a 1-element MAX all-reduce of
   the verdict over the world follows, so every rank stops (or rolls back) at the same step.

The replica group: the data group (dp × sharding) under sharding stage 0/1/2; under stage 3 the weights are
sliced over the sharding group, so only the dp group holds identical copies (of the slices, and of the unsliced
parameters). Tensor/pipeline parallel ranks hold different tensors and are never compared with each other: each
tp/pp cell compares within its own group. Nothing runs (no collective, no read) when that group has one rank.

Under ``nan_inf_policy=rollback`` the Trainer rolls back on this error as on a non-finite step (``rollback.py``).
"""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import numpy as np
import paddle
import paddle.distributed as dist

from ..config.builders import ReplicaCheckConfig  # built by TrainingArguments: args.replica_check_config
from ..errors import ReplicaDivergenceError
from ..parallel.wrappers import unwrap_model

__all__ = ["ReplicaCheck", "fingerprint", "replicated_tensors", "first_divergence"]

# floating dtypes read as the signed integers of the same width (the bits, not the values: -0.0 != 0.0, NaNs kept)
_BITS_AS = {paddle.float32: "int32", paddle.bfloat16: "int16", paddle.float16: "int16", paddle.float64: "int64"}


@paddle.no_grad()
def fingerprint(tensors: Sequence[paddle.Tensor]) -> paddle.Tensor:
    """An ``int64 [len(tensors), 2]`` table, computed on the device without a host read: per tensor the sum of
    its elements' bit patterns read as integers and the sum of their squares (both wrap modulo 2^64).

    Bit-exact: equal tensors give equal rows whatever the summation order; a single changed bit anywhere changes
    the first column. Integer and bool tensors are summed as their values."""
    rows = []
    for tensor in tensors:
        flat = tensor.flatten()
        bits = flat.view(_BITS_AS[flat.dtype]) if flat.dtype in _BITS_AS else flat
        bits = bits.astype("int64")
        rows.append(paddle.stack([bits.sum(), (bits * bits).sum()]))
    if not rows:
        return paddle.zeros([0, 2], dtype="int64")
    return paddle.stack(rows)


def replicated_tensors(model, sharding_stage: int, skip_experts: bool = False) -> Tuple[List[str], List[paddle.Tensor]]:
    """The names and tensors this rank holds that its replicas hold too: every parameter of the user's model;
    under stage 3 a sliced parameter's slice (``fw_storage``; the full parameter is released between steps).
    ``skip_experts`` (expert parallel): the data ranks hold different experts, so expert parameters
    (``is_expert``) are left out (not compared: the expert-data-parallel replicas are not checked yet)."""
    names, tensors = [], []
    for name, param in unwrap_model(model).named_parameters():
        if skip_experts and getattr(param, "is_expert", False):
            continue
        if sharding_stage == 3 and getattr(param, "fw_storage", None) is not None:
            param = param.fw_storage
        if not param._is_initialized():
            continue  # nothing held here (the same parameters on every replica: same model, same wrapper)
        names.append(name)
        tensors.append(param)
    return names, tensors


def first_divergence(table: np.ndarray) -> Optional[Tuple[int, List[int], List[int]]]:
    """``table[r, p, :]``: replica ``r``'s fingerprint of parameter ``p``. None when every replica agrees, else
    ``(p, differing, majority)``: the first parameter whose rows differ, the replica indices that differ from a
    strict majority of equal rows and that majority's indices; without a strict majority (two replicas, say) no
    replica can be blamed: ``differing`` is every replica and ``majority`` empty."""
    differs = (table != table[:1]).any(axis=(0, 2))
    if not differs.any():
        return None
    p = int(np.argmax(differs))
    buckets = {}
    for r in range(table.shape[0]):
        buckets.setdefault(tuple(table[r, p].tolist()), []).append(r)
    largest = max(buckets.values(), key=len)
    if 2 * len(largest) <= table.shape[0]:
        return p, list(range(table.shape[0])), []
    return p, [r for r in range(table.shape[0]) if r not in largest], largest


def _replica_group(topology, sharding_stage: int):
    group = topology.group("dp") if sharding_stage == 3 else topology.data_group
    return group if group is not None and group.nranks > 1 else None


class ReplicaCheck:
    """The check of one ``train()`` call: :meth:`due` says whether a step checks, :meth:`check` compares.

    ``every`` is 0 (off) when the config says so or when this rank has no replica. ``verified_step``: the last
    step whose weights are known equal on every replica — the last check that passed, or the step the weights
    were loaded at (``start_step``, :meth:`restart`: every replica reads the same checkpoint). A rollback takes no
    checkpoint saved after it (:attr:`rollback_limit`)."""

    def __init__(self, config: ReplicaCheckConfig, topology, model, start_step: int = 0):
        self.config = config
        self.verified_step = start_step
        self.group = _replica_group(topology, config.sharding_stage) if config.every_steps > 0 else None
        self.every = config.every_steps if self.group is not None else 0
        self._model = model
        self._world_size = topology.world_size
        self._skip_experts = topology.layout.ep > 1
        self._axes = "data-parallel" if config.sharding_stage in (0, 3) else "data-parallel and sharding"

    @property
    def rollback_limit(self) -> Optional[int]:
        """The newest step a rollback may go back to: :attr:`verified_step` with the check on, else None."""
        return self.verified_step if self.every > 0 else None

    def restart(self, step: int) -> None:
        """The weights were loaded from the checkpoint of ``step`` on every replica (a rollback): they agree."""
        self.verified_step = step

    def due(self, step: int, saving: bool = False) -> bool:
        """Whether optimizer step ``step`` (counted the same on every rank) is a check step: every ``every`` steps
        and, with the check on, every step that saves a checkpoint (``saving``, the same decision on every rank), so
        that every checkpoint holds verified weights and a rollback (:attr:`rollback_limit`) may go back to it."""
        return self.every > 0 and (saving or step % self.every == 0)

    def check(self, step: int) -> None:
        """Compare the replicas' fingerprints (collective over the replica group: one all_gather, one host read;
        plus a MAX all-reduce of the verdict over the world when the group is smaller) and raise
        :class:`ReplicaDivergenceError` on every rank if any replica group differs; else ``step`` is verified."""
        error = self._verdict(step)
        if error is not None:
            raise error
        self.verified_step = step

    def _verdict(self, step: int) -> Optional[ReplicaDivergenceError]:
        names, tensors = replicated_tensors(self._model, self.config.sharding_stage, self._skip_experts)
        gathered: List[paddle.Tensor] = []
        dist.all_gather(gathered, fingerprint(tensors), group=self.group)
        table = paddle.stack(gathered).numpy()  # the check's one host read
        found = first_divergence(table)
        error = None if found is None else self._error(step, names, table, found)
        if self.group.nranks < self._world_size:
            error = self._agree_over_world(step, error)
        return error

    def _error(self, step: int, names: List[str], table: np.ndarray, found) -> ReplicaDivergenceError:
        p, differing, majority = found
        ranks = list(self.group.ranks)
        bad, good = [ranks[r] for r in differing], [ranks[r] for r in majority]
        count = int((table != table[:1]).any(axis=(0, 2)).sum())
        where = f"on rank(s) {bad} differs from rank(s) {good}" if good else f"differs between ranks {bad}"
        return ReplicaDivergenceError(
            f"step {step}: the {self._axes} replicas' weights diverged: parameter {names[p]!r} {where} "
            f"({count} of {len(names)} parameters differ; ranks {ranks} compared, replica_check_steps="
            f"{self.every}); a flipped bit, a nondeterministic kernel or a bug changed a replica after the "
            "gradient sync; nan_inf_policy='rollback' reloads the newest checkpoint saved at or before the last "
            "check that passed instead",
            step=step, ranks=bad, parameter=names[p])

    def _agree_over_world(self, step: int, error: Optional[ReplicaDivergenceError]):
        """Tensor/pipeline cells (and stage 3's sharding ranks) compare in their own groups: a MAX all-reduce of
        the verdict (1 + a differing rank, 0 for none) over the world makes every rank stop (or roll back) at
        this step. A second host read, only when the world has more than one replica group."""
        flag = paddle.to_tensor([0 if error is None else 1 + min(error.ranks)], dtype="int64")
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        elsewhere = int(flag.numpy()[0])
        if error is None and elsewhere:
            error = ReplicaDivergenceError(
                f"step {step}: the {self._axes} replicas of another replica group diverged (rank {elsewhere - 1} "
                "is one of them; its log names the parameter); stopping every rank at this step",
                step=step, ranks=[elsewhere - 1])
        return error
