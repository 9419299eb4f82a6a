"""``scripts/cost_measure.py`` prices counted collectives with gloo's and NCCL's algorithms; the NCCL prices of the
calls each sharding stage makes are the model's minimum, and gloo's reduce is priced per call (its cost per
byte grows above 4 MiB)."""
from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


def _script_module(name: str):
    if str(SCRIPTS) not in sys.path:  # a plain import: its dataclasses need the module in sys.modules
        sys.path.insert(0, str(SCRIPTS))
    return importlib.import_module(name)


@pytest.fixture(scope="module")
def cm():
    """The model: ``scripts/cost_model.py``."""
    return _script_module("cost_model")


@pytest.fixture(scope="module")
def pricing():
    """The measuring side, where the pricing lives: ``scripts/cost_measure.py``."""
    return _script_module("cost_measure")


def test_stage3_reduce_scatter_and_all_gathers_priced_with_nccl_are_the_models_minimum(cm, pricing):
    c = cm.tiny_config(512)
    lay = cm.Layout(sharding=2, stage=3, micro_batch=2, global_batch=8)  # 2 micro-batches per step
    W = G = cm.param_counts(c, lay)["rank"] * 4
    m = lay.grad_accum
    # per micro-batch: all-gather the parameters for forward and again for backward, reduce-scatter the gradients
    calls = {"all_gather@2": {str(W): 2 * m}, "reduce_scatter@2": {str(G): m}}
    minimum = cm.communication(c, lay)["sharding"]["min_wire"]
    assert pricing.priced_wire(calls, "nccl") == pytest.approx(minimum)
    # the same gradients all-reduced (Paddle's own stage-3 hook) cost the gradient half twice over
    paddle_calls = {"all_gather@2": {str(W): 2 * m}, "all_reduce@2": {str(G): m}}
    assert pricing.priced_wire(paddle_calls, "nccl") == pytest.approx(minimum * 4 / 3)
    # on gloo the CPU backend's reduce-scatter is an all-reduce: the same wire as Paddle's hook
    assert pricing.priced_wire(calls, "gloo") == pytest.approx(pricing.priced_wire(paddle_calls, "gloo"))


def test_stage1_reduce_and_broadcast_priced_with_nccl_are_the_minimum_and_gloo_reduce_costs_one_and_a_half(cm, pricing):
    c = cm.tiny_config(512)
    lay = cm.Layout(sharding=2, stage=1, micro_batch=2, global_batch=8)
    G = cm.param_counts(c, lay)["rank"] * 4
    n = 64  # reduce each gradient to its owner, broadcast each parameter from it: calls of G/64 (< 1 MiB)
    per_param = G // n
    assert per_param * n == G
    calls = {"reduce@2": {str(per_param): n}, "broadcast@2": {str(per_param): n}}
    minimum = cm.communication(c, lay)["sharding"]["min_wire"]
    assert pricing.priced_wire(calls, "nccl") == pytest.approx(minimum)
    assert pricing.priced_wire(calls, "gloo") == pytest.approx(minimum * (0.75 + 0.5) / (0.5 + 0.5))


def test_gloo_reduce_is_priced_per_call_size(pricing):
    small, large = 4 << 20, 16 << 20
    assert pricing.wire_factor("reduce", 2, "gloo", small) == pytest.approx(0.75)
    assert pricing.wire_factor("reduce", 2, "gloo", large) == pytest.approx(1.125)  # 1.25 − 2 MiB / 16 MiB
    one_large = pricing.priced_wire({"reduce@2": {str(large): 1}}, "gloo")
    four_small = pricing.priced_wire({"reduce@2": {str(small): 4}}, "gloo")
    assert one_large > four_small  # same bytes, more wire in one big call
    assert pricing.priced_wire({"reduce@2": {str(large): 1}}, "nccl") == pytest.approx(large / 2)
    assert pricing.priced_wire({"mystery@2": {"8": 1}}, "gloo") is None
