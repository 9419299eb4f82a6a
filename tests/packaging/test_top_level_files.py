"""setup.py and requirements.txt at the top level add nothing to pyproject.toml, the one source of truth.

* ``setup.py`` is a bare ``setup()``: ``python setup.py --name --version`` answers from pyproject.toml;
* ``requirements.txt`` names what the README's CPU install names (``pip install ".[cpu]"``, on every install page),
  and ``pip install -r requirements.txt`` resolves to this checkout with the ``cpu`` extra pyproject declares (a
  dry run in a scratch venv that holds the dependencies already: no download).
"""
from __future__ import annotations

import ast
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

from venvs import PADDLE_ENTRIES, add_paddle, make_venv, pip

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
from paddletrainer import __version__  # noqa: E402

# The README's, README_cn's and the guide's CPU install line: pip install "<spec>"  # with Paddle's CPU build
CPU_INSTALL = re.compile(r'^pip install "([^"]+)"\s+# with Paddle\'s CPU build', re.MULTILINE)
INSTALL_PAGES = ("README.md", "README_cn.md", "docs/getting-started.md", "docs/zh/getting-started.md")


def requirement_lines() -> list:
    lines = [line.split("#", 1)[0].strip() for line in (REPO / "requirements.txt").read_text().splitlines()]
    return [line for line in lines if line]


def test_setup_py_is_a_bare_setup_call_that_reads_pyproject(tmp_path):
    tree = ast.parse((REPO / "setup.py").read_text())
    calls = [node for node in ast.walk(tree) if isinstance(node, ast.Call)]
    assert [(c.func.id, c.args, c.keywords) for c in calls] == [("setup", [], [])], "settings belong in pyproject"
    src = tmp_path / "src"
    shutil.copytree(REPO / "paddletrainer", src / "paddletrainer", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md", "setup.py"):
        shutil.copy(REPO / name, src / name)
    out = subprocess.run([sys.executable, "setup.py", "--name", "--version"], cwd=src, capture_output=True,
                         text=True, check=True)
    assert out.stdout.split() == ["paddletrainer", __version__]


def test_requirements_txt_installs_what_the_readme_cpu_install_does():
    (spec,) = requirement_lines()
    for page in INSTALL_PAGES:
        text = (REPO / page).read_text()
        assert CPU_INSTALL.findall(text) == [spec], f"{page}: its CPU install differs from requirements.txt"
        assert "pip install -r requirements.txt" in text, f"{page} does not mention requirements.txt"


def test_pip_install_r_requirements_txt_resolves_to_this_checkout_with_the_cpu_extra(tmp_path):
    src = tmp_path / "clone"
    shutil.copytree(REPO / "paddletrainer", src / "paddletrainer", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md", "setup.py", "requirements.txt"):
        shutil.copy(REPO / name, src / name)
    python = make_venv(tmp_path / "venv", leave_out=PADDLE_ENTRIES.match)
    add_paddle(python, "paddlepaddle")
    report = pip(python, "install", "--dry-run", "--no-index", "--no-build-isolation", "--quiet", "--report", "-",
                 "-r", str(src / "requirements.txt"), cwd=src).stdout
    (item,) = json.loads(report)["install"]  # the CPU build is there already: nothing else to install
    assert (item["metadata"]["name"], item["metadata"]["version"]) == ("paddletrainer", __version__)
    assert item["requested_extras"] == ["cpu"] and "cpu" in item["metadata"]["provides_extra"]
    assert Path(item["download_info"]["url"].removeprefix("file://")) == src
