"""The per-rank state arithmetic (paddletrainer.planning.memory_model): ZeRO divisions, masters, dp buffers."""
from __future__ import annotations

import pytest

from paddletrainer.planning import state_bytes_per_rank

N = 1_000_000


def test_fp32_adamw_one_process_is_16_bytes_per_parameter():
    s = state_bytes_per_rank(N)
    assert (s.params, s.grads, s.optimizer, s.master, s.comm_buffers) == (4 * N, 4 * N, 8 * N, 0, 0)
    assert s.total == 16 * N


@pytest.mark.parametrize("stage, divided", [(1, {"optimizer"}), (2, {"optimizer", "grads"}),
                                            (3, {"optimizer", "grads", "params"})])
def test_each_sharding_stage_divides_its_states(stage, divided):
    one = state_bytes_per_rank(N).as_dict()
    sharded = state_bytes_per_rank(N, sharding=4, stage=stage).as_dict()
    for key in ("params", "grads", "optimizer"):
        assert sharded[key] == (one[key] / 4 if key in divided else one[key]), key


def test_bf16_keeps_fp32_masters_and_moments_sharded_from_stage_1():
    s = state_bytes_per_rank(N, dtype="bfloat16")
    assert (s.params, s.grads, s.optimizer, s.master) == (2 * N, 2 * N, 8 * N, 4 * N)
    s1 = state_bytes_per_rank(N, dtype="bfloat16", sharding=2, stage=1)
    assert (s1.optimizer, s1.master) == (4 * N, 2 * N)
    assert state_bytes_per_rank(N, dtype="bfloat16", master_weights=False).optimizer == 4 * N


def test_dp_adds_a_gradient_copy_unless_the_gradients_are_buffer_views():
    assert state_bytes_per_rank(N, dp=2).comm_buffers == 4 * N
    assert state_bytes_per_rank(N, dp=2, grads_in_comm_buffers=True).comm_buffers == 0
    assert state_bytes_per_rank(N, optimizer="sgd").optimizer == 0


@pytest.mark.parametrize("kwargs, word", [(dict(dtype="int8"), "dtype"), (dict(optimizer="rmsprop"), "optimizer"),
                                          (dict(dp=0), "dp"), (dict(sharding=2), "stage"),
                                          (dict(stage=2), "stage")])
def test_bad_input_is_named(kwargs, word):
    with pytest.raises(ValueError, match=word):
        state_bytes_per_rank(N, **kwargs)
