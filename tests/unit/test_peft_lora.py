"""LoRA runs (``paddlenlp.peft.LoRAModel``): ``save_model`` writes what ``LoRAModel.from_pretrained`` reads and
nothing of the frozen base; checkpoints hold the adapters + optimizer state and resume exactly; a LoRA
checkpoint merges into a plain ``from_pretrained`` model; other PEFT types are refused by name.
"""
import json
import os
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import paddle
import pytest
from safetensors.numpy import load_file

from paddletrainer import Trainer, TrainingArguments
from paddletrainer.checkpoint import (CheckpointError, export_for_from_pretrained, load_checkpoint, read_index,
                                      save_checkpoint)
from paddletrainer.checkpoint.peft import UnsupportedPeftModelError

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SCRIPT = os.path.join(ROOT, "scripts", "merge_checkpoint.py")
SEQ, VOCAB = 16, 96
TARGETS = [".*q_proj.*", ".*v_proj.*"]


def tiny_config():
    from paddlenlp.transformers import LlamaConfig

    return LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=SEQ, seq_length=SEQ,
                       rms_norm_eps=1e-6, use_flash_attention=False, use_fused_rms_norm=False,
                       tie_word_embeddings=False, dtype="float32")


def data(n, seed):
    tokens = np.random.RandomState(seed).randint(0, VOCAB, size=(n, SEQ + 1)).astype("int64")
    return [{"input_ids": t[:-1], "labels": t[1:]} for t in tokens]


def training_args(out, **kw):
    return TrainingArguments(output_dir=str(out), max_steps=6, per_device_train_batch_size=4, learning_rate=2e-2,
                             save_steps=3, logging_steps=1, report_to=[], disable_tqdm=True, seed=42, **kw)


def base_model(base_dir):
    from paddlenlp.transformers import LlamaForCausalLM

    return LlamaForCausalLM.from_pretrained(str(base_dir), dtype="float32")


def lora_model(base_dir):
    from paddlenlp.peft import LoRAConfig, LoRAModel

    paddle.seed(7)  # the adapters' random init (lora_A)
    return LoRAModel(base_model(base_dir), LoRAConfig(target_modules=TARGETS, r=4, lora_alpha=8))


def eval_loss(model, out):
    return Trainer(model=model, args=training_args(out), eval_dataset=data(8, 1)).evaluate()["eval_loss"]


def losses(trainer):
    return [h["loss"] for h in trainer.state.log_history if "loss" in h]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """One 6-step LoRA run (checkpoints at 3 and 6), its save_model directory and PaddleNLP's own save."""
    from paddlenlp.transformers import LlamaForCausalLM

    work = tmp_path_factory.mktemp("lora")
    paddle.seed(2024)
    LlamaForCausalLM(tiny_config()).save_pretrained(str(work / "base"))  # PaddleNLP's default: pdparams
    model = lora_model(work / "base")
    trainer = Trainer(model=model, args=training_args(work / "out"), train_dataset=data(48, 0),
                      eval_dataset=data(8, 1))
    trainer.train()
    trained = trainer.evaluate()["eval_loss"]
    trainer.save_model(str(work / "saved"))
    model.save_pretrained(str(work / "paddlenlp_saved"))  # PaddleNLP's own save of the same adapters
    return SimpleNamespace(work=work, base=work / "base", saved=work / "saved", trained_eval=trained,
                           losses=losses(trainer), model=model,
                           trainable=sorted(model.get_trainable_state_dict().keys()))


def test_save_model_writes_the_adapters_lora_from_pretrained_reloads_to_the_trained_loss(run):
    from paddlenlp.peft import LoRAModel

    files = sorted(os.listdir(run.saved))
    assert files == ["config.json", "lora_config.json", "peft_model-00001-of-00001.safetensors",
                     "peft_model.safetensors.index.json", "training_args.json"]
    weights = load_file(str(run.saved / "peft_model-00001-of-00001.safetensors"))
    assert sorted(weights) == run.trainable  # the adapters, nothing of the frozen base
    assert all(".lora_A" in n or ".lora_B" in n for n in weights)
    ours_cfg = json.loads((run.saved / "lora_config.json").read_text())
    assert ours_cfg == json.loads((run.work / "paddlenlp_saved" / "lora_config.json").read_text())
    index = json.loads((run.saved / "peft_model.safetensors.index.json").read_text())
    assert index["type"] == "lora" and set(index["weight_map"]) == set(weights)
    ours = os.path.getsize(run.saved / "peft_model-00001-of-00001.safetensors")
    theirs = os.path.getsize(run.work / "paddlenlp_saved" / "lora_model_state.pdparams")
    assert abs(ours - theirs) < 0.1 * theirs, (ours, theirs)  # ~9.9 kB here, not the 200 kB model

    base_loss = eval_loss(base_model(run.base), run.work / "e0")
    assert abs(base_loss - run.trained_eval) > 1e-3  # the adapters changed the model: a reload that lost them fails
    reloaded = LoRAModel.from_pretrained(base_model(run.base), str(run.saved))
    assert abs(eval_loss(reloaded, run.work / "e1") - run.trained_eval) <= 1e-6


