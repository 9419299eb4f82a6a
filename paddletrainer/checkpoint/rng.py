"""Per-rank random state: python, numpy, paddle's default generator and the hybrid-parallel RNG tracker.

Stored as one pickle per rank, keyed by the rank's coordinates (dp, sharding, tp, pp). RNG streams are
tied to a position in the layout (e.g. the tracker's model-parallel seed differs per tp rank), so they are
only restored when the layout is the same; otherwise the caller reports them as skipped.
"""

from __future__ import annotations

import pickle
import random
from typing import Any, Dict

import numpy as np
import paddle


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


def dumps(state: Dict[str, Any]) -> bytes:
    return pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL)


def loads(data: bytes) -> Dict[str, Any]:
    return pickle.loads(data)
