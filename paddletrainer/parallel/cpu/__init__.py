"""The gloo fills: what Paddle's CPU build lacks for hybrid parallelism, filled exactly and only on that build.

Paddle 3.3.1 runs data parallel and sharding stage 1 on gloo as shipped, but tensor parallel, pipeline
parallel, groups of 4+ processes and sharding stage 2/3 each trip over a GPU-only assumption. One module per
fill, named for what it does; each names the Paddle functions it replaces and why, has an ``install()`` and
lists what it relies on in Paddle (``assumptions()``):

* :mod:`.group_stores` — one gloo TCP store per process group (``collective._new_process_group_impl``,
  ``new_group``), so groups of 4+ processes can be created;
* :mod:`.tp_ops` — the tensor-parallel ops as autograd functions over all_reduce / all_gather
  (``mp_ops._c_identity``, ...) and a no-op ``broadcast_input_data``;
* :mod:`.pipeline_p2p` — pipeline p2p on plain blocking send/recv, over neighbour-pair groups when pp > 2
  (:func:`.pipeline_p2p.install_pipeline_pair_groups`, after ``fleet.init``), and ``ParallelEnv.device_id`` 0;
* :mod:`.interleave` — the interleaved pipeline (virtual stages): p2p in a ring-safe order for blocking
  send/recv, which also makes two stages correct;
* :mod:`.reduce_scatter` — an exact reduce-scatter over ``all_reduce`` (sequence parallel, stage1 V2);
* :mod:`.sharding_construction` — the scope in which sharding stage 2/3 are built
  (:func:`.sharding_construction.group_sharded_construction`) and stage1 V2's comm-buffer alignment;
* :mod:`.stage3_offload` — stage 3 offload's host<->device moves as real copies;
* :mod:`.all_to_all` — an exact all-to-all over ``all_gather`` (the sep axis's attention; MoE's dispatch), and
  PaddleNLP 3.0.0b4's sep reshard with Paddle 3's argument order.

:func:`install` applies them all once per process; only :func:`paddletrainer.parallel.topology.init_topology`
calls it, and only on a CPU-only build. :func:`check_paddle_assumptions` fails if Paddle changed what a fill
relies on, one line per broken assumption, each naming the fill's file: a Paddle upgrade fails in the unit tests
at the file that needs the edit instead of silently running unpatched code. :mod:`.paddle_checks` holds what
those checks are made of; :mod:`.blocking` what the collective fills return. Only a CPU-build maintainer needs this package; the axes in
:mod:`paddletrainer.parallel` do not depend on it on a GPU.
"""
from __future__ import annotations

import threading

from . import (all_to_all, group_stores, interleave, pipeline_p2p, reduce_scatter, sharding_construction, stage3_offload,
               tp_ops)
from .paddle_checks import broken_assumptions

__all__ = ["install", "is_installed", "check_paddle_assumptions", "FILLS"]

# Every fill module, in the order install() applies them (they patch disjoint Paddle symbols).
FILLS = (group_stores, tp_ops, pipeline_p2p, interleave, reduce_scatter, sharding_construction, stage3_offload,
         all_to_all)

_INSTALLED = False
_LOCK = threading.Lock()


def is_installed() -> bool:
    """True once :func:`install` ran in this process."""
    return _INSTALLED


def install() -> None:
    """Apply every CPU fill (idempotent). Call before ``fleet.init`` so the group stores take effect."""
    global _INSTALLED
    with _LOCK:
        if _INSTALLED:
            return
        check_paddle_assumptions()
        for fill in FILLS:
            fill.install()
        _INSTALLED = True


def _reset_for_tests() -> None:
    """Drop the group stores (for ``topology.reset_for_tests``; the patches and ``_INSTALLED`` stay: installing
    again would wrap Paddle's functions twice)."""
    group_stores._GROUP_STORES.clear()
    group_stores._PENDING_GROUP_RANKS.ranks = None


def check_paddle_assumptions() -> None:
    """Fail loudly if a Paddle symbol a fill patches (or the way Paddle calls it) changed.

    Raises ``RuntimeError`` listing every broken assumption of every fill, each line starting with the file of
    the fill that needs the edit (``paddletrainer/parallel/cpu/<fill>.py: ...``).
    """
    problems = [problem for fill in FILLS for problem in broken_assumptions(fill)]
    if problems:
        raise RuntimeError("paddletrainer's CPU backend no longer matches this Paddle version:\n  - "
                           + "\n  - ".join(problems))
