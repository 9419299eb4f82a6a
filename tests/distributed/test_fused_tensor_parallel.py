"""Fused q/k/v and gate/up projections (``fuse_attention_qkv`` / ``fuse_attention_ffn``, as the llm_examples
Llama configs set them) under tp2, against the one-process unfused model of the trainer matrix.

The fused model has other parameters (``qkv_proj`` [h, 3h], ``gate_up_fused_proj`` [h, 2f] instead of
``q/k/v_proj`` and ``gate/up_proj``): the tiny Llama's saved (unfused) weights load through PaddleNLP's fuse
conversion in ``from_pretrained``, but a paddletrainer checkpoint of the unfused model (weights and optimizer
state by parameter name) is refused by the fused one, naming the keys.
"""
import pytest

from launcher import LaunchError, launch, read_results, run_single
from trainer_phases import WORKER, assert_curve, phase_args

FUSED = dict(fuse_attention_qkv=True, fuse_attention_ffn=True)


def test_tp2_fused_qkv_ffn_trains_evaluates_and_resumes_like_one_unfused_process(
    tmp_path, trainer_reference, llama_weights
):
    ref, _ = trainer_reference("llama")
    launch(WORKER, 2, phase_args("llama", tmp_path / "out", tmp_path / "res", llama_weights,
                                 per_device_train_batch_size=4, tensor_parallel_degree=2, **FUSED),
           tmp_path, timeout=420)
    for r in read_results(tmp_path / "res", 2):
        at = f"tp2 fused rank {r['rank']}"
        assert_curve(r["short"], ref["short"], 3, f"{at} short run")
        assert r["short"]["eval_loss"] == pytest.approx(ref["short"]["direct_eval_loss"], rel=1e-5), at
        assert_curve(r["extended"], ref["uninterrupted"], 6, f"{at} resumed with max_steps 6")


def test_an_unfused_checkpoint_is_refused_by_the_fused_model_naming_the_fused_parameters(
    tmp_path, trainer_reference, llama_weights
):
    _, unfused_checkpoint = trainer_reference("llama")
    with pytest.raises(LaunchError, match="missing in checkpoint: model/llama.layers.0.(mlp.gate_up_fused_proj|"
                                          "self_attn.qkv_proj).weight"):
        run_single(WORKER, phase_args("llama", tmp_path / "out", tmp_path / "res", llama_weights,
                                      per_device_train_batch_size=4, foreign_checkpoint=unfused_checkpoint, **FUSED))
