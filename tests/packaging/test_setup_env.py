"""scripts/setup_env.sh (what the quick start and CI source) fails with one line that says what to do when the
machine cannot make its venv: a Python older than pyproject.toml's requires-python, no interpreter, or a
Debian/Ubuntu Python without the venv module's pip bootstrap (the python3-venv package), whose failed
``python3 -m venv`` leaves no half-made venv behind. Fake interpreters stand in for those machines: each check
ends before anything is installed, so these take a second.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SETUP = REPO / "scripts" / "setup_env.sh"


def fake_python(tmp_path: Path, name: str, body: str) -> Path:
    path = tmp_path / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return path


def setup_env(tmp_path: Path, **env) -> subprocess.CompletedProcess:
    env = {**os.environ, "VENV": str(tmp_path / "venv"), **env}
    return subprocess.run(["bash", "-c", f'source "{SETUP}"'], env=env, capture_output=True, text=True, timeout=120)


def last_line(proc: subprocess.CompletedProcess) -> str:
    return proc.stderr.strip().splitlines()[-1]


def test_a_python_without_the_venv_module_gets_the_apt_hint_and_no_half_made_venv(tmp_path):
    # What Debian's python3 does without python3-venv: the venv directory is made, ensurepip is missing.
    python = fake_python(tmp_path, "python3", f"""if [ "$1 $2" = "-m venv" ]; then
  "{sys.executable}" -m venv --without-pip "$3"
  echo "The virtual environment was not created successfully because ensurepip is not available."
  exit 1
fi
exec "{sys.executable}" "$@"
""")
    proc = setup_env(tmp_path, PYTHON=str(python))
    assert proc.returncode == 1
    assert "sudo apt-get install python3-venv" in last_line(proc)
    assert not (tmp_path / "venv").exists()


def test_a_venv_left_without_pip_is_named_instead_of_failing_inside_pip(tmp_path):
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "venv")], check=True)
    proc = setup_env(tmp_path)
    assert proc.returncode == 1
    assert last_line(proc).startswith(f"setup_env.sh: {tmp_path / 'venv'} has no pip")


def test_a_python_older_than_the_declared_minimum_is_refused_before_any_venv(tmp_path):
    python = fake_python(tmp_path, "python3.9", """case "$*" in
  *"version_info <"*) exit 1;;
  *version_info*) echo 3.9;;
  *) exit 1;;
esac
""")
    proc = setup_env(tmp_path, PYTHON=str(python))
    assert proc.returncode == 1
    assert "needs Python >= 3.10" in last_line(proc) and "is 3.9" in last_line(proc)
    assert not (tmp_path / "venv").exists()


def test_a_missing_interpreter_is_named(tmp_path):
    proc = setup_env(tmp_path, PYTHON=str(tmp_path / "no-such-python"))
    assert proc.returncode == 1
    assert "no Python interpreter" in last_line(proc)
