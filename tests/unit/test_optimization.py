"""LR schedules follow their formulas; the optimizer skips decay for biases and norm weights."""
import math
from types import SimpleNamespace

import paddle
import pytest

from paddletrainer.optimization import create_optimizer, get_scheduler, no_decay_parameter_names


def lrs(name, steps=10, **kw):
    sched = get_scheduler(name, learning_rate=1.0, num_warmup_steps=2, num_training_steps=steps, **kw)
    out = []
    for _ in range(steps + 1):
        out.append(sched.get_lr())
        sched.step()
    return out


def test_linear_warms_up_then_decays_to_zero():
    v = lrs("linear")
    assert v[:3] == pytest.approx([0.0, 0.5, 1.0])
    assert v[6] == pytest.approx((10 - 6) / 8)
    assert v[10] == pytest.approx(0.0)


def test_cosine_follows_half_cosine_and_honours_min_learning_rate():
    v = lrs("cosine")
    assert v[6] == pytest.approx(0.5 * (1 + math.cos(math.pi * 0.5)))
    assert v[10] == pytest.approx(0.0, abs=1e-12)
    floored = lrs("cosine", min_learning_rate=0.1)
    assert floored[10] == pytest.approx(0.1)
    assert floored[6] == pytest.approx(0.1 + 0.9 * 0.5)


def test_polynomial_ends_at_lr_end_with_power():
    v = lrs("polynomial", lr_end=0.01, power=2.0)
    assert v[10] == pytest.approx(0.01)
    assert v[6] == pytest.approx((1 - 0.01) * (0.5**2) + 0.01)


def test_constant_and_constant_with_warmup():
    assert lrs("constant")[:3] == [1.0, 1.0, 1.0]
    assert lrs("constant_with_warmup")[:4] == pytest.approx([0.0, 0.5, 1.0, 1.0])


def test_unknown_scheduler_is_rejected_with_its_name():
    with pytest.raises(ValueError, match="cosine_with_bumps"):
        get_scheduler("cosine_with_bumps", learning_rate=1.0)


class Tiny(paddle.nn.Layer):
    def __init__(self):
        super().__init__()
        self.fc = paddle.nn.Linear(4, 4)
        self.norm = paddle.nn.LayerNorm(4)


def test_weight_decay_skips_biases_and_norm_weights():
    model = Tiny()
    skip = no_decay_parameter_names(model)
    assert skip == {model.fc.bias.name, model.norm.weight.name, model.norm.bias.name}
    opt = create_optimizer(model, 0.1, optim="adamw", weight_decay=0.5)
    # AdamW's decay hook decides per parameter name
    assert opt._apply_decay_param_fun(model.fc.weight.name) is True
    assert opt._apply_decay_param_fun(model.fc.bias.name) is False
    # under sharding stage 3 the optimizer sees slices named "slice@<name>": same decision
    assert opt._apply_decay_param_fun("slice@" + model.fc.weight.name) is True
    assert opt._apply_decay_param_fun("slice@" + model.norm.weight.name) is False
    lamb = create_optimizer(model, 0.1, optim="lamb", weight_decay=0.5)
    assert lamb._exclude_from_weight_decay_fn(SimpleNamespace(name="slice@" + model.norm.weight.name)) is True


@pytest.mark.parametrize("optim", ["adamw", "adam", "sgd", "momentum", "lamb"])
def test_each_supported_optimizer_takes_a_step(optim):
    paddle.seed(0)
    model = Tiny()
    opt = create_optimizer(model, 0.1, optim=optim, weight_decay=0.01)
    before = model.fc.weight.numpy().copy()
    model.norm(model.fc(paddle.ones([2, 4]))).sum().backward()
    opt.step()
    assert (model.fc.weight.numpy() != before).any()
