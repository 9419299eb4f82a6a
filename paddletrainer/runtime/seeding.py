"""Seeds: the whole process (``set_seed``) and PaddleNLP's per-rank seeds for hybrid parallel dropout
(``_get_distributed_seeds``). Public at PaddleNLP's path ``trainer_utils`` too."""
import random
from typing import Any, Tuple

import numpy as np
import paddle
from paddle.distributed import fleet


__all__ = ["set_seed", "_get_distributed_seeds", "set_hyrbid_parallel_seed"]


def set_seed(seed: int = 42) -> None:
    """Seed Python's ``random``, numpy and paddle (which seeds the CPU and every visible accelerator).

    Per-rank seed offsets for tensor/pipeline parallel dropout are the topology's job, not this function's.
    """
    random.seed(seed)
    np.random.seed(seed)
    paddle.seed(seed)


def _get_distributed_seeds(seed: int = 1234, topo: Any = None) -> Tuple[int, int, int]:
    """PaddleNLP's per-rank seeds ``(global_seed, local_seed, random_seed)`` for hybrid parallel runs.

    * global_seed: the same on the ranks of one tensor-parallel group, different across pp/dp/sharding ranks
      (dropout outside tensor-parallel layers);
    * local_seed: different on every rank (dropout inside tensor-parallel layers);
    * random_seed: ``seed + 100 * pp_rank`` (Python and NumPy).

    ``topo`` is a :class:`paddletrainer.parallel.Topology` (or anything with ``tp_degree/tp_rank``,
    ``pp_degree/pp_rank``, ``dp_degree/dp_rank``, ``sharding_rank``); None reads fleet's hybrid group when one
    exists, else every rank is 0 (one process). PaddleNLP's separate ``sep`` axis is degree 1 here.
    """
    world = paddle.distributed.get_world_size()
    mp = pp = dp = sharding_rank = 0
    mp_size = pp_size = dp_size = 1
    if topo is not None and world > 1:
        mp, mp_size = topo.tp_rank, topo.tp_degree
        pp, pp_size = topo.pp_rank, topo.pp_degree
        dp, dp_size = topo.dp_rank, topo.dp_degree
        sharding_rank = topo.sharding_rank
    elif world > 1:
        # fleet's hybrid group once fleet.init set it (this module is a leaf, so it reads fleet's attribute itself;
        # paddle_contract.check() fails, naming this file, if Fleet stops setting _hcg)
        hcg = vars(fleet.fleet).get("_hcg")
        if hcg is not None:
            mp, mp_size = hcg.get_model_parallel_rank(), hcg.get_model_parallel_world_size()
            pp, pp_size = hcg.get_stage_id(), hcg.get_pipe_parallel_world_size()
            dp, dp_size = hcg.get_data_parallel_rank(), hcg.get_data_parallel_world_size()
            sharding_rank = hcg.get_sharding_parallel_rank()
    # Offsets of each axis, innermost first (mp, then pp, dp, sharding): the rank's coordinates as one number.
    coordinate = pp * mp_size + dp * mp_size * pp_size + sharding_rank * mp_size * pp_size * dp_size
    global_seed = seed + coordinate
    local_seed = seed + world + mp + coordinate
    random_seed = seed + 100 * pp
    return global_seed, local_seed, random_seed


def set_hyrbid_parallel_seed(basic_seed: int, dataset_rank: int, tp_rank: int, pp_rank: int = 0) -> None:
    """PaddleNLP's seeding of a hybrid parallel rank (its spelling, ``hyrbid``, kept so its scripts import it).

    Python, NumPy and paddle get ``basic_seed + dataset_rank`` (data ranks draw different samples); fleet's RNG
    tracker gets ``global_seed = basic_seed + 100003 + dataset_rank`` (dropout outside tensor-parallel layers, the
    same across a tensor-parallel group) and ``local_seed = basic_seed + 59999 + 10 * tp_rank + 1000 * pp_rank``
    (dropout inside them), each added only when the tracker has neither that state name nor that seed yet.
    """
    set_seed(basic_seed + dataset_rank)
    tracker = fleet.meta_parallel.get_rng_state_tracker()
    seeds = {"global_seed": basic_seed + 100003 + dataset_rank,
             "local_seed": basic_seed + 59999 + tp_rank * 10 + pp_rank * 1000}
    for name, value in seeds.items():
        if name not in tracker.states_ and value not in tracker.seeds_:
            tracker.add(name, value)
