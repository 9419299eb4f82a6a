"""A store server's disconnect logging is initialised while its process is alive (tcp_store module docstring:
otherwise a peer's disconnect during this process's exit aborts it with SIGABRT)."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from paddletrainer.parallel import tcp_store
from paddletrainer.parallel.topology import reset_for_tests

REPO = Path(__file__).resolve().parents[2]

# One process hosting a store server; GLOG_v=5 makes the server print the VLOG lines whose first run needs glog's
# lock. "ALIVE" marks the point before which they must have run (the store still works after the probes).
SERVER = textwrap.dedent("""
    import socket, sys, time
    from paddle.base import core
    from paddletrainer.parallel.tcp_store import prime_disconnect_logging
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    store = core.TCPStore("127.0.0.1", port, True, 1, 30)
    if sys.argv[1] == "prime":
        assert prime_disconnect_logging("127.0.0.1", port)
    time.sleep(0.5)
    store.set("key", b"value")
    assert bytes(store.get("key")) == b"value"
    sys.stderr.write("ALIVE\\n")
    sys.stderr.flush()
""")

EOF_LINE = "Remote peer closed the connection"
RESET_LINE = "ECONNRESET"


def _server_log_before_exit(mode: str) -> str:
    proc = subprocess.run([sys.executable, "-c", SERVER, mode], cwd=str(REPO), capture_output=True, text=True,
                          errors="replace", timeout=120, env={**_env(), "GLOG_v": "5"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "ALIVE" in proc.stderr, proc.stderr[-3000:]
    return proc.stderr[:proc.stderr.index("ALIVE")]


def _env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO)
    return {k: v for k, v in env.items() if not k.startswith("PADDLE_")}


def test_priming_runs_both_disconnect_paths_of_the_server_while_the_process_is_alive():
    log = _server_log_before_exit("prime")
    assert EOF_LINE in log and RESET_LINE in log, log[-3000:]


def test_without_priming_the_first_disconnect_is_logged_only_at_exit():
    # the control: without the probes, no disconnect is logged before "ALIVE", so the first one (the store's own
    # client closing in exit, or a peer's) would take glog's lock while the process is being torn down
    log = _server_log_before_exit("none")
    assert EOF_LINE not in log and RESET_LINE not in log


def test_unreachable_store_warns_and_does_not_raise():
    reset_for_tests()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens here once the socket is closed
    with pytest.warns(UserWarning, match="could not reach the TCP store"):
        assert tcp_store.prime_disconnect_logging("127.0.0.1", port) is False


def test_only_global_rank_zero_primes_the_launcher_store(monkeypatch):
    calls = []
    monkeypatch.setattr(tcp_store, "prime_disconnect_logging", lambda host, port: calls.append((host, port)) or True)
    monkeypatch.setenv("PADDLE_MASTER", "10.0.0.7:6170")
    assert tcp_store.prime_launcher_store(1) is False and calls == []
    assert tcp_store.prime_launcher_store(0) is True and calls == [("10.0.0.7", 6170)]
    monkeypatch.delenv("PADDLE_MASTER")
    monkeypatch.setenv("PADDLE_TRAINER_ENDPOINTS", "10.0.0.8:6171,10.0.0.9:6171")
    assert tcp_store.prime_launcher_store(0) is True and calls[-1] == ("10.0.0.8", 6171)
