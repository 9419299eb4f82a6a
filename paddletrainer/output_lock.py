"""One training run per ``output_dir``: the lock file ``output_dir/.paddletrainer.lock``.

A second run saving into the same directory would remove the first run's in-flight ``checkpoint-N.tmp-*`` save
(the first then crashes), replace its checkpoints and rotate them away. ``Trainer.train`` therefore holds this
lock while it runs, on global rank 0 — the one rank that publishes, rotates and removes stale tmp dirs, i.e.
every rename or delete a run makes in ``output_dir`` (checkpoints need a filesystem every rank sees, so one lock
per directory covers ``save_on_each_node`` too).

* **Taking it** is atomic: the holder's JSON (host, pid, the process's start time, when) is written to a
  private file first, then hard-linked to the lock name; the link fails if the name exists (``O_EXCL``
  semantics, also on NFS), so the lock never exists half-written.
* **Held by a live run** → :class:`OutputDirLockedError` naming the holder's host, pid and start, at once.
* **Stale** — written on this host by a process that no longer exists (a SIGKILL, a crash, a lost node that
  came back): taken over with a warning. "No longer exists" means no process with that pid, or one that started
  at another time (the pid was reused).
* **From another host** — never taken over: its pid cannot be checked from here, and a live remote run would
  lose its saves. The error says to delete the lock file once that run is known to be gone.
* **Released** at the end of ``train()`` (also when it raises, SIGTERM's ``TrainingInterrupted`` included) and
  at interpreter exit; only by the process that took it, and only while the file still names it.

Stdlib only (no paddle): :mod:`paddletrainer.checkpoint.files` asks :func:`live_holder` before removing stale tmp
dirs, and tools may read a lock without the training stack.
"""
from __future__ import annotations

import atexit
import contextlib
import datetime
import errno
import json
import logging
import os
import socket
import uuid
from typing import Dict, Optional

from .errors import CheckpointError

__all__ = ["LOCK_NAME", "OutputDirLock", "OutputDirLockedError", "describe", "live_holder", "lock_path"]

logger = logging.getLogger(__name__)

LOCK_NAME = ".paddletrainer.lock"
_FORMAT = "paddletrainer-output-lock"

_HELD: Dict[str, "OutputDirLock"] = {}  # lock path -> the lock this process holds (released at exit)


class OutputDirLockedError(CheckpointError):
    """Another run holds ``output_dir`` (or its lock file cannot be read); ``holder`` is its JSON or None."""

    def __init__(self, message: str, holder: Optional[dict] = None):
        super().__init__(message)
        self.holder = holder


def lock_path(output_dir: str) -> str:
    return os.path.join(os.path.abspath(output_dir), LOCK_NAME)


def _process_start(pid: int) -> Optional[str]:
    """The start time of process ``pid`` in clock ticks since boot (Linux ``/proc``), None if unknown."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    # the command name (field 2) may hold spaces and parentheses: the fields after it follow the last ")"
    fields = stat[stat.rfind(")") + 2:].split()
    return fields[19] if len(fields) > 19 else None  # field 22 of proc(5)


def _pid_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by another user
        return True
    return True


def _alive_on_this_host(holder: dict) -> bool:
    """Whether the holder (written on this host) still runs: its pid exists and started when the lock says."""
    pid = holder.get("pid")
    if not isinstance(pid, int) or pid <= 0 or not _pid_exists(pid):
        return False
    recorded, now = holder.get("process_start"), _process_start(pid)
    return recorded is None or now is None or recorded == now


def _read(path: str) -> Optional[dict]:
    """The lock's JSON; None when there is no lock. Raises OutputDirLockedError when it is not a lock of ours."""
    try:
        with open(path, "rb") as f:
            raw = f.read(65536)
    except FileNotFoundError:
        return None
    try:
        holder = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        holder = None
    if not isinstance(holder, dict) or holder.get("format") != _FORMAT:
        raise OutputDirLockedError(
            f"{path} is not a paddletrainer lock file (unreadable JSON); it was left alone: delete it if no run "
            f"is using {os.path.dirname(path)}")
    return holder


def describe(holder: dict) -> str:
    """The holder of a lock in words: host, pid, start, run id."""
    return (f"host {holder.get('host')!r}, pid {holder.get('pid')}, started {holder.get('started')}, "
            f"run {holder.get('run_id')}")


