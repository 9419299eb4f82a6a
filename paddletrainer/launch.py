"""``python -m paddletrainer.launch --max_restart N <paddle.distributed.launch arguments>`` (installed as
``paddletrainer-launch``): restart a failed job.

Why this exists: Paddle 3.3.1's ``paddle.distributed.launch`` restarts a job only in its elastic mode, which needs
an etcd server (``--master etcd://host:port``; ``CollectiveElasticController``). On an ordinary launch (one node,
or ``--master ip:port``) ``--max_restart`` is parsed and ignored: when a rank dies the launcher stops the others
and exits (a SIGKILLed rank gives exit status 241), with or without ``--elastic_level 1``.

This module restarts the *whole* launch instead — what the elastic mode does too: every rank is stopped and the
job starts again. Training scripts resume by themselves when they pass ``--resume_from_checkpoint auto`` (the
newest complete checkpoint in ``output_dir``, or a fresh start when there is none; half-written
``checkpoint-N.tmp-*`` dirs of the dead attempt are ignored and deleted), losing at most the steps since the last
checkpoint. Every argument except ``--max_restart`` goes to ``paddle.distributed.launch`` unchanged.

A launch is *not* restarted when it succeeds, when it fails with a usage error (exit status 2: the same bad
option would fail again), or when this process received SIGTERM/SIGINT (forwarded to the launch, whose ranks
then save and stop; see ``docs/errors.md``). Each attempt's environment has ``PADDLETRAINER_RESTART_COUNT``
(0 for the first). Exit status: the last attempt's.

With an etcd master (``--master etcd://...``, Paddle's elastic mode: the multi-node option, see
docs/fault-tolerance.md) Paddle's launcher restarts the job itself (``--elastic_level 1 --max_restart N``), so
this module runs the launch once:
``--max_restart`` there is a usage error, since a second restart loop around Paddle's would stack on it.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from typing import List, Optional, Tuple

from .errors import ERROR_EXIT_CODE
from .runtime.paddle_requirement import require_paddle

USAGE_ERROR_EXIT_CODE = ERROR_EXIT_CODE  # argparse's status for bad options; restarting cannot fix those
RESTART_COUNT_ENV = "PADDLETRAINER_RESTART_COUNT"
_USAGE = "usage: python -m paddletrainer.launch [--max_restart N] <paddle.distributed.launch arguments> script.py ..."


def _usage_error(message: str) -> SystemExit:
    """The usage line and ``error: <message>`` on stderr, exit status 2 (as argparse); raise what it returns."""
    sys.stderr.write(f"{_USAGE}\nerror: {message}\n")
    return SystemExit(USAGE_ERROR_EXIT_CODE)


def split_max_restart(argv: List[str]) -> Tuple[int, List[str]]:
    """``(N, the other arguments)`` from ``argv``; ``--max_restart N`` / ``--max_restart=N`` before the script only."""
    rest: List[str] = []
    max_restart = 3  # paddle.distributed.launch's default
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg.endswith(".py"):  # the training script: the rest is its own
            rest.extend(argv[i:])
            break
        if arg == "--max_restart" or arg.startswith("--max_restart="):
            value = arg.split("=", 1)[1] if "=" in arg else (argv[i + 1] if i + 1 < len(argv) else "")
            i += 1 if "=" in arg else 2
            try:
                max_restart = int(value)
            except ValueError:
                raise _usage_error(f"argument --max_restart: {value!r} is not an integer") from None
            if max_restart < 0:
                raise _usage_error(f"argument --max_restart: {max_restart} is invalid: must be >= 0")
            continue
        rest.append(arg)
        i += 1
    return max_restart, rest


def _launcher_part(argv: List[str]) -> List[str]:
    """The arguments before the training script (the script's own options may reuse the launcher's names)."""
    for i, arg in enumerate(argv):
        if arg.endswith(".py"):
            return argv[:i]
    return list(argv)


def etcd_master(argv: List[str]) -> Optional[str]:
    """The ``--master`` value when it is an etcd server (Paddle's elastic mode), else None."""
    launcher = _launcher_part(argv)
    for i, arg in enumerate(launcher):
        value = arg.split("=", 1)[1] if arg.startswith("--master=") else (
            launcher[i + 1] if arg == "--master" and i + 1 < len(launcher) else None)
        if value is not None and value.startswith("etcd://"):
            return value
    return None


def check_no_stacked_restarts(argv: List[str]) -> None:
    """Refuse ``--max_restart`` with an etcd master: Paddle's elastic launcher restarts the job itself there."""
    master = etcd_master(argv)
    given = any(a == "--max_restart" or a.startswith("--max_restart=") for a in _launcher_part(argv))
    if master and given:
        raise _usage_error(
            f"--max_restart with --master {master}: Paddle's elastic launcher restarts the job itself there, and "
            f"a second restart loop would stack on it; run python -m paddle.distributed.launch --master {master} "
            f"--elastic_level 1 --max_restart N --job_id <unique> ... instead (its N allows N+1 restarts), or use "
            f"paddletrainer.launch --max_restart N without an etcd master")


class _Supervisor:
    def __init__(self, launch_args: List[str]):
        self.launch_args = launch_args
        self.proc: Optional[subprocess.Popen] = None
        self.stop_signal = 0

    def _forward(self, signum, frame) -> None:
        self.stop_signal = signum  # the user or scheduler wants the job to stop: no restart after this attempt
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signum)

    def run_once(self, attempt: int) -> int:
        env = dict(os.environ, **{RESTART_COUNT_ENV: str(attempt)})
        self.proc = subprocess.Popen([sys.executable, "-m", "paddle.distributed.launch", *self.launch_args], env=env)
        return self.proc.wait()


def main(argv: Optional[List[str]] = None) -> int:
    """Run the launch, restarting it up to ``--max_restart`` times; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    check_no_stacked_restarts(argv)
    max_restart, launch_args = split_max_restart(argv)
    if not any(a.endswith(".py") for a in launch_args):
        raise _usage_error("no training script (*.py) given")
    try:  # the launch runs `python -m paddle.distributed.launch`: say how to install Paddle before starting it
        require_paddle()
    except ImportError as exc:
        raise SystemExit(f"paddletrainer.launch: error: {exc}") from None
    if etcd_master(launch_args):
        max_restart = 0  # Paddle's elastic launcher is the one restart loop (check_no_stacked_restarts)
    sup = _Supervisor(launch_args)
    previous = {s: signal.signal(s, sup._forward) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        code = 1
        for attempt in range(max_restart + 1):
            code = sup.run_once(attempt)
            if code == 0 or code == USAGE_ERROR_EXIT_CODE or sup.stop_signal:
                return code
            if attempt < max_restart:
                sys.stderr.write(f"paddletrainer.launch: attempt {attempt + 1} of {max_restart + 1} failed with exit "
                                 f"status {code}; restarting the job (it resumes from the newest complete "
                                 f"checkpoint when the script passes --resume_from_checkpoint auto)\n")
                sys.stderr.flush()
                time.sleep(1)  # let the dead attempt's ports and files be released
        sys.stderr.write(f"paddletrainer.launch: giving up after {max_restart + 1} attempts (exit status {code})\n")
        return code
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


if __name__ == "__main__":
    sys.exit(main())
