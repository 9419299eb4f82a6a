"""llm_examples/moe/train_qwen2_moe.py: PaddleNLP's Qwen2-MoE trains through our Trainer under Paddle 3.3.1 as a
user runs it (the example installs paddlenlp_qwen2_moe_fix; without it the first forward raises)."""
import json
import math

import pytest

from .helpers import REPO, run_script, trainer_ready

pytestmark = pytest.mark.skipif(not trainer_ready(), reason="paddletrainer.Trainer does not import yet")
MOE = REPO / "llm_examples" / "moe"


def test_qwen2_moe_example_trains_evaluates_and_saves(tmp_path):
    run_script([MOE / "train_qwen2_moe.py", MOE / "qwen2_moe_quickstart.json", "--output_dir", tmp_path,
                "--max_steps", "4", "--eval_steps", "4", "--warmup_steps", "1", "--logging_steps", "1"], cwd=REPO)
    train = json.loads((tmp_path / "train_results.json").read_text())
    evaluation = json.loads((tmp_path / "eval_results.json").read_text())
    assert math.isfinite(train["train_loss"]) and math.isfinite(evaluation["eval_loss"])
    assert evaluation["eval_perplexity"] == pytest.approx(math.exp(evaluation["eval_loss"]))
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["model_type"] == "qwen2_moe" and saved["num_experts"] == 4
