"""llm_examples/moe/train_qwen2_moe.py: PaddleNLP's Qwen2-MoE trains through our Trainer under Paddle 3.3.1 as a
user runs it (the example installs paddlenlp_qwen2_moe_fix; without it the first forward raises), on one process
and on two data-parallel processes with the same losses."""
import json
import math
import subprocess

import numpy as np
import pytest

from .helpers import LOCK, PYTHON, REPO, run_retrying_hangs, run_script, script_env, trainer_ready

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


def logged(metrics_dir):
    """(loss, grad norm) of every logged training step of rank 0."""
    rows = [json.loads(line) for line in (metrics_dir / "metrics_rank0.json").read_text().splitlines()]
    return [(r["train/loss"], r["train/grad_norm"]) for r in rows if "train/loss" in r]


@pytest.mark.launch
def test_qwen2_moe_example_on_two_data_parallel_processes_equals_one_process(tmp_path):
    """Plain data parallel with the fix: the router's gradient is the loss's, so averaging it over ranks gives
    the one-process gradient (PaddleNLP's own gate leaves 1/2 of a spurious term here: docs/paddlenlp_compat.md)."""
    common = [MOE / "train_qwen2_moe.py", MOE / "qwen2_moe_quickstart.json", "--max_steps", "4", "--warmup_steps",
              "1", "--logging_steps", "1", "--do_eval", "false", "--save_steps", "100"]
    run_script([*common, "--output_dir", tmp_path / "one", "--metrics_output_path", tmp_path / "one_m"], cwd=REPO)

    def attempt(n: int):  # a retry gets fresh directories
        out, logs = tmp_path / f"dp2_{n}", tmp_path / f"logs_{n}"
        cmd = ["flock", LOCK, "timeout", "300", PYTHON, "-m", "paddle.distributed.launch", "--nproc_per_node", "2",
               "--log_dir", str(logs), *map(str, common), "--per_device_train_batch_size", "4",
               "--output_dir", str(out), "--metrics_output_path", str(out / "m")]
        proc = subprocess.run(cmd, cwd=str(REPO), env=script_env(), capture_output=True, text=True)
        return (proc, out, logs), ([(proc.returncode, logs)] if proc.returncode else [])

    (proc, out, logs), _ = run_retrying_hangs("train_qwen2_moe.py on 2 processes", attempt)
    if proc.returncode != 0:
        tails = "\n".join(f"--- {p.name}\n" + "\n".join(p.read_text(errors="replace").splitlines()[-25:])
                          for p in sorted(logs.glob("workerlog.*")))
        pytest.fail(f"launch exited {proc.returncode}\n{tails}\n{proc.stderr[-2000:]}")
    one, dp2 = logged(tmp_path / "one_m"), logged(out / "m")
    assert len(one) == 4
    np.testing.assert_allclose(np.array(dp2), np.array(one), atol=1e-5, rtol=0)
