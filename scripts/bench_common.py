"""Shared helpers for the benchmark scripts: timing, medians, tables, machine info, docs/benchmarks.md.

Every benchmark prints plain-text tables (``print_table``) and, with ``--markdown``, replaces its own
section of ``docs/benchmarks.md`` (``update_markdown_section``): a section runs from its ``## <title>``
heading to the next ``## `` heading, so scripts can be re-run in any order without touching each other.
"""
from __future__ import annotations

import datetime
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Dict, Iterable, List, Optional, Sequence

REPO = Path(__file__).resolve().parents[1]
BENCH_MD = REPO / "docs" / "benchmarks.md"
LOCK = "/tmp/paddletrainer-mp.lock"
PYTHON = sys.executable

__all__ = [
    "REPO", "BENCH_MD", "LOCK", "PYTHON", "median", "timeit", "Stopwatch", "machine_info", "machine_line",
    "format_table", "print_table", "markdown_table", "update_markdown_section", "launch", "fmt_bytes",
    "peak_rss_reset", "peak_rss_bytes", "met",
]


def median(values: Iterable[float]) -> float:
    values = list(values)
    return statistics.median(values) if values else float("nan")


def timeit(fn: Callable[[], object], repeat: int = 3) -> List[float]:
    """Wall seconds of ``repeat`` calls of ``fn``."""
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


class Stopwatch:
    """``with Stopwatch() as sw: ...`` then ``sw.seconds``."""

    def __enter__(self):
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.seconds = time.perf_counter() - self._t0
        return False


def fmt_bytes(n: float) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{int(n)} B"


def met(ok: Optional[bool]) -> str:
    return "n/a" if ok is None else ("MET" if ok else "NOT MET")


# ------------------------------------------------------------------------------------ peak RSS
def peak_rss_reset() -> bool:
    """Reset this process's resident-set high-water mark (Linux ``clear_refs`` 5); False if unsupported."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def peak_rss_bytes() -> int:
    """VmHWM (peak RSS since start or the last :func:`peak_rss_reset`); ru_maxrss elsewhere."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


# ------------------------------------------------------------------------------------ machine
def _mem_total_gib() -> float:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return float("nan")


def _version(mod: str) -> str:
    try:
        from importlib.metadata import version

        return version({"paddle": "paddlepaddle"}.get(mod, mod))
    except Exception:
        return "?"


def machine_info() -> Dict[str, str]:
    cpu = platform.processor() or "?"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "nproc": str(os.cpu_count()),
        "ram": f"{_mem_total_gib():.0f} GiB",
        "cpu": cpu,
        "python": platform.python_version(),
        "paddle": _version("paddle"),
        "paddlenlp": _version("paddlenlp"),
        "load": " ".join(f"{x:.1f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "?",
    }


def machine_line() -> str:
    m = machine_info()
    return (f"{m['date']}; {m['nproc']} CPUs ({m['cpu']}), {m['ram']} RAM, load {m['load']}; "
            f"python {m['python']}, paddle {m['paddle']}, paddlenlp {m['paddlenlp']}")


# ------------------------------------------------------------------------------------ tables
def _cell(v) -> str:
    if isinstance(v, float):
        if v != v:
            return "-"
        if abs(v) >= 1000:
            return f"{v:,.0f}"
        if abs(v) >= 10:
            return f"{v:.1f}"
        return f"{v:.3f}"
    return str(v)


def format_table(headers: Sequence[str], rows: Sequence[Sequence]) -> str:
    cells = [[_cell(v) for v in row] for row in rows]
    widths = [max(len(str(h)), *(len(r[i]) for r in cells)) if cells else len(str(h)) for i, h in enumerate(headers)]
    line = "  ".join(str(h).ljust(w) for h, w in zip(headers, widths))
    sep = "  ".join("-" * w for w in widths)
    body = ["  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in cells]
    return "\n".join([line, sep, *body])


def print_table(title: str, headers: Sequence[str], rows: Sequence[Sequence]) -> None:
    print(f"\n== {title} ==")
    print(format_table(headers, rows))
    sys.stdout.flush()


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence]) -> str:
    out = ["| " + " | ".join(map(str, headers)) + " |", "|" + "---|" * len(headers)]
    out += ["| " + " | ".join(_cell(v) for v in row) + " |" for row in rows]
    return "\n".join(out)


_HEADER = """# Benchmarks

Generated by `scripts/bench_*.py --markdown` (each script replaces its own section). Timings on a shared
CPU machine are noisy: every number is a median of repetitions, and each section records the machine,
the versions and the load average at the time it ran.
"""


def update_markdown_section(title: str, body: str, path: Path = BENCH_MD) -> None:
    """Replace (or append) the ``## <title>`` section of ``docs/benchmarks.md`` with ``body``."""
    path = Path(path)
    text = path.read_text() if path.exists() else _HEADER
    section = f"## {title}\n\n{body.strip()}\n\n"
    pattern = re.compile(rf"^## {re.escape(title)}\n.*?(?=^## |\Z)", re.S | re.M)
    if pattern.search(text):
        text = pattern.sub(lambda _: section, text, count=1)
    else:
        text = text.rstrip() + "\n\n" + section
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text.rstrip() + "\n")
    print(f"updated section '{title}' of {path}")


# ------------------------------------------------------------------------------------ launch
def launch(script: str, nproc: int, script_args: Sequence[str], log_dir: str, timeout: int = 600,
           env_extra: Optional[Dict[str, str]] = None) -> subprocess.CompletedProcess:
    """``flock LOCK timeout T python -m paddle.distributed.launch --nproc_per_node N --log_dir D script args``.

    One multi-process run on the machine at a time (the lock). Raises with the workers' log tails on failure.
    """
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH", "")]))
    for key in [k for k in env if k.startswith("PADDLE_")]:
        del env[key]
    env.setdefault("GLOG_v", "0")
    env.update(env_extra or {})
    cmd = ["flock", LOCK, "timeout", str(timeout), PYTHON, "-m", "paddle.distributed.launch",
           "--nproc_per_node", str(nproc), "--log_dir", str(log_dir), str(script), *map(str, script_args)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        tails = []
        for log in sorted(Path(log_dir).glob("workerlog.*")):
            lines = [t for t in log.read_text(errors="replace").splitlines() if " INFO " not in t]
            tails.append(f"--- {log.name} ---\n" + "\n".join(lines[-30:]))
        raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}\n" + "\n".join(tails)
                           + f"\n--- launcher ---\n{proc.stdout[-1500:]}{proc.stderr[-1500:]}")
    return proc
