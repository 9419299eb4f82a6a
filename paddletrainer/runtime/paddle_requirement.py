"""Which Paddle paddletrainer is tested with, and the one-line message when ``import paddle`` cannot give it.

paddletrainer's package metadata requires no Paddle distribution: ``paddlepaddle`` (CPU) and
``paddlepaddle-gpu`` (CUDA) install the same ``paddle/`` package, so requiring either would make pip lay the
CPU build over a GPU one (or the reverse). The check moves to run time instead: ``import paddletrainer``
puts :class:`PaddleGuard` first on ``sys.meta_path``, and the first ``import paddle`` after that (the
library's own, e.g. when ``from paddletrainer import Trainer`` imports ``paddletrainer.trainer``) ends, when
Paddle is missing or its version is outside :data:`TESTED`, with an ``ImportError`` whose one line names the
CPU and the CUDA install commands. The guard only looks: it finds Paddle with the other finders and reads its
version file without executing it, and an import it does not refuse goes on unchanged. ``import paddletrainer``
and the modules that do not import paddle (``paddletrainer.training_args``, ...) work without Paddle.

A Paddle imported before paddletrainer is checked at ``import paddletrainer`` (there is no later import to
watch). ``PADDLETRAINER_SKIP_PADDLE_VERSION_CHECK=1`` accepts an untested version (a nightly build, a newer
release) on purpose; a missing Paddle is always an error.
"""
from __future__ import annotations

import importlib.abc
import importlib.util
import os
import re
import sys
from typing import Optional, Tuple

__all__ = ["TESTED", "PADDLE_PIN", "GPU_INDEX", "SKIP_ENV", "PaddleGuard", "install", "install_hint", "check_version",
           "require_paddle"]

PADDLE_PIN = "3.3.1"  # the build CI tests, and the one the `cpu` extra installs
# versions v with TESTED[0] <= v < TESTED[1]: exactly the version paddle_contract's source digests were recorded
# on (a later patch release may change a digested function; widen this only with the digests re-checked on it)
TESTED = ((3, 3, 1), (3, 3, 2))
SKIP_ENV = "PADDLETRAINER_SKIP_PADDLE_VERSION_CHECK"


# Paddle's own package index (CUDA 12.6 build): Paddle 3.x GPU wheels are only there, not on the public index
GPU_INDEX = "https://www.paddlepaddle.org.cn/packages/stable/cu126/"


def install_hint() -> str:
    """The two install commands, CPU build first (the message's last words)."""
    return (f"pip install paddlepaddle=={PADDLE_PIN} (CPU) or "
            f"pip install paddlepaddle-gpu=={PADDLE_PIN} -i {GPU_INDEX} "
            "(CUDA 12.6; cu118, cu129 or cu130 in place of cu126 for CUDA 11.8, 12.9 or 13.0)")


def _missing_message() -> str:
    return f"paddletrainer needs PaddlePaddle, which is not installed in {sys.prefix}: {install_hint()}"


def _version_message(version: str) -> str:
    low, high = (".".join(map(str, bound)) for bound in TESTED)
    return (f"paddletrainer is tested with PaddlePaddle >={low},<{high} and found {version} (set {SKIP_ENV}=1 to "
            f"use it anyway): {install_hint()}")


def _parse(version: str) -> Optional[Tuple[int, int, int]]:
    match = re.match(r"(\d+)\.(\d+)\.(\d+)", version)
    return tuple(int(part) for part in match.groups()) if match else None


def check_version(version: str) -> None:
    """Raise ``ImportError`` (the one-line message) unless ``version`` is in :data:`TESTED` or the check is off."""
    parsed = _parse(version)
    if os.environ.get(SKIP_ENV) == "1" or (parsed is not None and TESTED[0] <= parsed < TESTED[1]):
        return
    raise ImportError(_version_message(version), name="paddle")


def _spec_version(spec) -> str:
    """``paddle/version/__init__.py``'s ``full_version`` (written by Paddle's setup.py), read, not executed."""
    for location in spec.submodule_search_locations or ():
        path = os.path.join(location, "version", "__init__.py")
        try:
            with open(path, encoding="utf-8") as f:
                match = re.search(r"""^full_version\s*=\s*['"]([^'"]+)['"]""", f.read(), re.MULTILINE)
        except OSError:
            continue
        if match:
            return match.group(1)
    return "a Paddle without a version file"


class PaddleGuard(importlib.abc.MetaPathFinder):
    """First on ``sys.meta_path``: refuses ``import paddle`` when Paddle is missing or untested, else steps aside."""

    def find_spec(self, fullname, path=None, target=None):
        """``None`` for every module but ``paddle``; for ``paddle``, the other finders' spec once it is checked."""
        if fullname != "paddle":
            return None
        spec = None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec = find(fullname, path, target)
            if spec is not None:
                break
        if spec is None:
            raise ModuleNotFoundError(_missing_message(), name="paddle")
        check_version(_spec_version(spec))
        return spec


def install() -> None:
    """Put the guard first on ``sys.meta_path`` once; check an already imported Paddle now (at import)."""
    paddle = sys.modules.get("paddle")
    if paddle is not None:
        check_version(str(getattr(paddle, "__version__", "a Paddle without __version__")))
        return
    if not any(isinstance(finder, PaddleGuard) for finder in sys.meta_path):
        sys.meta_path.insert(0, PaddleGuard())


def require_paddle() -> None:
    """Fail now, with the same message, if ``import paddle`` would (for tools that start Paddle in a subprocess)."""
    if "paddle" not in sys.modules:
        install()
        importlib.util.find_spec("paddle")
