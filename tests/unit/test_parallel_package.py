"""``paddletrainer.parallel``'s lazy-name table is written out (no source read at import) and matches the modules.

* the table names exactly each module's ``__all__`` (a name added to a module's ``__all__`` and not to the
  table, or the other way round, fails here);
* the package imports and lists its names from a ``.pyc``-only copy of the library (no ``.py`` to read).
"""
import compileall
import importlib
import shutil
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import paddletrainer.parallel as parallel

REPO = Path(__file__).resolve().parents[2]


def test_the_lazy_table_is_each_modules_all():
    by_module = defaultdict(set)
    for name, module in parallel._PADDLE_NAMES.items():
        by_module[module].add(name)
    for module, names in by_module.items():
        exported = set(importlib.import_module(f"paddletrainer.parallel.{module}").__all__) - parallel._EAGER
        assert names == exported, (module, sorted(names ^ exported))
    for name in parallel.__all__:
        assert getattr(parallel, name) is not None, name


def test_the_package_imports_from_a_pyc_only_install(tmp_path):
    copy = tmp_path / "paddletrainer"
    shutil.copytree(REPO / "paddletrainer", copy, ignore=shutil.ignore_patterns("__pycache__"))
    assert compileall.compile_dir(str(copy), legacy=True, quiet=1)
    for source in copy.rglob("*.py"):
        source.unlink()
    probe = "import paddletrainer.parallel as p; print(p.__file__); print(len(p.__all__))"
    out = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                         env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(tmp_path)})
    assert out.returncode == 0, out.stderr[-2000:]
    path, count = out.stdout.split()
    assert path.startswith(str(copy)) and path.endswith(".pyc") and int(count) == len(parallel.__all__)
