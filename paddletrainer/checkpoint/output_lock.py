"""One training run per ``output_dir``: the lock file ``output_dir/.paddletrainer.lock``.

A second run saving into the same directory would remove the first run's in-flight ``checkpoint-N.tmp-*`` save
(the first then crashes), replace its checkpoints and rotate them away. ``Trainer.train`` therefore holds this
lock while it runs, on global rank 0 — the one rank that publishes, rotates and removes stale tmp dirs, i.e.
every rename or delete a run makes in ``output_dir`` (checkpoints need a filesystem every rank sees, so one lock
per directory covers ``save_on_each_node`` too).

* **Taking it** is atomic: the holder's JSON (host, pid, the process's start time, when) is written to a
  private file first, then hard-linked to the lock name; the link fails if the name exists (``O_EXCL``
  semantics, also on NFS), so the lock never exists half-written. On a filesystem without hard links it is
  created with ``O_CREAT | O_EXCL`` instead.
* **Held by a live run** → :class:`OutputDirLockedError` naming the holder's host, pid and start, at once.
* **Stale** — written on this host by a process that no longer exists (a SIGKILL, a crash, a lost node that
  came back): taken over with a warning. "No longer exists" means no process with that pid, or one that started
  at another time (the pid was reused).
* **From another host** — its pid cannot be checked from here, so the holder renews the lock file's mtime every
  :data:`HEARTBEAT_SECONDS` (a daemon thread) and the lock is stale only when it has not been renewed for
  :data:`STALE_AFTER_SECONDS`, measured on the filesystem's clock (the mtime of a file written just now), so
  the hosts' clocks need not agree. Until then the error names the holder and the heartbeat's age.
* **Of this job** — the holder recorded the same Paddle launch job id (:func:`job_id`: ``PADDLE_JOB_ID`` or the
  launcher's ``--job_id``, never Paddle's ``default``): an elastic restart whose rank 0 now runs on another host
  (the old one is lost or was restarted with its pod). Taken over at once, with a warning naming the old holder;
  a run of another job is still refused at once. Hence the guide's "give each job its own ``--job_id``"
  (docs/fault-tolerance.md).
* **Lost** — the heartbeat finds the lock file naming another run (taken over as above, or by hand): it logs an
  error, stops renewing, and the next save refuses (:func:`check_still_held`, which the save runs on rank 0
  before its first gather, so every rank raises alike) instead of writing into a directory another run owns.
* **Released** at the end of ``train()`` (also when it raises, SIGTERM's ``TrainingInterrupted`` included) and
  at interpreter exit; only by the process that took it, and only while the file still names it.

Stdlib only (no paddle): :mod:`paddletrainer.checkpoint.discovery` asks :func:`live_holder` before removing stale tmp
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
import stat
import threading
import uuid
from typing import Dict, Optional, Tuple

from ..errors import CheckpointError

__all__ = ["LOCK_NAME", "OutputDirLock", "OutputDirLockedError", "check_still_held", "describe", "job_id",
           "live_holder", "lock_path"]

logger = logging.getLogger(__name__)

LOCK_NAME = ".paddletrainer.lock"
HEARTBEAT_SECONDS = 30  # the holder renews the lock's mtime this often
STALE_AFTER_SECONDS = 300  # another host's lock not renewed for this long is stale (10 missed heartbeats)
_FORMAT = "paddletrainer-output-lock"

_HELD: Dict[str, "OutputDirLock"] = {}  # lock path -> the lock this process holds (released at exit)


class OutputDirLockedError(CheckpointError):
    """Another run holds ``output_dir`` (or its lock file cannot be read); ``holder`` is its JSON or None."""

    def __init__(self, message: str, holder: Optional[dict] = None):
        super().__init__(message)
        self.holder = holder


def lock_path(output_dir: str) -> str:
    return os.path.join(os.path.abspath(output_dir), LOCK_NAME)


def job_id() -> Optional[str]:
    """The id of the ``paddle.distributed.launch`` job this process is a worker of, the same on every node and
    every elastic restart; None outside a launch or with Paddle's ``default`` id (shared by every job without
    one). Paddle 3.3.1 exports no job id to its workers: the launcher takes it from ``PADDLE_JOB_ID`` (which
    workers inherit, and which wins over the option) or from its own ``--job_id``, read here from the
    launcher's (the parent's) command line."""
    value = os.environ.get("PADDLE_JOB_ID") or _launcher_job_id(os.getppid())
    return None if not value or value == "default" else value


def _launcher_job_id(pid: int) -> Optional[str]:
    """``--job_id`` of ``python -m paddle.distributed.launch`` (or ``fleetrun``) running as ``pid``, else None."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().decode("utf-8", "replace").split("\0")
    except OSError:
        return None
    launch = next((i for i, a in enumerate(argv) if a == "paddle.distributed.launch" or a.endswith("fleetrun")
                   or a.endswith(os.path.join("paddle", "distributed", "launch", "main.py"))), None)
    if launch is None:
        return None
    for i, arg in enumerate(argv[launch + 1:], launch + 1):
        if arg.endswith(".py"):  # the training script: what follows is its own
            return None
        if arg == "--job_id" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--job_id="):
            return arg.split("=", 1)[1]
    return None


