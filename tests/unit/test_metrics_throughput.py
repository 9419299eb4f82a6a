"""FLOPs per token, MFU, batch counting and ThroughputMeter arithmetic."""
from types import SimpleNamespace

import numpy as np
import pytest

from paddletrainer.metrics import (
    ThroughputMeter,
    batch_counts,
    causal_lm_flops_per_token,
    flops_per_token_from_config,
    mfu,
)

# A tiny Llama with GQA: L=2, h=8, 2 heads (head_dim 4), 1 KV head (kv_dim 4), I=16, V=16, s=4.
#   attention weights per layer: q 8*8 + k 8*4 + v 8*4 + o 8*8 = 192
#   SwiGLU MLP per layer:        3 * 8*16                      = 384
#   matmul weights: 2 * (192 + 384) + lm_head 8*16 = 1152 + 128 = 1280
#   6 * 1280 + attention 12 * L * h * s = 7680 + 12*2*8*4 = 7680 + 768 = 8448
TINY_LLAMA = dict(num_layers=2, hidden_size=8, num_heads=2, seq_len=4, vocab_size=16, intermediate_size=16,
                  num_kv_heads=1)
TINY_LLAMA_FLOPS = 8448


def test_flops_per_token_matches_the_hand_computed_tiny_llama():
    assert causal_lm_flops_per_token(**TINY_LLAMA) == TINY_LLAMA_FLOPS


def test_flops_per_token_defaults_gpt2_style_mlp_and_no_gqa():
    # L=1, h=4, 1 head, s=2, V=10, I=4h=16, 2-matrix MLP:
    #   attention 4*4 * 4 = 64; MLP 2 * 4*16 = 128; lm_head 4*10 = 40 -> N = 232
    #   6*232 + 12*1*4*2 = 1392 + 96 = 1488
    assert causal_lm_flops_per_token(1, 4, 1, 2, 10, gated_mlp=False) == 1488


def test_flops_weight_count_agrees_with_nanogpt_for_gpt2_small():
    # nanoGPT prints 123.65M non-embedding parameters for GPT-2 small (123,653,376); our matmul-weight count
    # leaves out the LayerNorms and biases (121,344 of them), so the 6N part must be 6 * 123,532,032.
    flops = causal_lm_flops_per_token(12, 768, 12, 1024, 50257, gated_mlp=False)
    attention = 12 * 12 * 768 * 1024
    assert flops - attention == 6 * (123_653_376 - 121_344)


def test_flops_from_a_llama_config_like_object():
    config = SimpleNamespace(num_hidden_layers=2, hidden_size=8, num_attention_heads=2, num_key_value_heads=1,
                             intermediate_size=16, vocab_size=16, max_position_embeddings=4)
    assert flops_per_token_from_config(config) == TINY_LLAMA_FLOPS
    # A shorter training sequence only shrinks the attention term: 12*2*8*(4-2) fewer.
    assert flops_per_token_from_config(config, seq_len=2) == TINY_LLAMA_FLOPS - 12 * 2 * 8 * 2


def test_flops_from_config_names_what_is_missing():
    config = SimpleNamespace(num_hidden_layers=2, hidden_size=8, num_attention_heads=None, vocab_size=16)
    with pytest.raises(ValueError, match="num_attention_heads, max_position_embeddings"):
        flops_per_token_from_config(config)


def test_mfu_is_achieved_over_peak_flops():
    # 1000 tokens/s * 1e9 FLOPs/token = 1e12 FLOP/s on a 4e12 FLOP/s device -> 25 %.
    assert mfu(1000, 1e9, 4e12) == pytest.approx(0.25)
    with pytest.raises(ValueError):
        mfu(1000, 1e9, 0)


def test_batch_counts_reads_shapes_of_dicts_lists_and_tensors():
    import paddle

    ids = np.zeros((4, 16), dtype="int64")
    assert batch_counts({"input_ids": ids, "labels": ids[:, :3]}) == (4, 64)
    assert batch_counts({"pixels": np.zeros((5, 3, 2, 2))}) == (5, 0)  # no input_ids: samples only, no tokens
    assert batch_counts([paddle.zeros([2, 7], dtype="int64")]) == (2, 14)
    assert batch_counts(np.zeros(3)) == (3, 3)
    with pytest.raises(ValueError):
        batch_counts({"meta": "no tensors"})


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_throughput_meter_rates_over_the_interval_then_resets():
    clock = FakeClock()
    meter = ThroughputMeter(clock=clock)
    micro_batch = {"input_ids": np.zeros((4, 32), dtype="int64")}
    for _ in range(4):  # 4 steps of 2 micro-batches of 4 x 32 tokens over 2 s
        meter.update([micro_batch, micro_batch])
        clock.now += 0.5
    report = meter.report(flops_per_token=1e9, peak_flops=1e12)
    assert report == pytest.approx({
        "samples_per_second": 16.0, "steps_per_second": 2.0, "step_time": 0.5, "tokens_per_second": 512.0,
        "tflops_per_device": 512 * 1e9 / 1e12, "mfu": 512 * 1e9 / 1e12,
    })
    clock.now += 1.0
    meter.add(samples=2)  # no tokens counted: no token or FLOPs rates
    assert meter.report() == pytest.approx({"samples_per_second": 2.0, "steps_per_second": 1.0, "step_time": 1.0})


def test_throughput_meter_scales_to_global_counts_and_back_to_per_device_for_mfu():
    clock = FakeClock()
    meter = ThroughputMeter(clock=clock)
    # This rank reads 2 x 8 tokens per step; 4 data ranks read the same, and the run has 8 devices (dp4 x tp2).
    meter.update([{"input_ids": np.zeros((2, 8))}], per_rank_to_global=4)
    clock.now += 1.0
    report = meter.report(flops_per_token=1e9, peak_flops=1e12, num_devices=8)
    assert report["samples_per_second"] == 8.0 and report["tokens_per_second"] == 64.0
    assert report["tokens_per_second_per_device"] == 8.0
    assert report["tflops_per_device"] == pytest.approx(8e9 / 1e12)
    assert report["mfu"] == pytest.approx(8e9 / 1e12)


def test_throughput_meter_reports_nothing_without_steps_and_can_peek_without_reset():
    clock = FakeClock()
    meter = ThroughputMeter(clock=clock)
    clock.now += 1
    assert meter.report() == {}
    meter.add(samples=4, steps=2)
    clock.now += 2
    assert meter.report(reset=False)["steps_per_second"] == 1.0
    assert meter.report()["step_time"] == 1.0 and meter.steps == 0