def test_checkpoints_hold_adapters_and_optimizer_state_only_and_resume_exactly(run):
    ckpt = run.work / "out" / "checkpoint-3"
    index = read_index(str(ckpt))
    assert index["peft"]["type"] == "lora" and index["peft"]["config"]["r"] == 4
    model_keys = sorted(k[len("model/"):] for k in index["tensors"] if k.startswith("model/"))
    assert model_keys == sorted("model." + n for n in run.trainable)
    optim_params = {k.split("/")[1] for k in index["tensors"] if k.startswith("optim/")}
    assert optim_params == set(model_keys)
    assert "model.safetensors.index.json" not in os.listdir(ckpt)  # from_pretrained would build a base-less model
    weights = sum(os.path.getsize(ckpt / f) for f in os.listdir(ckpt) if f.startswith("model_state"))
    assert weights < 2 * os.path.getsize(run.saved / "peft_model-00001-of-00001.safetensors")

    resumed = Trainer(model=lora_model(run.base), args=training_args(run.work / "out"), train_dataset=data(48, 0))
    resumed.train(resume_from_checkpoint=str(ckpt))
    assert resumed.state.global_step == 6 and len(run.losses) == 6
    np.testing.assert_array_equal(losses(resumed), run.losses)  # steps 1-3 restored, 4-6 trained again


def test_a_lora_checkpoint_and_a_whole_model_checkpoint_do_not_load_into_each_other_nor_export_baseless(run, tmp_path):
    with pytest.raises(CheckpointError, match="is a lora checkpoint: it holds the lora adapters only"):
        load_checkpoint(str(run.work / "out" / "checkpoint-3"), model=base_model(run.base))
    with pytest.raises(CheckpointError, match="is a lora checkpoint: it holds the adapters only"):
        export_for_from_pretrained(str(run.work / "out" / "checkpoint-3"), str(tmp_path / "export"))
    assert not (tmp_path / "export").exists()
    whole = save_checkpoint(str(tmp_path / "checkpoint-1"), model=base_model(run.base))
    with pytest.raises(CheckpointError, match="holds a whole model"):
        load_checkpoint(whole, model=lora_model(run.base))


def test_merge_of_a_lora_checkpoint_is_a_plain_model_with_paddlenlps_merged_weights(run):
    from paddlenlp.peft import LoRAModel
    from paddlenlp.transformers import AutoModelForCausalLM, LlamaForCausalLM

    ckpt, out = run.work / "out" / "checkpoint-6", run.work / "merged"
    proc = subprocess.run([sys.executable, SCRIPT, str(ckpt), str(out)], capture_output=True, text=True)
    assert proc.returncode == 2 and "pass --base-model" in proc.stderr and "Traceback" not in proc.stderr
    subprocess.run([sys.executable, SCRIPT, str(ckpt), str(out), "--base-model", str(run.base)], check=True,
                   capture_output=True)
    assert sorted(os.listdir(out)) == ["config.json", "model.safetensors"]
    merged = AutoModelForCausalLM.from_pretrained(str(out), dtype="float32")
    assert type(merged) is LlamaForCausalLM
    assert abs(eval_loss(merged, run.work / "e2") - run.trained_eval) <= 1e-6

    reference = LoRAModel.from_pretrained(base_model(run.base), str(run.saved))
    reference.merge()  # PaddleNLP's own merge: W + scaling * A @ B in place
    expected = {k[len("model."):]: v.numpy() for k, v in reference.state_dict().items() if ".lora_" not in k}
    got = merged.state_dict()
    assert sorted(got) == sorted(expected)
    for name, value in expected.items():
        np.testing.assert_allclose(got[name].numpy(), value, rtol=0, atol=1e-6, err_msg=name)
    q = "llama.layers.0.self_attn.q_proj.weight"
    assert np.abs(got[q].numpy() - base_model(run.base).state_dict()[q].numpy()).max() > 1e-4  # LoRA was merged


def test_other_peft_types_and_lora_variants_are_refused_by_name_before_any_process_group(tmp_path, monkeypatch):
    from paddlenlp.peft import LoRAConfig, LoRAModel, VeRAConfig, VeRAModel
    from paddlenlp.transformers import LlamaForCausalLM

    import paddletrainer.trainer as trainer_module

    def no_groups(*a, **k):
        raise AssertionError("a process group was created before the model was refused")

    monkeypatch.setattr(trainer_module, "init_topology", no_groups)
    vera = VeRAModel(LlamaForCausalLM(tiny_config()), VeRAConfig(target_modules=TARGETS, r=4))
    with pytest.raises(UnsupportedPeftModelError, match=r"^VeRAModel \(paddlenlp.peft\) is not supported"):
        Trainer(model=vera, args=training_args(tmp_path))
    from paddle.distributed.fleet.meta_parallel import PipelineLayer

    piped = LoRAModel(LlamaForCausalLM(tiny_config()), LoRAConfig(target_modules=TARGETS, r=4))
    piped.model.__class__ = type("LlamaForCausalLMPipe", (LlamaForCausalLM, PipelineLayer), {})  # no pp groups here
    with pytest.raises(UnsupportedPeftModelError, match="LoRAModel over the pipeline model LlamaForCausalLMPipe"):
        Trainer(model=piped, args=training_args(tmp_path))
    mora = LoRAModel(LlamaForCausalLM(tiny_config()), LoRAConfig(target_modules=TARGETS, r=4, use_mora=True))
    with pytest.raises(UnsupportedPeftModelError, match=r"LoRAConfig\(use_mora=True\) is not supported"):
        Trainer(model=mora, args=training_args(tmp_path))
