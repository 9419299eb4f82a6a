"""checkpoint.discovery: the one home of checkpoint discovery and resume resolution, importable without paddle."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from paddletrainer.checkpoint import discovery
from paddletrainer.checkpoint.placement import CHECKPOINT_INDEX_NAME

ROOT = Path(__file__).resolve().parents[2]


def test_discovery_trainer_utils_and_the_arguments_import_without_paddle():
    # training_args and trainer_utils import discovery instead of keeping their own copies: that only works while
    # discovery, and the checkpoint package's lazy __init__ it passes through, import no paddle
    code = ("import sys; import paddletrainer.checkpoint.discovery, paddletrainer.trainer_utils, "
            "paddletrainer.training_args; print(sorted(m for m in sys.modules if m.split('.')[0] == 'paddle'))")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_paddlenlp_names_of_trainer_utils_are_discoverys():
    from paddletrainer import trainer_utils

    for name in ("get_last_checkpoint", "sorted_checkpoints", "is_paddlenlp_checkpoint", "resolve_resume_checkpoint"):
        assert getattr(trainer_utils, name) is getattr(discovery, name)


def _ours(parent: Path, step: int, damaged: bool = False) -> Path:
    import paddle

    from paddletrainer.checkpoint import save_checkpoint

    path = Path(save_checkpoint(str(parent / f"checkpoint-{step}"), model=paddle.nn.Linear(2, 2), save_rng=False))
    if damaged:
        (path / CHECKPOINT_INDEX_NAME).write_text("not json")
    return path


def test_auto_resolves_to_the_newest_sound_checkpoint_listing_output_dir_once(tmp_path, monkeypatch):
    old = _ours(tmp_path, 1)
    _ours(tmp_path, 2, damaged=True)
    listed = []
    real = discovery.sorted_checkpoints
    monkeypatch.setattr(discovery, "sorted_checkpoints", lambda folder: listed.append(folder) or real(folder))
    choice = discovery.resolve_resume("auto", str(tmp_path))
    assert choice.path == str(old) and choice.auto and choice.named is None
    assert [os.path.basename(bad) for bad, _ in choice.skipped] == ["checkpoint-2"]
    assert listed == [str(tmp_path)]


def test_auto_with_every_checkpoint_damaged_is_an_error_and_with_none_a_fresh_start(tmp_path):
    assert discovery.resolve_resume("auto", str(tmp_path)).path is None
    _ours(tmp_path, 3, damaged=True)
    with pytest.raises(discovery.CheckpointError, match="every checkpoint in output_dir=.* is damaged"):
        discovery.resolve_resume("auto", str(tmp_path))


def test_the_arguments_check_raises_for_a_bad_path_and_looks_at_nothing_for_auto(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="resume_from_checkpoint="):
        discovery.check_resume_value(str(tmp_path / "nowhere"), str(tmp_path))
    monkeypatch.setattr(discovery, "sorted_checkpoints", lambda folder: pytest.fail("auto listed output_dir"))
    discovery.check_resume_value("auto", str(tmp_path))
