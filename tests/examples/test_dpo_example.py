"""llm_examples/dpo/run_dpo.py as a user runs it: the quickstart with ``--max_steps 4 --logging_steps 1
--metrics_output_path M`` logs the same per-step DPO loss and reward metrics (JSON lines) on a parallel layout
as on one process holding the whole global batch (8 rows) in one micro-batch, 1e-5, and the test accuracy
computed on world rank 0 from the saved model is the one-process figure. CI launches tp2; ``PT_FULL_MATRIX=1``
adds dp2, pp2 with gradient accumulation, sharding stage2×2 and sep2."""
import json
import os
import re
import subprocess

import pytest

from .helpers import LOCK, PYTHON, REPO, run_retrying_hangs, run_script, script_env, trainer_ready

DPO = REPO / "llm_examples" / "dpo"
FULL = os.environ.get("PT_FULL_MATRIX") == "1"
FULL_ONLY = [pytest.mark.full_matrix] + ([] if FULL else [pytest.mark.skip(reason="full matrix only: PT_FULL_MATRIX=1")])
pytestmark = pytest.mark.skipif(not trainer_ready(), reason="paddletrainer's Trainer does not import")
# The acceptance command with small eval/test sets. The runs' working directory is a scratch one: an SFT output
# (output/sft_quickstart) left in the checkout must not change the start model the test compares.
COMMON = ["--max_steps", "4", "--logging_steps", "1", "--eval_pairs", "16", "--test_reviews", "48",
          "--train_pairs", "200"]
COMPARED = ("train/loss", "train/grad_norm", "train/rewards/chosen", "train/rewards/rejected",
            "train/rewards/margins", "train/rewards/accuracies", "train/logps/chosen", "train/logps/rejected")
ACCURACY = re.compile(r"test accuracy \((\d+) reviews.*\): dpo ([0-9.]+), start \(built from .*\) ([0-9.]+)")


def steps(metrics_dir, rank=0):
    """The compared DPO metrics of every logged training step in ``metrics_rank<rank>.json``."""
    rows = [json.loads(line) for line in (metrics_dir / f"metrics_rank{rank}.json").read_text().splitlines()]
    return [{k: r[k] for k in COMPARED} for r in rows if "train/loss" in r]


def eval_loss(metrics_dir, rank=0):
    rows = [json.loads(line) for line in (metrics_dir / f"metrics_rank{rank}.json").read_text().splitlines()]
    return [r["eval/loss"] for r in rows if "eval/loss" in r]


def accuracy_line(stdout: str):
    found = ACCURACY.findall(stdout)
    assert len(found) == 1, f"one test-accuracy line expected in:\n{stdout[-2000:]}"
    return found[0]


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    """The whole global batch of 8 rows in one micro-batch on one process."""
    out = tmp_path_factory.mktemp("dpo_one")
    proc = run_script([DPO / "run_dpo.py", DPO / "quickstart.json", *COMMON, "--per_device_train_batch_size", "8",
                       "--output_dir", out / "out", "--metrics_output_path", out / "m"], cwd=out)
    return out / "m", accuracy_line(proc.stdout)


def launch(tmp_path, nproc, options):
    def attempt(n: int):  # a retry gets fresh directories
        out, logs = tmp_path / f"out_{n}", tmp_path / f"logs_{n}"
        cmd = ["flock", LOCK, "timeout", "420", PYTHON, "-m", "paddle.distributed.launch", "--nproc_per_node",
               str(nproc), "--log_dir", str(logs), str(DPO / "run_dpo.py"), str(DPO / "quickstart.json"), *COMMON,
               *map(str, options), "--output_dir", str(out), "--metrics_output_path", str(out / "m")]
        proc = subprocess.run(cmd, cwd=str(tmp_path), env=script_env(), capture_output=True, text=True)
        return (proc, out, logs), ([(proc.returncode, logs)] if proc.returncode else [])

    (proc, out, logs), _ = run_retrying_hangs(f"run_dpo.py {' '.join(map(str, options))}", attempt)
    if proc.returncode != 0:
        tails = "\n".join(f"--- {p.name}\n" + "\n".join(p.read_text(errors="replace").splitlines()[-25:])
                          for p in sorted(logs.glob("workerlog.*")))
        pytest.fail(f"launch exited {proc.returncode}\n{tails}\n{proc.stderr[-2000:]}")
    return out, (logs / "workerlog.0").read_text(errors="replace")


@pytest.mark.launch
@pytest.mark.parametrize("nproc,options", [
    pytest.param(2, ["--tensor_parallel_degree", 2, "--per_device_train_batch_size", 8], id="tp2"),
    pytest.param(2, ["--per_device_train_batch_size", 4], id="dp2", marks=FULL_ONLY),
    pytest.param(2, ["--pipeline_parallel_degree", 2, "--per_device_train_batch_size", 4,
                     "--gradient_accumulation_steps", 2], id="pp2_ga2", marks=FULL_ONLY),
    pytest.param(2, ["--sharding", "stage2", "--sharding_parallel_degree", 2, "--per_device_train_batch_size", 4],
                 id="stage2x2", marks=FULL_ONLY),
    pytest.param(2, ["--sep_parallel_degree", 2, "--per_device_train_batch_size", 8], id="sep2", marks=FULL_ONLY),
])
def test_dpo_example_on_a_layout_logs_the_one_process_losses(tmp_path, one_process, nproc, options):
    reference_dir, reference_accuracy = one_process
    reference = steps(reference_dir)
    assert len(reference) == 4
    out, rank0_log = launch(tmp_path, nproc, options)
    for rank in range(nproc):
        at = f"rank {rank}"
        mine = steps(out / "m", rank)
        assert len(mine) == 4, at
        for step, (got, want) in enumerate(zip(mine, reference), 1):
            for key in COMPARED:
                assert got[key] == pytest.approx(want[key], rel=1e-5, abs=1e-6), f"{at} step {step} {key}"
        assert eval_loss(out / "m", rank) == pytest.approx(eval_loss(reference_dir), rel=1e-5), at
    # the saved (merged) model scores the test reviews as the one-process model does
    assert accuracy_line(rank0_log) == reference_accuracy


def test_dpo_example_refuses_a_start_directory_without_a_model(tmp_path):
    (tmp_path / "empty").mkdir()
    proc = subprocess.run([PYTHON, str(DPO / "run_dpo.py"), str(DPO / "quickstart.json"), "--model_name_or_path",
                           str(tmp_path / "empty"), "--output_dir", str(tmp_path / "out")],
                          cwd=str(tmp_path), env=script_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines()[-1] == (
        f"error: --model_name_or_path {tmp_path / 'empty'}: expected a saved model (config.json and weights)")
