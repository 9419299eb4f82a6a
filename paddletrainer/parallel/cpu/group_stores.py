"""One gloo TCP store per process group, so groups of 4+ processes can be created on Paddle's CPU build.

Paddle creates every gloo group through the ONE default (launcher) store, and the rendezvous keys of different
groups overwrite each other: with 4+ processes group creation fails at random ("Connection refused",
"TIMEOUT self_rank", "address.cc:30 ... 136 vs 45"). This fill gives each group a private store, hosted by the
group's first member, so the keys are disjoint. It replaces ``collective._new_process_group_impl`` (the
process-group factory) and wraps ``new_group`` (which alone knows the group's global ranks). Each store server
primes its disconnect logging (:mod:`paddletrainer.parallel.tcp_store`).
"""
from __future__ import annotations

import os
import socket
import threading

import paddle.distributed as dist
from paddle.base import core
from paddle.distributed import collective
from paddle.distributed.fleet.meta_parallel.sharding import group_sharded_optimizer_stage2 as gso2

from ..tcp_store import prime_disconnect_logging
from .paddle_checks import Assumption, paddle_source, params_of

__all__ = ["install", "assumptions", "store_port_for_group", "STORE_BASE_PORT_ENV"]

# Keeps every per-group TCPStore alive for the life of the process (gloo reads from it lazily).
_GROUP_STORES: dict = {}
# The global ranks of the group being created; set by our ``new_group`` wrapper, read by the
# process-group factory (Paddle passes only the in-group rank and size down to the factory).
_PENDING_GROUP_RANKS = threading.local()

# Environment variable: fixed ports for the per-group stores (see store_port_for_group).
STORE_BASE_PORT_ENV = "PADDLETRAINER_GLOO_STORE_BASE_PORT"


def store_port_for_group(group_id: int) -> int | None:
    """The fixed TCP port of group ``group_id``'s store, or None to let its master pick a free port.

    Fixed ports are used only when ``PADDLETRAINER_GLOO_STORE_BASE_PORT`` is set (port = base + group id,
    e.g. base 50000 puts group 11 on 50011): for clusters where only a known port range is open.
    Otherwise a fixed scheme is fragile: a port derived from the launcher's (which sit in the kernel's
    ephemeral range) was observed taken by an outgoing connection in a 16-process run, and the store's
    bind failure aborts the process.
    """
    override = os.environ.get(STORE_BASE_PORT_ENV)
    return int(override) + group_id if override else None


def _free_port() -> int:
    """A port that is free right now on this host (the OS picks it; the store binds it right after)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        return sock.getsockname()[1]


def _group_store(global_ranks, group_rank: int, group_size: int, group_id: int):
    """Create the store of one group; its master is the group's first member.

    The master picks the port and publishes ``host:port`` under a per-group key in the launcher's default
    store *before* it starts the server (TCPStore's master constructor returns only once every member has
    connected, so publishing afterwards would deadlock); members read the key (``get`` blocks until it is
    set) and connect, retrying until the server listens.
    """
    key = f"paddletrainer/gloo_group_store/{group_id}"
    default_store = collective._default_store
    if default_store is None:
        raise RuntimeError("gloo subgroups need the default store: call init_topology (fleet.init) first")
    port = store_port_for_group(group_id)
    if group_rank == 0:
        endpoints = os.environ.get("PADDLE_TRAINER_ENDPOINTS", "").split(",")
        first = global_ranks[0] if global_ranks else 0
        mine = endpoints[first] if first < len(endpoints) and endpoints[first] else "127.0.0.1:0"
        host = mine.rsplit(":", 1)[0]
        port = _free_port() if port is None else port
        default_store.set(key, f"{host}:{port}")
        store = core.TCPStore(host, port, True, group_size, 900)
        prime_disconnect_logging(host, port)  # this process now hosts a store server: see tcp_store
    else:
        address = bytes(default_store.get(key)).decode()
        host, port = address.rsplit(":", 1)
        store = core.TCPStore(host, int(port), False, group_size, 900)
    _GROUP_STORES[group_id] = store
    return store


def _make_new_process_group_impl(original):
    def _new_process_group_impl(backend, store, rank, world_size, group_name, pg_options, group_id=0, *args, **kwargs):
        # Replaces collective._new_process_group_impl for gloo subgroups (the default group, id 0, keeps the
        # launcher's store): a private store per group makes the rendezvous keys disjoint.
        if backend == "gloo" and group_id != 0:
            ranks = getattr(_PENDING_GROUP_RANKS, "ranks", None)
            store = _group_store(ranks, rank, world_size, group_id)
        return original(backend, store, rank, world_size, group_name, pg_options, group_id, *args, **kwargs)

    _new_process_group_impl.__wrapped_paddle__ = original
    return _new_process_group_impl


def _make_new_group(original):
    def new_group(ranks=None, *args, **kwargs):
        # Records the global ranks so the store's master host is that of the group's first member.
        _PENDING_GROUP_RANKS.ranks = sorted(ranks) if ranks is not None else None
        try:
            return original(ranks, *args, **kwargs)
        finally:
            _PENDING_GROUP_RANKS.ranks = None

    new_group.__wrapped_paddle__ = original
    new_group.__doc__ = original.__doc__
    return new_group


def install() -> None:
    """Put the per-group store in place (called once by :func:`paddletrainer.parallel.cpu.install`)."""
    collective._new_process_group_impl = _make_new_process_group_impl(collective._new_process_group_impl)
    wrapped = _make_new_group(collective.new_group)
    # new_group is reached as paddle.distributed.new_group (fleet topology), collective.new_group
    # (stage 3) and a by-name import in the stage-2 optimizer: patch all three references.
    collective.new_group = wrapped
    dist.new_group = wrapped
    gso2.new_group = wrapped


def assumptions() -> list:
    """What this fill relies on in Paddle (checked by :func:`paddletrainer.parallel.cpu.check_paddle_assumptions`)."""
    return [
        Assumption(lambda: params_of(collective._new_process_group_impl)[:7]
                   == ["backend", "store", "rank", "world_size", "group_name", "pg_options", "group_id"],
                   "collective._new_process_group_impl(backend, store, rank, world_size, group_name, pg_options, "
                   "group_id, ...) signature changed"),
        Assumption(lambda: "_new_process_group_impl(" in paddle_source(collective.new_group),
                   "collective.new_group no longer creates its process group via _new_process_group_impl"),
        Assumption(lambda: params_of(collective.new_group)[:1] == ["ranks"],
                   "collective.new_group(ranks, ...) changed"),
        Assumption(lambda: hasattr(gso2, "new_group"), "group_sharded_optimizer_stage2 no longer imports new_group"),
        Assumption(lambda: hasattr(core, "TCPStore") and hasattr(core, "ProcessGroupGloo"),
                   "core.TCPStore / ProcessGroupGloo gone"),
        Assumption(lambda: hasattr(collective, "_default_store"), "collective._default_store (the launcher's) is gone"),
    ]