def _proc_stat(pid: int) -> Optional[list]:
    """The fields of ``/proc/<pid>/stat`` from the state on (field 3 of proc(5) is index 0); None without one."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    # the command name (field 2) may hold spaces and parentheses: the fields after it follow the last ")"
    return stat[stat.rfind(")") + 2:].split()


def _process_start(pid: int) -> Optional[str]:
    """The start time of process ``pid`` in clock ticks since boot (Linux ``/proc``), None if unknown."""
    fields = _proc_stat(pid)
    return fields[19] if fields and len(fields) > 19 else None  # field 22 of proc(5)


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
    fields = _proc_stat(pid)
    if fields and fields[0] in ("Z", "X"):  # killed, not yet reaped by its parent: it holds nothing any more
        return False
    recorded, now = holder.get("process_start"), _process_start(pid)
    return recorded is None or now is None or recorded == now


MAX_PID = 2**22  # Linux's largest pid_max: a lock naming a larger pid was not written by a process


def _not_ours(path: str, what: str) -> OutputDirLockedError:
    return OutputDirLockedError(f"{path} is not a paddletrainer lock file ({what}); it was left alone: delete it if "
                                f"no run is using {os.path.dirname(path)}")


def _read(path: str) -> Optional[dict]:
    """The lock's JSON; None when there is no lock. Raises OutputDirLockedError naming the file (and the field)
    when it is not a lock of ours: a directory, FIFO, device or symlink (dangling or not) is refused at once,
    never opened for reading (a FIFO would block)."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(mode):
        raise _not_ours(path, f"a symlink to {os.readlink(path)!r}")
    if not stat.S_ISREG(mode):
        raise _not_ours(path, "a directory" if stat.S_ISDIR(mode) else "not a regular file")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))
    except FileNotFoundError:  # released meanwhile
        return None
    except OSError as e:
        raise _not_ours(path, f"unreadable: {e.strerror}") from None
    with os.fdopen(fd, "rb") as f:
        raw = f.read(65536)
    try:
        holder = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        holder = None
    if not isinstance(holder, dict) or holder.get("format") != _FORMAT:
        raise _not_ours(path, "not the JSON paddletrainer writes")
    for field, valid in (("host", lambda v: isinstance(v, str)), ("run_id", lambda v: isinstance(v, str)),
                         ("pid", lambda v: type(v) is int and 0 < v <= MAX_PID)):
        if not valid(holder.get(field)):
            raise _not_ours(path, f"field {field}={json.dumps(holder.get(field))[:40]}, which no run writes")
    return holder


def describe(holder: dict) -> str:
    """The holder of a lock in words: host, pid, start, run id (and launch job id when it has one)."""
    job = f", job_id {holder['job_id']!r}" if holder.get("job_id") else ""
    return (f"host {holder.get('host')!r}, pid {holder.get('pid')}, started {holder.get('started')}, "
            f"run {holder.get('run_id')}{job}")


