"""LoRA under tensor parallel: ``save_model`` of a tp2 LoRA run writes the adapters merged over the
tp ranks, as PaddleNLP's ``save_pretrained(merge_tensor_parallel=True)`` does, in the safetensors layout its
``LoRAModel.from_pretrained`` reads; that reloads to the trained eval loss under tp2 and on one process.
The run's checkpoints hold the adapters' tp pieces and their optimizer states only."""
import json
import os

import pytest
from safetensors.numpy import load_file

from launcher import launch, read_results, run_single

WORKER = "lora_worker.py"


def _args(weights, save_dir, result_dir, *extra):
    return ["--weights", weights, "--save_dir", save_dir, "--result_dir", result_dir, "--output_dir",
            save_dir.parent / "run", "--report_to", "none", "--disable_tqdm", "true",
            "--per_device_train_batch_size", "4", "--learning_rate", "2e-2", "--max_steps", "4",
            "--save_steps", "4", "--logging_steps", "1", *extra]


def test_tp2_lora_save_model_reloads_on_one_process_and_under_tp2_to_the_trained_loss(tmp_path, llama_weights):
    saved = tmp_path / "saved"
    launch(WORKER, 2, _args(llama_weights, saved, tmp_path / "res", "--tensor_parallel_degree", "2"), tmp_path)
    ranks = read_results(tmp_path / "res", 2)
    trained = ranks[0]["eval_loss"]
    assert len(ranks[0]["losses"]) == 4 and ranks[0]["losses"] == ranks[1]["losses"]
    assert abs(ranks[0]["base_eval_loss"] - trained) > 1e-3  # trained adapters: a reload without them fails
    for r in ranks:
        assert r["reloaded_eval_loss"] == pytest.approx(trained, abs=1e-6)  # tp2 reader

    assert sorted(os.listdir(saved)) == ["config.json", "lora_config.json", "peft_model-00001-of-00001.safetensors",
                                         "peft_model.safetensors.index.json", "training_args.json"]
    weights = load_file(str(saved / "peft_model-00001-of-00001.safetensors"))
    assert weights and all(".lora_A" in n or ".lora_B" in n for n in weights)
    # merged over tp: full shapes (hidden 32, r 4), both for the column (q/v) layers' split lora_B
    assert weights["llama.layers.0.self_attn.q_proj.lora_B"].shape == (4, 32)
    assert json.loads((saved / "lora_config.json").read_text())["tensor_parallel_degree"] == -1

    run_single(WORKER, _args(llama_weights, saved, tmp_path / "single", "--phase", "reload"))
    assert read_results(tmp_path / "single", 1)[0]["reloaded_eval_loss"] == pytest.approx(trained, abs=1e-6)

    ckpt = tmp_path / "run" / "checkpoint-4"
    index = json.loads((ckpt / "checkpoint_index.json").read_text())
    assert index["peft"]["type"] == "lora"
    assert {k for k in index["tensors"] if k.startswith("model/")} == {"model/model." + n for n in weights}
    q_b = index["tensors"]["model/model.llama.layers.0.self_attn.q_proj.lora_B"]
    assert len(q_b["pieces"]) == 2  # each tp rank wrote its half
