"""The MoE example (llm_examples/moe) trains: its loss falls over a short run on the Llama example's data, the
expert load is logged with the loss, and the saved model names its experts by global index and reloads."""
import json
import subprocess

import pytest

from .helpers import PYTHON, REPO, run_script, script_env, trainer_ready

MOE = REPO / "llm_examples" / "moe"
pytestmark = pytest.mark.skipif(not trainer_ready(), reason="paddletrainer's Trainer does not import")


def test_moe_pretrain_loss_falls_logs_expert_load_and_the_saved_model_reloads(tmp_path):
    out = tmp_path / "out"
    run_script([MOE / "run_pretrain.py", MOE / "quickstart.json", "--output_dir", out, "--max_steps", "60",
                "--logging_steps", "10", "--eval_steps", "60", "--save_steps", "60"], cwd=REPO)
    history = [e for e in json.loads((out / "trainer_state.json").read_text())["log_history"] if "loss" in e]
    assert [e["step"] for e in history] == [10, 20, 30, 40, 50, 60]
    assert history[-1]["loss"] < history[0]["loss"] - 1.0
    # A uniform guess over the 640-token vocab costs ln(640) = 6.46 nats.
    assert json.loads((out / "eval_results.json").read_text())["eval_loss"] < 4.0
    for entry in history:  # MoE in layers 1 and 3 (moe_layer_interval 2): each layer's load, every log
        for layer in ("layers.1.mlp", "layers.3.mlp"):
            assert entry[f"moe/{layer}/imbalance"] >= 1.0 and 0.5 < entry[f"moe/{layer}/aux_loss"] < 2.0
    probe = ("import sys; sys.path.insert(0, r'%s'); from modeling import MoELlamaForCausalLM;"
             "m = MoELlamaForCausalLM.from_pretrained(r'%s');"
             "names = [n for n, p in m.named_parameters() if getattr(p, 'is_expert', False)];"
             "print(len(names), names[0], names[-1]);"
             "from paddletrainer.metrics import flops_per_token_from_config as dense;"
             "print(m.flops_per_token(), dense(m.config))") % (MOE, out)
    lines = run_script(["-c", probe], cwd=REPO).stdout.splitlines()
    assert lines[-2].split()[-3:] == [
        "24", "llama.layers.1.mlp.experts.0.gate_proj.weight", "llama.layers.3.mlp.experts.3.down_proj.weight"]
    # MFU's FLOPs: layers 1 and 3 swap their dense MLP (3·64·128) for router 64·4 + 2 experts 3·64·64 + shared 3·64·64
    moe, dense = map(int, lines[-1].split())
    assert moe - dense == 6 * 2 * (64 * 4 + 3 * 3 * 64 * 64 - 3 * 64 * 128)


def test_a_bad_moe_config_is_refused_naming_the_key(tmp_path):
    config = json.loads((MOE / "tiny_moe" / "config.json").read_text())
    for key, value, message in (("num_experts", None, "MoE config: num_experts missing from config.json"),
                                ("moe_layer_interval", 0, "moe_layer_interval must be in [1, num_hidden_layers=4], got 0")):
        bad = dict(config)
        if value is None:
            del bad[key]
        else:
            bad[key] = value
        model_dir = tmp_path / key
        model_dir.mkdir()
        (model_dir / "config.json").write_text(json.dumps(bad))
        proc = subprocess.run([PYTHON, str(MOE / "run_pretrain.py"), str(MOE / "quickstart.json"), "--output_dir",
                               str(tmp_path / "out"), "--model_name_or_path", str(model_dir)], cwd=str(REPO),
                              env=script_env(), capture_output=True, text=True, timeout=300)
        assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-2000:]