def live_holder(output_dir: str) -> Optional[dict]:
    """The holder of ``output_dir``'s lock when it is another process that may still run (a live process on this
    host, or any process on another host, whose pid cannot be checked), else None (no lock, ours, or stale).
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
        self._stop = threading.Event()  # ends the heartbeat
        self.job_id = job_id()
        self.lost_to: Optional[dict] = None  # set by the heartbeat: the lock file names another run now
        self._mutex = threading.Lock()  # a heartbeat never re-creates the lock while release() removes it

    def _content(self) -> bytes:
        pid = os.getpid()
        return json.dumps({
            "format": _FORMAT, "host": socket.gethostname(), "pid": pid, "process_start": _process_start(pid),
            "started": datetime.datetime.now().astimezone().isoformat(timespec="seconds"), "run_id": self.run_id,
            "job_id": self.job_id, "output_dir": self.output_dir}, indent=1).encode()

    def _link(self) -> Tuple[bool, float]:
        """Create the lock atomically with its content: (True, now) or (False, now) when the name exists; ``now``
        is the filesystem's clock (a fresh file's mtime), against which another host's heartbeat is aged."""
        private = f"{self.path}.{self.run_id}.new"
        with open(private, "wb") as f:
            f.write(self._content())
            f.flush()
            os.fsync(f.fileno())
        try:
            now = os.stat(private).st_mtime
            os.link(private, self.path)
            return True, now
        except FileExistsError:
            return False, now
        except OSError as e:  # a filesystem without hard links (some FUSE/SMB mounts): O_EXCL, then the content
            if e.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOSYS):
                raise
            return self._create_exclusive(), now
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(private)

    def _create_exclusive(self) -> bool:
        """``O_CREAT | O_EXCL``: atomic too, but the file is empty for an instant (a run reading it then is refused
        as by an unreadable lock: it fails safe)."""
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, "wb") as f:
            f.write(self._content())
            f.flush()
            os.fsync(f.fileno())
        return True

    def acquire(self) -> "OutputDirLock":
        """Take the lock or raise :class:`OutputDirLockedError` naming the holder; a stale lock is taken over
        with a warning (see the module docstring)."""
        try:
            os.makedirs(self.output_dir, exist_ok=True)
        except OSError as e:
            raise CheckpointError(f"output_dir={self.output_dir!r} cannot be created ({e.strerror or e}): choose a "
                                  "directory this process may write") from None
        for _ in range(3):  # a holder may release (or a racing run take) the lock between our steps
            try:
                taken, now = self._link()
            except OSError as e:
                raise CheckpointError(f"output_dir={self.output_dir!r} is not writable: writing its lock file failed "
                                      f"({e.strerror or e}); choose a directory this process may write") from None
            if taken:
                self._pid = os.getpid()
                _HELD[self.path] = self
                self._start_heartbeat()
                return self
            holder = _read(self.path)
            if holder is None:
                continue
            why = self._stale_or_raise(holder, now)
            logger.warning("taking over the stale lock of %s: %s %s", self.output_dir, describe(holder), why)
            self._remove_if_still(holder)
        raise OutputDirLockedError(f"could not take the lock {self.path}: other runs keep taking it")

    def _stale_or_raise(self, holder: dict, now: float) -> str:
        """Why ``holder``'s lock is stale, or raise :class:`OutputDirLockedError` naming it."""
        where = (f"output_dir={self.output_dir!r} is in use by another training run ({describe(holder)}; "
                 f"lock {self.path})")
        here = socket.gethostname()
        if holder.get("host") != here and self.job_id is not None and holder.get("job_id") == self.job_id:
            return (f"is of this launch job (job_id {self.job_id!r}), whose rank 0 now runs on {here!r}: an elastic "
                    f"restart after its host was lost")
        if holder.get("host") != here:
            try:
                age = now - os.stat(self.path).st_mtime
            except FileNotFoundError:
                return "released it meanwhile"
            if age > STALE_AFTER_SECONDS:
                return f"has not renewed it for {age:.0f} s (its host {holder.get('host')!r} is down or it was killed)"
            if -age > STALE_AFTER_SECONDS:  # a heartbeat sets the filesystem's "now": no live holder writes this
                return (f"has a heartbeat {-age:.0f} s in the future, which no renewal writes (a clock set wrong when "
                        "it was written, or a file set by hand)")
            raise OutputDirLockedError(
                f"{where}: one run per output_dir. Its last heartbeat was {max(age, 0):.0f} s ago (renewed every "
                f"{HEARTBEAT_SECONDS} s while it runs; taken over once older than {STALE_AFTER_SECONDS} s): wait for "
                f"it to end, or delete {self.path} if that run is gone; otherwise choose another output_dir (a restart "
                f"of the same launch job takes it over at once: launch with --job_id)", holder)
        if _alive_on_this_host(holder):
            same = " (this process: a train() is already running into it)" if holder.get("pid") == os.getpid() else ""
            raise OutputDirLockedError(
                f"{where}{same}: one run per output_dir; wait for it to end, stop it, or choose another output_dir",
                holder)
        return "no longer runs on this host (it ended without releasing it, e.g. killed)"

    def _start_heartbeat(self) -> None:
        """Renew the lock's mtime every HEARTBEAT_SECONDS while held, so that a run on another host can tell a
        live holder from a dead one (a daemon thread; a forked child has none)."""
        self._stop = threading.Event()

        def beat(stop=self._stop):
            while not stop.wait(HEARTBEAT_SECONDS) and self._renew():
                pass

        threading.Thread(target=beat, name="paddletrainer-output-lock", daemon=True).start()

    def _renew(self) -> bool:
        """One heartbeat: renew the lock's mtime; False once released or (:meth:`_lose`) it names another run."""
        with self._mutex:
            return self._pid is not None and self._renew_held()

    def _renew_held(self) -> bool:
        try:
            holder = _read(self.path)
            if holder is None and self._link()[0]:  # removed by hand: nobody else holds it, so take it again
                logger.warning("the lock %s was removed while this run holds it: taken again", self.path)
                return True
            holder = holder or _read(self.path)
        except OutputDirLockedError:
            holder = {"unreadable": self.path}
        except OSError as e:
            logger.warning("could not renew the lock %s: %s", self.path, e)
            return True
        if holder is None:  # removed again meanwhile: look at the next beat
            return True
        if holder.get("run_id") != self.run_id:  # never touch another run's lock
            self._lose(holder)
            return False
        try:
            os.utime(self.path)
        except OSError as e:
            logger.warning("could not renew the lock %s: %s", self.path, e)
        return True

    def _lose(self, holder: dict) -> None:
        self.lost_to = holder
        logger.error("LOST the lock of output_dir=%r: %s now names %s; this run saves no more checkpoints there (its "
                     "next save fails)", self.output_dir, self.path, _describe_any(holder))

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
        with self._mutex:
            self._pid = None
            self._stop.set()
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


