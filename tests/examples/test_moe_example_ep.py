"""The MoE example under expert parallel (``--expert_parallel_degree 2`` on 2 CPU processes) trains exactly as one
process with the same global batch: the logged losses and grad norms (clipping at max_grad_norm 1.0 acts) and the
eval loss, to 1e-5."""
import json
import subprocess

import pytest

from .helpers import LOCK, PYTHON, REPO, run_script, script_env, trainer_ready

MOE = REPO / "llm_examples" / "moe"
pytestmark = pytest.mark.skipif(not trainer_ready(), reason="paddletrainer's Trainer does not import")
STEPS = ["--max_steps", "10", "--logging_steps", "5", "--eval_steps", "10", "--save_steps", "10"]


def _curve(out):
    history = json.loads((out / "trainer_state.json").read_text())["log_history"]
    logged = [e for e in history if "loss" in e]
    eval_loss = json.loads((out / "eval_results.json").read_text())["eval_loss"]
    return [e["loss"] for e in logged], [e["grad_norm"] for e in logged], eval_loss


@pytest.mark.launch
def test_moe_example_under_ep2_equals_one_process(tmp_path):
    one = tmp_path / "one"
    run_script([MOE / "run_pretrain.py", MOE / "quickstart.json", "--output_dir", one,
                "--per_device_train_batch_size", "8", *STEPS], cwd=REPO)
    ep2 = tmp_path / "ep2"
    cmd = ["flock", LOCK, "timeout", "420", PYTHON, "-m", "paddle.distributed.launch", "--nproc_per_node", "2",
           "--log_dir", str(tmp_path / "logs"), str(MOE / "run_pretrain.py"), str(MOE / "quickstart.json"),
           "--output_dir", str(ep2), "--expert_parallel_degree", "2", "--per_device_train_batch_size", "4", *STEPS]
    proc = subprocess.run(cmd, cwd=str(REPO), env=script_env(), capture_output=True, text=True)
    if proc.returncode:
        tails = "\n".join(p.read_text(errors="replace")[-3000:] for p in sorted((tmp_path / "logs").glob("workerlog.*")))
        pytest.fail(f"ep2 launch exited {proc.returncode}\n{tails}")
    (losses, norms, eval_loss), (ref_losses, ref_norms, ref_eval) = _curve(ep2), _curve(one)
    assert len(losses) == len(ref_losses) == 2
    assert losses == pytest.approx(ref_losses, rel=1e-5) and norms == pytest.approx(ref_norms, rel=1e-5)
    assert max(ref_norms) > 1.0  # the clip acted on the world-summed norm
    assert eval_loss == pytest.approx(ref_eval, rel=1e-5)
