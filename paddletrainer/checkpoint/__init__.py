"""Layout-independent checkpoints: each rank writes what it owns, any layout reads what it needs.

Decision: an own format, not ``paddle.distributed.flex_checkpoint.dcp``
----------------------------------------------------------------------
DCP (``save_state_dict``/``load_state_dict``, Paddle 3.3.1) was tried on the CPU build (2026-11): loading into a
different layout fails with "No available device found" because its reshard communicators call ``Tensor.cuda()``
(``paddle/distributed/flex_checkpoint/dcp/reshard_comm.py``, lines 167-627); fleet's stage-1 (V1) sharding
optimizer ``DygraphShardingOptimizer`` has no ``sharded_state_dict`` (only V2 has); its files are pickles, and
its metadata is not meant to be read by other tools. Our own format is small and fits the problems users report:

* **files** — every rank writes only the pieces it was chosen to write as safetensors (numpy) files named
  by rank coordinates: ``model_state.tp00_pp01.safetensors``, ``optimizer.tp00_pp01_shard01.safetensors``
  (``_shardNN`` on model files only under weight sharding). safetensors saved 100 MiB of fp32 tensors in 0.10 s
  where ``paddle.save`` of the Tensors took 0.44 s, and loaded them in 0.05 s against 0.09 s (2026-11-25, 2 CPUs:
  ``python scripts/bench_checkpoint_formats.py``, docs/benchmarks.md "Checkpoint file format"); its files can
  be sliced on read without loading them whole.
* **one index** — ``checkpoint_index.json`` written by rank 0 from everybody's metadata: per tensor its
  global key (``model/<state_dict name>``, ``optim/<param name>/<moment1|moment2|beta1_pow_acc|...|master_weight>``),
  global shape, dtype and pieces (file, offsets, shape, optional flat range); per file its size and crc32,
  and the crc32 of its header and of each tensor (``parts``: a rank reading a few tensors verifies just those).
* **written once** — the lowest rank holding a piece writes it, decided by a pure function over the
  all-gathered candidate lists, so dp/tp replicas and tied weights cost nothing extra.
* **resharding without collectives** — a loading rank computes which stored pieces overlap its slice
  (pure functions in :mod:`.placement`) and reads only those slices from the shared filesystem. Works in
  one process, on CPU, for TP/PP/sharding/DP changes, for optimizer state as well as weights.
* **atomic publish** — write into ``checkpoint-N.tmp-<id>/``, index, marker ``.checkpoint_complete``
  LAST, rename. Readers only accept marked ``checkpoint-N`` dirs; stale tmp dirs are removed by the
  next save. Async saves copy the tensors to host memory in a thread while the next forward/backward
  runs (waited for before the next optimizer step), write in that thread, and publish at the next
  collective ``Checkpointer.finish`` point.
* **per-rank state** — RNG (python, numpy, paddle, the hybrid RNG tracker) per rank coordinates, restored
  only into the same layout (else skipped with a warning); the data position (``data_state``) is
  layout-free and always restored.
* **no code on load** — safetensors and JSON only (RNG states too); no loader unpickles, and a pickle in
  place of a file is refused (:class:`.read.UnsafeCheckpointFileError`) even when the index matches it.

Modules, one job each: :mod:`.placement` (names on disk, placements, overlaps, writer choice, the index, rotation
rules — pure), :mod:`.discovery` (which checkpoints exist, are complete, ours, sound, the newest; the resume
resolution, ``auto`` included; rotation, stale tmp dirs — paddle-free), :mod:`.read` (every file opened by one rule:
plain names inside the directory, regular files, sizes checked before reading; files read once, checksummed as read;
the small JSON files), :mod:`.write` (safetensors and small files with their crc32, fsync), :mod:`.save`
(``Checkpointer``: the states bound once, save + atomic publish), :mod:`.local_state` (what this rank holds: Paddle
wrappers, TP split axes, stage-3 slices, optimizer accumulators), :mod:`.snapshot` (the async host copy),
:mod:`.async_writer`, :mod:`.load`, :mod:`.reshard` (slices), :mod:`.rng`, :mod:`.export`, :mod:`.validate` (one
schema per kind of JSON file and the safetensors header, checked on load) and :mod:`.peft` (LoRA: adapters-only
checkpoints, ``save_model``'s PEFT directory, merging into the base).
The checkpoint directory must be on a filesystem every rank sees (all ranks write into one tmp dir).

Public API: :class:`Checkpointer` (bound to its :class:`CheckpointStates`; ``save``/``wait_for_snapshot``/
``finish``), :func:`save_checkpoint` (one synchronous save), :func:`load_checkpoint`,
:func:`rotate_checkpoints`, :func:`list_complete_checkpoints`, :func:`get_last_complete_checkpoint`,
:func:`export_for_from_pretrained` (CLI: ``paddletrainer-merge-checkpoint``, ``paddletrainer.tools.merge_checkpoint``).
The names are resolved on first use (PEP 562): importing a paddle-free submodule (:mod:`.discovery`,
:mod:`.placement`, :mod:`.read`) does not import paddle.
"""

from typing import TYPE_CHECKING

from ..lazy_exports import lazy_attributes

# public name -> submodule that defines it
_EXPORTS = {
    "CHECKPOINT_COMPLETE_MARKER": "placement",
    "CheckpointCorruptError": "placement",
    "CheckpointError": "placement",
    "CheckpointMismatchError": "placement",
    "Placement": "placement",
    "get_last_complete_checkpoint": "discovery",
    "is_complete_checkpoint": "discovery",
    "list_complete_checkpoints": "discovery",
    "remove_stale_tmp_dirs": "discovery",
    "rotate_checkpoints": "discovery",
    "CheckpointPathError": "read",
    "read_index": "read",
    "CheckpointStates": "save",
    "Checkpointer": "save",
    "save_checkpoint": "save",
    "LoadedCheckpoint": "load",
    "load_checkpoint": "load",
    "export_for_from_pretrained": "export",
    "merged_model_state": "export",
    "InvalidCheckpointFileError": "validate",
}

if TYPE_CHECKING:  # the same names for type checkers and editors' go-to-definition (never executed)
    from .discovery import (get_last_complete_checkpoint, is_complete_checkpoint, list_complete_checkpoints,
                            remove_stale_tmp_dirs, rotate_checkpoints)
    from .export import export_for_from_pretrained, merged_model_state
    from .load import LoadedCheckpoint, load_checkpoint
    from .placement import (CHECKPOINT_COMPLETE_MARKER, CheckpointCorruptError, CheckpointError,
                            CheckpointMismatchError, Placement)
    from .read import CheckpointPathError, read_index
    from .save import Checkpointer, CheckpointStates, save_checkpoint
    from .validate import InvalidCheckpointFileError

__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_attributes(globals(), _EXPORTS)
