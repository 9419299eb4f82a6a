"""The built wheel installs beside any Paddle build and declares exactly what the library imports.

* its METADATA requires no ``paddlepaddle*`` (both builds install the same ``paddle/`` package: pip would lay one
  over the other), and its core ``Requires-Dist`` is the import scan of ``paddletrainer/`` (a new import
  without a declaration fails here);
* installed with no extras into a venv that holds a Paddle build — the CPU one, or a GPU one — pip would install
  paddletrainer and nothing else (``--dry-run`` report), and ``pip check`` is clean after the install;
* in a venv without Paddle, ``import paddletrainer`` works, and building a Trainer (or starting the restarting
  launcher) ends with the one-line message naming the CPU and the CUDA install commands.

The venvs are symlink copies of this environment (``venvs.py``): no download, a few seconds each.
"""
from __future__ import annotations

import ast
import importlib.metadata
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from venvs import PADDLE_ENTRIES, add_paddle, make_venv, pip, run, site_packages, would_install

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
from paddletrainer import __version__  # noqa: E402
from paddletrainer.runtime.paddle_requirement import PADDLE_PIN, install_hint  # noqa: E402

# Imports the library makes only when a feature asks for them: module -> (extra, distribution it must require)
OPTIONAL_IMPORTS = {
    "paddle": ("cpu", "paddlepaddle"),  # the user's own build; the `cpu` extra is the CPU one
    "tensorboardX": ("tensorboard", "tensorboardx"),  # report_to tensorboard
    "wandb": ("wandb", "wandb"),  # report_to wandb
    "isal": ("fast", "isal"),  # faster crc32; zlib gives the same values without it
    "paddlenlp": ("paddlenlp", "paddlenlp"),  # paddletrainer-gpu-smoke's tiny Llama, the pretrain-data tokenizer
    "sentencepiece": ("examples", "sentencepiece"),  # paddletrainer-build-pretrain-data --train_tokenizer
}
CONSOLE_SCRIPTS = {"paddletrainer-launch": "paddletrainer.launch:main",
                   "paddletrainer-merge-checkpoint": "paddletrainer.tools.merge_checkpoint:main",
                   "paddletrainer-gpu-smoke": "paddletrainer.tools.gpu_smoke:main",
                   "paddletrainer-build-pretrain-data": "paddletrainer.tools.build_pretrain_data:main",
                   "paddletrainer-export-paddlenlp-unified": "paddletrainer.tools.export_paddlenlp_unified:main",
                   "paddletrainer-plan": "paddletrainer.tools.plan:main"}


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel ``pip wheel`` builds from a copy of the sources (the checkout gets no build/ or egg-info)."""
    src = tmp_path_factory.mktemp("src")
    shutil.copytree(REPO / "paddletrainer", src / "paddletrainer", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    dist = tmp_path_factory.mktemp("dist")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "-w",
                    str(dist), str(src)], check=True)
    (built,) = dist.glob("paddletrainer-*.whl")
    return built


def metadata(wheel: Path):
    """``(core requirement names, {extra: requirement names}, console scripts, version)`` from the wheel."""
    with zipfile.ZipFile(wheel) as zf:
        info = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        text = zf.read(info).decode()
        scripts = zf.read(info.replace("METADATA", "entry_points.txt")).decode()
    core, extras = set(), {}
    for line in text.splitlines():
        if line.startswith("Requires-Dist:"):
            req = line.split(":", 1)[1].strip()
            name = normalize(re.match(r"[A-Za-z0-9_.\-]+", req).group(0))
            extra = re.search(r"""extra\s*==\s*['"]([^'"]+)['"]""", req)
            (extras.setdefault(extra.group(1), set()) if extra else core).add(name)
    entries = dict(re.findall(r"^(\S+)\s*=\s*(\S+)$", scripts.split("[console_scripts]", 1)[1], re.MULTILINE))
    version = re.search(r"^Version: (\S+)$", text, re.MULTILINE).group(1)
    return core, extras, entries, version


def imported_modules() -> set:
    """Top-level third-party modules ``paddletrainer/`` imports, at module or function level (``ast``, nothing
    imported), plus the optional writers' libraries (``library = "<module>"`` on a writer class: the module
    ``MetricsWriter.require`` imports)."""
    found = set()
    for path in (REPO / "paddletrainer").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.add(node.module.split(".")[0])
            elif (isinstance(node, ast.ClassDef) and path.name == "writers.py"):
                found.update(item.value.value.split(".")[0] for item in node.body if isinstance(item, ast.Assign)
                             and [getattr(t, "id", None) for t in item.targets] == ["library"]
                             and isinstance(item.value, ast.Constant) and isinstance(item.value.value, str))
    return {m for m in found if m not in sys.stdlib_module_names and m not in ("paddletrainer", "__future__")}


def test_wheel_requires_no_paddle_and_its_core_list_is_what_the_package_imports(wheel):
    core, extras, scripts, version = metadata(wheel)
    assert not [r for r in core | set().union(*extras.values()) - extras["cpu"] if r.startswith("paddlepaddle")]
    assert extras["cpu"] == {"paddlepaddle"}
    modules = imported_modules()
    assert set(OPTIONAL_IMPORTS) <= modules, "an optional import listed here is no longer made: update the table"
    providers = importlib.metadata.packages_distributions()
    undeclared = {m: providers.get(m) for m in modules - set(OPTIONAL_IMPORTS)}
    assert {normalize(d[0]) for d in undeclared.values() if d} == core, (
        f"imports {sorted(undeclared)} vs declared dependencies {sorted(core)}")
    assert all(undeclared.values()), f"imported but installed by no distribution: {undeclared}"
    for module, (extra, dist) in OPTIONAL_IMPORTS.items():
        assert dist in extras[extra], f"{module} is imported for the extra {extra!r}, which does not require {dist}"
    assert {"paddlenlp", "tensorboard", "wandb", "fast", "examples", "elastic", "test"} <= set(extras)
    assert scripts == CONSOLE_SCRIPTS and version == __version__


@pytest.mark.parametrize("build", ["paddlepaddle", "paddlepaddle-gpu"])
def test_installing_the_wheel_beside_a_paddle_build_replaces_nothing(wheel, tmp_path, build):
    python = make_venv(tmp_path / "venv", leave_out=PADDLE_ENTRIES.match)
    add_paddle(python, build)
    paddle_before = sorted(p.name for p in site_packages(python).iterdir() if PADDLE_ENTRIES.match(p.name))
    # every dependency of the wheel is installed, and none of them is a Paddle distribution: nothing else to install
    assert would_install(python, wheel) == [f"paddletrainer=={__version__}"]
    pip(python, "install", "--quiet", "--no-deps", str(wheel))
    assert pip(python, "check").stdout.strip() == "No broken requirements found."
    assert sorted(p.name for p in site_packages(python).iterdir() if PADDLE_ENTRIES.match(p.name)) == paddle_before
    probe = ("import importlib.util, paddletrainer\n"
             "print(paddletrainer.__file__, importlib.util.find_spec('paddle').origin)")
    out = run(python, "-c", probe, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert all(path.startswith(str(site_packages(python))) for path in out.stdout.split())
    if build == "paddlepaddle-gpu":  # the console scripts work (this one imports paddle: a few seconds, so once)
        assert run(python, "paddletrainer-merge-checkpoint", "--help", cwd=tmp_path).returncode == 0


TRAINER_SCRIPT = """
import paddletrainer
from paddletrainer import TrainingArguments
args = TrainingArguments(output_dir="out")
print("imported without paddle", paddletrainer.__version__, flush=True)
from paddletrainer import Trainer
Trainer(model=None, args=args)
"""


def test_without_paddle_import_works_and_a_trainer_says_how_to_install_it(wheel, tmp_path):
    python = make_venv(tmp_path / "venv", leave_out=PADDLE_ENTRIES.match)
    pip(python, "install", "--quiet", "--no-deps", str(wheel))
    assert pip(python, "check").stdout.strip() == "No broken requirements found."
    (tmp_path / "train.py").write_text(TRAINER_SCRIPT)
    out = run(python, "train.py", cwd=tmp_path)
    assert out.stdout.strip() == f"imported without paddle {__version__}"
    last = out.stderr.strip().splitlines()[-1]
    assert out.returncode == 1 and last.startswith("ModuleNotFoundError: paddletrainer needs PaddlePaddle")
    assert last.endswith(install_hint())
    assert f"pip install paddlepaddle=={PADDLE_PIN} (CPU)" in last
    assert f"pip install paddlepaddle-gpu=={PADDLE_PIN}" in last
    launch = run(python, "paddletrainer-launch", "--max_restart", "1", "train.py", cwd=tmp_path)
    assert launch.returncode == 1 and launch.stderr.strip().splitlines()[-1].endswith(install_hint())
