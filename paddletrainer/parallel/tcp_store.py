"""Paddle's TCP store servers and process exit: keep a peer's disconnect from aborting a process that is exiting.

Every multi-process run has TCP store servers: the launcher's store on global rank 0 (``PADDLE_MASTER``, on every
device) and, on a CPU-only Paddle, one store per gloo group on the group's first member
(:mod:`.cpu.group_stores`). Paddle 3.3.1's server is a libuv thread that logs each client disconnect with
glog's ``VLOG``. A ``VLOG`` statement takes glog's module lock the first time it runs, to look up its verbosity,
and reads a cached level afterwards. When the first disconnect a server sees arrives while its own process is
exiting, after glog's static state has been destroyed, taking that lock aborts the process: SIGABRT, no message,
exit code -6 for a rank that had finished its work (a core dump shows ``LibUVClient::readCallback`` →
``google::InitVLOG3__`` → ``abort``). Peers close their connections as they exit, and a server's own client
closes in its exit, so on a loaded machine a rank hosting a store died this way in about one 8-process run in
ten.

:func:`prime_disconnect_logging` makes a server take both disconnect branches once while the process is alive
— a clean close (EOF) and a reset (ECONNRESET) from a throw-away connection — so those ``VLOG`` sites are
initialised early and a disconnect during exit needs no lock. The sites are per process, so one server per
process is enough; the call is idempotent. Clients never log a disconnect and need nothing.
"""
from __future__ import annotations

import os
import socket
import struct
import warnings

__all__ = ["prime_disconnect_logging", "prime_launcher_store"]

_PRIMED = False


def prime_disconnect_logging(host: str, port: int) -> bool:
    """Open and close two connections to the store server at ``host:port`` (one closed cleanly, one reset) so its
    process has logged both kinds of disconnect before it can exit. Returns True once this process is primed.

    The connections send nothing, so the server only sees a client come and go. A server that cannot be reached
    costs a warning, never the run.
    """
    global _PRIMED
    if _PRIMED:
        return True
    try:
        with socket.create_connection((host, port), timeout=10):
            pass  # closed cleanly: the server reads EOF
        reset = socket.create_connection((host, port), timeout=10)
        # SO_LINGER on with a zero timeout makes close() send RST: the server's read fails with ECONNRESET
        reset.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        reset.close()
    except OSError as err:
        warnings.warn(f"could not reach the TCP store at {host}:{port} to prime its disconnect logging ({err}); "
                      f"this rank may abort (exit code -6) if a peer disconnects while it exits")
        return False
    _PRIMED = True
    return True


def _reset_for_tests() -> None:
    """Forget that this process primed a store (``parallel.topology.reset_for_tests`` is the one caller)."""
    global _PRIMED
    _PRIMED = False


def prime_launcher_store(rank: int) -> bool:
    """On global rank 0, prime the launcher's store (``PADDLE_MASTER``, else the first of
    ``PADDLE_TRAINER_ENDPOINTS``: where Paddle puts it); other ranks host no launcher store. Returns whether the
    call primed (or had primed) this process."""
    if rank != 0:
        return False
    endpoint = os.environ.get("PADDLE_MASTER") or os.environ.get("PADDLE_TRAINER_ENDPOINTS", "").split(",")[0]
    if ":" not in endpoint:
        return False
    host, port = endpoint.rsplit(":", 1)
    return prime_disconnect_logging(host, int(port))
