"""``import paddletrainer`` guards the first ``import paddle``: missing or untested Paddle -> one line naming both
install commands; a tested one imports unchanged. Each case runs a child interpreter without site-packages
(``-S``) that sees a fake ``paddle`` package of a chosen version, or none."""
import subprocess
import sys
from pathlib import Path

import pytest

from paddletrainer.runtime.paddle_requirement import PADDLE_PIN, SKIP_ENV, install_hint

REPO = Path(__file__).resolve().parents[2]


def fake_paddle(root: Path, version: str) -> Path:
    """A ``paddle`` package whose version file (as Paddle's setup.py writes it) says ``version``."""
    (root / "paddle" / "version").mkdir(parents=True)
    (root / "paddle" / "__init__.py").write_text(f"__version__ = {version!r}\n")
    (root / "paddle" / "version" / "__init__.py").write_text(f"full_version     = '{version}'\nmajor = '3'\n")
    return root


def run(code: str, *paths: Path, env=None) -> subprocess.CompletedProcess:
    prelude = f"import sys; sys.path[:0] = {[str(p) for p in (*paths, REPO)]!r}\n"
    return subprocess.run([sys.executable, "-S", "-c", prelude + code], capture_output=True, text=True,
                          env={**(env or {}), "PYTHONDONTWRITEBYTECODE": "1"})


def last_line(proc) -> str:
    return proc.stderr.strip().splitlines()[-1]


def test_an_untested_paddle_fails_at_its_first_import_with_both_install_commands(tmp_path):
    paths = fake_paddle(tmp_path, "3.2.0")
    proc = run("import paddletrainer\nprint('imported', flush=True)\nimport paddle", paths)
    assert proc.stdout == "imported\n" and proc.returncode == 1
    assert last_line(proc) == (f"ImportError: paddletrainer is tested with PaddlePaddle >=3.3.1,<3.3.2 and found "
                               f"3.2.0 (set {SKIP_ENV}=1 to use it anyway): {install_hint()}")
    assert f"pip install paddlepaddle=={PADDLE_PIN} (CPU) or pip install paddlepaddle-gpu=={PADDLE_PIN}" in last_line(proc)


def test_the_version_check_can_be_switched_off_on_purpose(tmp_path):
    proc = run("import paddletrainer, paddle; print(paddle.__version__)", fake_paddle(tmp_path, "3.4.0"),
               env={SKIP_ENV: "1"})
    assert proc.returncode == 0 and proc.stdout == "3.4.0\n", proc.stderr


def test_a_later_patch_release_is_refused_until_the_contract_digests_are_checked_on_it(tmp_path):
    proc = run("import paddletrainer, paddle", fake_paddle(tmp_path, "3.3.2"))
    assert proc.returncode == 1 and "tested with PaddlePaddle >=3.3.1,<3.3.2 and found 3.3.2" in last_line(proc)


def test_a_paddle_imported_before_paddletrainer_is_checked_at_import_paddletrainer(tmp_path):
    proc = run("import paddle\nimport paddletrainer", fake_paddle(tmp_path, "0.0.0"))
    assert proc.returncode == 1 and last_line(proc).startswith("ImportError: paddletrainer is tested with")
    assert last_line(proc).endswith(install_hint())


@pytest.mark.parametrize("version", ["3.3.1", "3.3.1.post2"])
def test_a_tested_paddle_imports_unchanged(tmp_path, version):
    code = ("import paddletrainer, paddle, importlib.machinery\n"
            "print(paddle.__version__, type(paddle.__spec__.loader) is importlib.machinery.SourceFileLoader)")
    proc = run(code, fake_paddle(tmp_path, version))
    assert proc.returncode == 0 and proc.stdout == f"{version} True\n", proc.stderr


def test_a_missing_paddle_is_a_module_not_found_error_naming_both_builds(tmp_path):
    code = ("import paddletrainer\n"
            "try:\n    import paddle\nexcept ModuleNotFoundError as e:\n    print(e.name)\n"
            "import paddle")
    proc = run(code)
    assert proc.stdout == "paddle\n" and proc.returncode == 1  # code that tries `import paddle` still can
    assert last_line(proc).startswith("ModuleNotFoundError: paddletrainer needs PaddlePaddle, which is not installed")
    assert last_line(proc).endswith(install_hint())
