"""``parallel.wrappers``: the one place that knows where Paddle's wrappers keep the model and the optimizer."""
import paddle

from paddletrainer.parallel.data_parallel import LocalOptimizer
from paddletrainer.parallel.topology import Topology
from paddletrainer.parallel.wrappers import optimizer_layers, unwrap_model, unwrap_optimizer


class _Forwarding:
    """A wrapper that forwards unknown attributes (as fleet's HybridParallelOptimizer does): probing with getattr
    would see its inner optimizer's attributes as its own."""

    def __init__(self, inner, attribute):
        setattr(self, attribute, inner)

    def __getattr__(self, name):
        raise AssertionError(f"unwrap read {name!r} through __getattr__")


def test_unwrap_optimizer_reaches_the_paddle_optimizer_through_every_wrapper_kind():
    layer = paddle.nn.Linear(2, 2)
    adamw = paddle.optimizer.AdamW(parameters=layer.parameters())
    ours = LocalOptimizer(adamw, topology=Topology.of())
    assert unwrap_optimizer(ours) is adamw and optimizer_layers(ours) == [ours, adamw]
    # HybridParallelOptimizer -> DygraphShardingOptimizer -> the optimizer; GroupSharded* keep it in _optim
    sharding = _Forwarding(adamw, "_inner_opt")
    hybrid = _Forwarding(sharding, "_inner_opt")
    stage2 = _Forwarding(adamw, "_optim")
    assert optimizer_layers(LocalOptimizer(hybrid, topology=Topology.of()))[1:] == [
        hybrid, sharding, adamw]
    assert unwrap_optimizer(stage2) is adamw
    assert unwrap_optimizer(adamw) is adamw and unwrap_optimizer(None) is None


def test_a_wrapper_pointing_at_itself_ends_the_chain():
    stage3 = _Forwarding(None, "_inner_opt")
    stage3._inner_opt = stage3  # GroupShardedStage3 points _inner_opt at the optimizer itself
    assert optimizer_layers(stage3) == [stage3] and unwrap_optimizer(stage3) is stage3


def test_unwrap_model_reaches_the_users_layer():
    layer = paddle.nn.Linear(2, 2)
    wrapped = paddle.nn.Layer()
    wrapped._layers = layer
    assert unwrap_model(wrapped) is layer and unwrap_model(layer) is layer