def live_holder(output_dir: str) -> Optional[dict]:
    """The holder of ``output_dir``'s lock when it is another process that may still run (a live process on this
    host, or any process on another host, which cannot be checked), else None (no lock, ours, or stale).
    An unreadable lock file counts as held (``{"unreadable": path}``): nobody can tell who wrote it."""
    path = lock_path(output_dir)
    try:
        holder = _read(path)
    except OutputDirLockedError:
        return {"unreadable": path}
    if holder is None or path in _HELD and _HELD[path].run_id == holder.get("run_id"):
        return None
    if holder.get("host") != socket.gethostname():
        return holder
    return holder if _alive_on_this_host(holder) else None


class OutputDirLock:
    """The lock of one ``output_dir`` (see the module docstring). ``acquire()`` / ``release()`` or ``with``."""

    def __init__(self, output_dir: str):
        self.output_dir = os.path.abspath(output_dir)
        self.path = lock_path(output_dir)
        self.run_id = uuid.uuid4().hex
        self._pid: Optional[int] = None  # the pid that took it (a forked child never releases it)

    def _content(self) -> bytes:
        pid = os.getpid()
        return json.dumps({
            "format": _FORMAT, "host": socket.gethostname(), "pid": pid, "process_start": _process_start(pid),
            "started": datetime.datetime.now().astimezone().isoformat(timespec="seconds"), "run_id": self.run_id,
            "output_dir": self.output_dir}, indent=1).encode()

    def _link(self) -> bool:
        """Create the lock atomically with its content; False when the name exists."""
        private = f"{self.path}.{self.run_id}.new"
        with open(private, "wb") as f:
            f.write(self._content())
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(private, self.path)
            return True
        except FileExistsError:
            return False
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(private)

    def acquire(self) -> "OutputDirLock":
        """Take the lock or raise :class:`OutputDirLockedError` naming the holder; a stale lock of this host is
        taken over with a warning."""
        os.makedirs(self.output_dir, exist_ok=True)
        for _ in range(3):  # a holder may release (or a racing run take) the lock between our steps
            if self._link():
                self._pid = os.getpid()
                _HELD[self.path] = self
                return self
            holder = _read(self.path)
            if holder is None:
                continue
            self._refuse_live(holder)
            logger.warning("taking over the stale lock of %s: %s no longer runs on this host (it ended without "
                           "releasing it, e.g. killed)", self.output_dir, describe(holder))
            self._remove_if_still(holder)
        raise OutputDirLockedError(f"could not take the lock {self.path}: other runs keep taking it")

    def _refuse_live(self, holder: dict) -> None:
        where = f"output_dir={self.output_dir!r} is in use by another training run ({describe(holder)}; lock {self.path})"
        here = socket.gethostname()
        if holder.get("host") != here:
            raise OutputDirLockedError(
                f"{where}: one run per output_dir. That host's processes cannot be checked from {here!r}: if that "
                f"run is gone, delete {self.path}; otherwise choose another output_dir", holder)
        if _alive_on_this_host(holder):
            same = " (this process: a train() is already running into it)" if holder.get("pid") == os.getpid() else ""
            raise OutputDirLockedError(
                f"{where}{same}: one run per output_dir; wait for it to end, stop it, or choose another output_dir",
                holder)

    def _remove_if_still(self, holder: dict) -> None:
        """Remove the stale lock only if it is still the one judged stale (renamed aside first, atomically)."""
        aside = f"{self.path}.{self.run_id}.stale"
        try:
            os.rename(self.path, aside)
        except FileNotFoundError:
            return
        try:
            moved = _read(aside)
        except OutputDirLockedError:
            moved = None
        if moved is not None and moved.get("run_id") != holder.get("run_id"):
            # a racing run took the lock after we read the stale one: give it back
            with contextlib.suppress(OSError):
                os.link(aside, self.path)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(aside)

    def release(self) -> None:
        """Remove the lock if this process took it and the file still names this run; idempotent."""
        if self._pid != os.getpid():
            return
        self._pid = None
        _HELD.pop(self.path, None)
        try:
            holder = _read(self.path)
        except OutputDirLockedError:
            return
        if holder is not None and holder.get("run_id") == self.run_id:
            try:
                os.unlink(self.path)
            except OSError as e:
                if e.errno != errno.ENOENT:
                    logger.warning("could not remove the lock %s: %s", self.path, e)

    def __enter__(self) -> "OutputDirLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


@atexit.register
def _release_all() -> None:
    for lock in list(_HELD.values()):
        lock.release()
