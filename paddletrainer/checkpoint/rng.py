"""Per-rank random state: python, numpy, paddle's default generator and the hybrid-parallel RNG tracker.

Stored as one JSON file per rank (``rng_state.<coords>.json``), keyed by the rank's coordinates (dp, sharding,
tp, pp). RNG streams are tied to a position in the layout (e.g. the tracker's model-parallel seed differs per
tp rank), so they are only restored when the layout is the same; otherwise the caller reports them as skipped.

Why JSON and not pickle: loading a checkpoint must never run code from it. A pickle runs arbitrary code when
it is loaded, and the crc32 in ``checkpoint_index.json`` does not help: whoever can edit the file can edit the
index. Every state here is plain numbers: python's Mersenne Twister is a tuple of ints, numpy's is an uint32
array plus a few scalars, and a paddle ``GeneratorState`` pickles itself as ``(device, seed, offset, engine)``
where ``engine`` is the text form of its engine — all of which JSON holds exactly. :func:`loads` accepts only
that schema and refuses a pickle outright (:class:`.read.UnsafeCheckpointFileError`).
"""

from __future__ import annotations

import json
import random
from typing import Any, Dict, List

import numpy as np
import paddle
from paddle.base.libpaddle import GeneratorState

from .placement import CheckpointError
from .read import refuse_pickle
from .validate import validate_rng_doc

FORMAT = "paddletrainer-rng/1"


def _tracker():
    from paddle.distributed.fleet.meta_parallel import get_rng_state_tracker

    return get_rng_state_tracker()


def capture_rng_state() -> Dict[str, Any]:
    return {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "paddle": paddle.get_rng_state(),
        "tracker": _tracker().get_states_tracker(),
    }


def restore_rng_state(state: Dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    paddle.set_rng_state(state["paddle"])
    tracker_states = state.get("tracker") or {}
    if tracker_states:
        # set_states_tracker refuses names the tracker does not know; a run that has not added them
        # yet (no TP) simply gets them added with a placeholder seed and then overwritten.
        known = _tracker().states_
        for name in tracker_states:
            if name not in known:
                # the seed only has to be unused (add() rejects duplicates); the state is replaced below
                seed = 1_000_003 + len(known) + sum(map(ord, name)) * 7919
                while seed in _tracker().seeds_:
                    seed += 1
                _tracker().add(name, seed)
        _tracker().set_states_tracker(tracker_states)


# ------------------------------------------------------------------------------ JSON form (no pickle)
def _generator_to_json(gen) -> Dict[str, Any]:
    device, seed, offset, engine = gen.__getstate__()
    return {"device": int(device), "seed": int(seed), "offset": int(offset),
            "engine": bytes(engine).decode("latin-1")}


def _generator_from_json(d: Dict[str, Any]):
    gen = GeneratorState.__new__(GeneratorState)
    gen.__setstate__((d["device"], d["seed"], d["offset"], list(d["engine"].encode("latin-1"))))
    return gen


def _generators_to_json(value) -> List[Dict[str, Any]]:
    return [_generator_to_json(g) for g in value]  # paddle.get_rng_state(): one GeneratorState per device


def dumps(state: Dict[str, Any]) -> bytes:
    """The JSON bytes of a :func:`capture_rng_state` result."""
    version, mt, gauss_next = state["python"]
    algorithm, keys, pos, has_gauss, cached = state["numpy"]
    doc = {
        "format": FORMAT,
        "python": {"version": int(version), "state": [int(x) for x in mt], "gauss_next": gauss_next},
        "numpy": {"algorithm": str(algorithm), "keys": [int(x) for x in np.asarray(keys)], "pos": int(pos),
                  "has_gauss": int(has_gauss), "cached_gaussian": float(cached)},
        "paddle": _generators_to_json(state["paddle"]),
        "tracker": {str(name): _generators_to_json(v) for name, v in (state.get("tracker") or {}).items()},
    }
    return json.dumps(doc, separators=(",", ":")).encode()


def loads(data: bytes, source: str = "RNG state") -> Dict[str, Any]:
    """Parse :func:`dumps` bytes back into a state for :func:`restore_rng_state`.

    Raises :class:`.read.UnsafeCheckpointFileError` for a pickle (never unpickled) and :class:`CheckpointError`
    for anything that is not this module's JSON schema (:func:`.validate.rng_schema`: the field it names).
    """
    refuse_pickle(data, source)
    try:
        doc = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise CheckpointError(f"{source} is not a paddletrainer RNG state ({type(e).__name__}: {e})") from None
    validate_rng_doc(doc, source, FORMAT)  # every field's type and range: the restore below cannot fail on them
    py, npy = doc["python"], doc["numpy"]
    gauss = None if py["gauss_next"] is None else float(py["gauss_next"])
    try:
        return {
            "python": (py["version"], tuple(py["state"]), gauss),
            "numpy": (npy["algorithm"], np.asarray(npy["keys"], dtype=np.uint32), npy["pos"], npy["has_gauss"],
                      float(npy["cached_gaussian"])),
            "paddle": [_generator_from_json(g) for g in doc["paddle"]],
            "tracker": {name: [_generator_from_json(g) for g in gens] for name, gens in doc["tracker"].items()},
        }
    except (ValueError, TypeError, RuntimeError) as e:  # Paddle refusing a generator state the schema let by
        raise CheckpointError(f"{source} is not a paddletrainer RNG state ({type(e).__name__}: {e})") from None