def _describe_any(holder: dict) -> str:
    return "an unreadable lock file" if "unreadable" in holder else f"another run ({describe(holder)})"


def check_still_held(output_dir: str) -> None:
    """Raise :class:`~.errors.CheckpointError` naming the new holder when this process took ``output_dir``'s lock
    and another run holds it now (taken over, see the module docstring); a no-op for a directory this process
    holds no lock of (a save outside ``train()``). Rank 0 calls it before a save's first gather."""
    lock = _HELD.get(lock_path(output_dir))
    if lock is None or lock._pid != os.getpid():
        return
    if lock.lost_to is None:  # the heartbeat may not have looked yet: look now (one small read)
        try:
            holder = _read(lock.path) or {"run_id": lock.run_id}  # removed by hand: the heartbeat takes it again
        except OutputDirLockedError:
            holder = {"unreadable": lock.path}
        if holder.get("run_id") != lock.run_id:
            lock._lose(holder)
    if lock.lost_to is not None:
        raise CheckpointError(
            f"output_dir={lock.output_dir!r} is no longer this run's: its lock {lock.path} now names "
            f"{_describe_any(lock.lost_to)}, which took it over; not saving into a directory another run owns "
            f"(this run went on after losing its lock, e.g. its host was cut off while the job restarted elsewhere)")


@atexit.register
def _release_all() -> None:
    for lock in list(_HELD.values()):
        lock.release()
