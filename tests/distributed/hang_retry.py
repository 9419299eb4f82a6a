"""One retry for launches that *hung*, shared by the distributed test launchers.

On this 2-core CI machine a gloo launch very occasionally stalls right after creating its groups (seen
twice in a day of runs, each time passing on rerun; the stacks are being collected to find the cause).
A hang is recognised only by its signature — the launcher's ``timeout`` exit code (124) or the workers'
faulthandler dump ("Timeout (h:mm:ss)!") — and retried once; assertion failures and crashes are never
retried. The first attempt's dumped stacks are printed, so a hang is never silent.
"""
from __future__ import annotations

import sys
from pathlib import Path

TIMEOUT_EXIT = 124


def hung(returncode: int, log_dir) -> bool:
    """True when a launch ended by timing out rather than by failing."""
    if returncode == TIMEOUT_EXIT:
        return True
    for log in Path(log_dir).glob("workerlog.*"):
        if "Timeout (" in log.read_text(errors="replace"):
            return True
    return False


def report_hang(description: str, log_dir) -> None:
    """Print the hung attempt's stack dumps (they land in the pytest output) before the retry."""
    print(f"\n[hang-retry] {description} hung; retrying once. Stacks of the hung attempt:", file=sys.stderr)
    for log in sorted(Path(log_dir).glob("workerlog.*")):
        text = log.read_text(errors="replace")
        start = text.find("Timeout (")
        if start >= 0:
            print(f"--- {log.name}\n{text[start:start + 4000]}", file=sys.stderr)
