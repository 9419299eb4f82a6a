"""A ``checkpoint-N`` PaddleNLP's Trainer writes for a ``paddlenlp.peft.LoRAModel`` resumes in our Trainer on
PaddleNLP's own resumed losses, in both of its formats: the default one (``lora_model_state.pdparams``, the adapters
merged over tensor-parallel ranks, and ``optimizer.pdopt``) and the unified one (``peft_model.safetensors.index.json``
and ``optimizer.safetensors.index.json``). Optimizer, schedule, RNG and trainer state come from the checkpoint; the
frozen base is the user's, as in PaddleNLP. (Under tp2: tests/distributed/test_paddlenlp_unified_checkpoint.py.)"""
import os

import numpy as np
import paddle
import pytest

from paddletrainer.checkpoint.paddlenlp_unified import unified_checkpoint_index
from paddletrainer.trainer_utils import is_paddlenlp_checkpoint, is_paddlenlp_unified_checkpoint
from paddlenlp_runs import SEQ, VOCAB, loss_log, sequential_sampler, token_data

COMMON = dict(max_steps=6, logging_steps=1, learning_rate=1e-2, per_device_train_batch_size=2, seed=3,
              lr_scheduler_type="linear", warmup_steps=0, report_to="none", disable_tqdm=True)
FORMATS = {"default": False, "unified": True}  # PaddleNLP's unified_checkpoint option


def lora_llama(adapter_seed):
    """The tiny Llama (the same frozen base for every run) with LoRA on q/v; the adapters' init from the seed."""
    transformers = pytest.importorskip("paddlenlp.transformers")
    from paddlenlp.peft import LoRAConfig, LoRAModel

    paddle.seed(2024)
    base = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=4, max_position_embeddings=SEQ, seq_length=SEQ, rms_norm_eps=1e-6,
        use_flash_attention=False, use_fused_rms_norm=False, tie_word_embeddings=False, dtype="float32"))
    paddle.seed(adapter_seed)
    return LoRAModel(base, LoRAConfig(target_modules=[".*q_proj.*", ".*v_proj.*"], r=4, lora_alpha=8))


def run(trainer_module, output_dir, adapter_seed, resume=None, **options):
    """Either Trainer (``paddlenlp.trainer`` or ``paddletrainer``) on the same batches: ``{step: loss}``, trainer."""
    losses = {}
    with paddle.utils.unique_name.guard():  # as in a process of its own: optimizer states are keyed by these names
        trainer = type("Sequential", (trainer_module.Trainer,), {"_get_train_sampler": sequential_sampler})(
            model=lora_llama(adapter_seed), train_dataset=token_data(),
            callbacks=[loss_log(trainer_module.TrainerCallback, losses)()],
            args=trainer_module.TrainingArguments(output_dir=str(output_dir), **COMMON, **options))
        trainer.train(resume_from_checkpoint=resume)
    return losses, trainer


@pytest.fixture(scope="module", params=sorted(FORMATS))
def paddlenlp_lora(request, tmp_path_factory):
    """PaddleNLP's LoRA run saving checkpoint-3 in one format, and PaddleNLP resuming it (the reference)."""
    nlp = pytest.importorskip("paddlenlp.trainer")
    root = tmp_path_factory.mktemp(f"nlp_lora_{request.param}")
    run(nlp, root / "nlp", 2024, save_steps=3, unified_checkpoint=FORMATS[request.param])
    checkpoint = str(root / "nlp" / "checkpoint-3")
    resumed, _ = run(nlp, root / "nlp_resumed", 2024, resume=checkpoint, unified_checkpoint=FORMATS[request.param])
    return request.param, checkpoint, resumed


def test_a_paddlenlp_lora_checkpoint_resumes_on_paddlenlp_own_resumed_losses(tmp_path, paddlenlp_lora):
    form, checkpoint, theirs = paddlenlp_lora
    names = os.listdir(checkpoint)
    assert ("lora_model_state.pdparams" in names) == (form == "default")
    assert ("peft_model.safetensors.index.json" in names) == (form == "unified")
    assert is_paddlenlp_checkpoint(checkpoint)
    assert is_paddlenlp_unified_checkpoint(checkpoint) == (form == "unified")
    # other adapters than PaddleNLP's run: the adapters, moments, schedule and step all come from the checkpoint
    losses, ours = run(pytest.importorskip("paddletrainer"), tmp_path / "ours", 7, resume=checkpoint)
    assert ours.state.global_step == 6 and sorted(theirs) == sorted(losses) == [4, 5, 6]
    np.testing.assert_allclose([losses[s] for s in (4, 5, 6)], [theirs[s] for s in (4, 5, 6)], rtol=0, atol=1e-5)
    assert ours.lr_scheduler.last_epoch == 6


def test_a_unified_lora_checkpoint_is_indexed_under_the_lora_models_names(paddlenlp_lora):
    form, checkpoint, _ = paddlenlp_lora
    if form != "unified":
        pytest.skip("the unified format's index")
    index, _ = unified_checkpoint_index(checkpoint)
    key = "model.llama.layers.0.self_attn.q_proj.lora_B"
    assert index["tensors"][f"model/{key}"]["shape"] == [4, 32]
    assert f"optim/{key}/moment1" in index["tensors"]
    assert not [k for k in index["tensors"] if k.startswith("model/") and ".lora_" not in k]  # adapters only
