"""The quick start prints the same figures on every run and every x86 machine (issue #33).

Two shortened quick starts (20 steps, baseline included) run in environments that differ the way two
machines' do: thread counts, the hash seed, and the kernel families MKL (Paddle's matmuls) and OpenBLAS
(the baseline's lbfgs) would pick on another CPU. Everything they print and save must match bit for bit.
Before the pinning (llm_examples/ernie/pin_cpu_math.py, baseline.TOL) the losses and the test loss moved
with ``MKL_DEBUG_CPU_TYPE`` and the baseline's test accuracy with ``OPENBLAS_CORETYPE`` (0.7976 vs 0.7971).
"""
import json
import platform
import re
import subprocess

import pytest

from .helpers import ERNIE, PYTHON, REPO, script_env, trainer_ready

pytestmark = [
    pytest.mark.skipif(not trainer_ready(), reason="paddletrainer.Trainer does not import yet"),
    pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"),
                       reason="MKL and these OpenBLAS core types exist on x86 only"),
]

MACHINES = {
    "here": {"OMP_NUM_THREADS": "2"},
    # Another CPU, simulated: MKL's AVX2 kernels, OpenBLAS's SSE3 ones (any x86-64 runs them), one thread,
    # a caller's MKL_CBWR and Paddle thread count, another hash seed.
    "elsewhere": {"OMP_NUM_THREADS": "1", "MKL_DEBUG_CPU_TYPE": "5", "OPENBLAS_CORETYPE": "Prescott",
                  "MKL_CBWR": "AVX2", "FLAGS_paddle_num_threads": "2", "PYTHONHASHSEED": "7"},
}


def quickstart_figures(out, extra_env):
    """Run the quick start shortened to 20 steps; what it printed and saved that a user would compare."""
    env = {**script_env(), **extra_env}
    proc = subprocess.run([PYTHON, str(ERNIE / "train.py"), str(ERNIE / "quickstart.json"), "--output_dir", str(out),
                           "--max_steps", "20", "--logging_steps", "5", "--evaluation_strategy", "no",
                           "--do_eval", "false"], cwd=str(REPO), env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    printed = re.findall(r"^test accuracy: model .*$", proc.stdout, flags=re.M)
    assert len(printed) == 1, proc.stdout[-2000:]
    log = json.loads((out / "trainer_state.json").read_text())["log_history"]
    test = json.loads((out / "test_results.json").read_text())
    return {"printed": printed[0],
            "losses": [(row["loss"], row["grad_norm"]) for row in log if "loss" in row],
            "test": {k: v for k, v in test.items() if k in ("test_loss", "test_accuracy")},
            "baseline": json.loads((out / "baseline_results.json").read_text()),
            "predictions": (out / "test_predictions.tsv").read_text(encoding="utf-8")}


def test_quickstart_prints_the_same_figures_on_two_machines(tmp_path):
    pytest.importorskip("snownlp")
    pytest.importorskip("sklearn")
    here, elsewhere = (quickstart_figures(tmp_path / name, env) for name, env in MACHINES.items())
    assert len(here["losses"]) == 4
    for key in here:
        assert elsewhere[key] == here[key], key
