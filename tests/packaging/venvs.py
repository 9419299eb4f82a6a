"""Scratch virtualenvs for the packaging tests, made in seconds and without the network.

A fresh venv (``python -m venv --without-pip``) gets a symlink for every top-level entry of the running
interpreter's site-packages directories — the packages CI's setup installed, pip included — except the ones a
test chooses to leave out (Paddle), paddletrainer's own (editable) install and ``.pth`` files. pip in that venv
sees those packages as installed there, so ``pip install --dry-run --no-index`` resolves against them: what it
would install is exactly what is missing, with no download. Nothing is ever uninstalled from such a venv (a
symlinked package removed through pip would be removed from the real environment): the tests only install, with
``--no-deps``, and dry-run.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Callable, Iterable, List

PADDLE_ENTRIES = re.compile(r"^(paddle|paddlepaddle[-_a-z]*-[0-9][^/]*\.dist-info)$")
OWN_ENTRIES = re.compile(r"^(paddletrainer[-_.].*|__editable__.*paddletrainer.*)$")


def site_dirs() -> List[Path]:
    """The running interpreter's site-packages directories (its venv's, and any a .pth file adds), in order."""
    seen = []
    for entry in sys.path:
        path = Path(entry)
        if path.name == "site-packages" and path.is_dir() and path not in seen:
            seen.append(path)
    return seen


def make_venv(root: Path, leave_out: Callable[[str], bool]) -> Path:
    """A venv at ``root`` holding every package of :func:`site_dirs` but those whose entry ``leave_out`` names;
    returns its python."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    python = root / "bin" / "python"
    target = site_packages(python)
    for source in site_dirs():
        for entry in source.iterdir():
            # .pth files add paths or install import hooks (editable installs): a scratch venv gets none of them
            if (leave_out(entry.name) or OWN_ENTRIES.match(entry.name) or entry.suffix == ".pth"
                    or (target / entry.name).exists()):
                continue
            (target / entry.name).symlink_to(entry)
    return python


def site_packages(python: Path) -> Path:
    """The purelib directory of the venv of ``python``."""
    out = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                         check=True, capture_output=True, text=True)
    return Path(out.stdout.strip())


def add_paddle(python: Path, distribution: str) -> None:
    """Give the venv the real ``paddle`` package, installed as ``distribution`` (``paddlepaddle`` or the name of
    another build, e.g. ``paddlepaddle-gpu``): what pip sees on a machine where that build was installed."""
    target = site_packages(python)
    source = next(d for d in site_dirs() if (d / "paddle").is_dir())
    (target / "paddle").symlink_to(source / "paddle")
    real = next(source.glob("paddlepaddle-*.dist-info"))
    version = real.name[len("paddlepaddle-"):-len(".dist-info")]
    dist_info = target / f"{distribution.replace('-', '_')}-{version}.dist-info"
    if distribution == "paddlepaddle":
        dist_info.symlink_to(real)
        return
    dist_info.mkdir()
    metadata = [line for line in (real / "METADATA").read_text().splitlines() if not line.startswith("Name:")]
    (dist_info / "METADATA").write_text(f"Name: {distribution}\n" + "\n".join(metadata) + "\n")
    (dist_info / "INSTALLER").write_text("pip\n")


def pip(python: Path, *args: str, check: bool = True, cwd: Path = None) -> subprocess.CompletedProcess:
    """``python -m pip ARGS`` quietly (no version check), output captured; in ``cwd`` if given."""
    env = dict(os.environ, PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INPUT="1")
    env.pop("PYTHONPATH", None)  # the venv's own packages only, not a checkout on the path
    proc = subprocess.run([str(python), "-m", "pip", *args], capture_output=True, text=True, env=env,
                          cwd=None if cwd is None else str(cwd))
    if check and proc.returncode != 0:
        raise AssertionError(f"pip {' '.join(args)} exited {proc.returncode}\n"
                             f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc


def would_install(python: Path, wheel: Path, extras: Iterable[str] = ()) -> List[str]:
    """The ``name==version`` of every distribution ``pip install WHEEL[extras]`` would install in the venv, from
    pip's dry-run report, resolving against the installed packages only (``--no-index``: no download)."""
    spec = f"{wheel}[{','.join(extras)}]" if extras else str(wheel)
    report = pip(python, "install", "--dry-run", "--no-index", "--quiet", "--report", "-", spec).stdout
    return sorted(f"{item['metadata']['name']}=={item['metadata']['version']}"
                  for item in json.loads(report)["install"])


def run(python: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    """Run ``python ARGS`` (or a script of the venv's bin/ when ``args[0]`` names one) outside the checkout."""
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    exe = python.parent / args[0] if (python.parent / args[0]).exists() else None
    cmd = [str(exe), *args[1:]] if exe else [str(python), *args]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=str(cwd), env=env)
