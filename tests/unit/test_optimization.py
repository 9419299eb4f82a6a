"""LR schedules follow their formulas; the optimizer skips decay for biases and norm weights."""
import math
from types import SimpleNamespace

import paddle
import pytest

from paddletrainer.optim.optimization import create_optimizer, get_scheduler, no_decay_parameter_names


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


class TwoHeads(paddle.nn.Layer):
    """A decayed weight, undecayed bias/norm, and a head used only from the third step (no gradient before)."""

    def __init__(self):
        super().__init__()
        self.fc = paddle.nn.Linear(4, 600)  # > one 512-element chunk of the CPU kernel
        self.norm = paddle.nn.LayerNorm(600)
        self.late = paddle.nn.Linear(600, 3)

    def forward(self, x, step):
        h = self.norm(self.fc(x))
        return (h * h).mean() + (self.late(h).sum() if step >= 2 else 0.0)


def _twin_runs(make_ours, make_paddle, steps=5):
    """Train two identical models, one with each optimizer; return (params, states) of both, in the same order."""
    out = []
    for make in (make_ours, make_paddle):
        paddle.seed(3)
        model = TwoHeads()
        sched = get_scheduler("linear", learning_rate=0.01, num_warmup_steps=1, num_training_steps=steps)
        opt = make(model, sched)
        for step in range(steps):
            x = paddle.to_tensor([[0.5, -1.0, 2.0, 0.25]] * 3) * (step + 1)
            model(x, step).backward()
            opt.step()
            opt.clear_grad()
            sched.step()
            if step == 0:  # no state yet for the head that has had no gradient
                assert not [k for k in opt.state_dict() if k.startswith(model.late.weight.name + "_")]
        # state names start with the parameter's unique name, whose counter depends on the layers built before
        # (linear_9 sorts after linear_10): key them by the parameter's position in the model instead
        position = {p.name + "_": f"param{i:03d}_" for i, p in enumerate(model.parameters())}

        def by_position(name):
            return next((position[pre] + name[len(pre):] for pre in position if name.startswith(pre)), name)

        state = {by_position(k): v for k, v in opt.state_dict().items() if k != "LR_Scheduler"}
        out.append(([p.numpy() for p in model.parameters()], [state[k].numpy() for k in sorted(state)], sorted(state)))
    return out


def test_adamw_step_is_bit_identical_to_paddles_adamw_with_the_same_state_names():
    from paddletrainer.optim.optimization import AdamW

    taken = []

    def ours(model, sched):
        opt = create_optimizer(model, sched, optim="adamw", weight_decay=0.1)
        assert type(opt) is AdamW
        direct = opt._direct_parameters
        opt._direct_parameters = lambda: taken.append(direct()) or taken[-1]
        return opt

    def theirs(model, sched):
        skip = no_decay_parameter_names(model)
        return paddle.optimizer.AdamW(learning_rate=sched, parameters=model.parameters(), weight_decay=0.1,
                                      apply_decay_param_fun=lambda name: name not in skip)

    (p_ours, s_ours, names_ours), (p_theirs, s_theirs, names_theirs) = _twin_runs(ours, theirs)
    assert len(taken) == 5 and all(t is not None for t in taken)  # the direct step ran every time
    for a, b in zip(p_ours + s_ours, p_theirs + s_theirs):
        assert a.dtype == b.dtype and (a == b).all()
    # same accumulators per parameter (names differ only by the parameters' unique-name counters)
    assert names_ours == names_theirs


@pytest.mark.parametrize("extra", [
    dict(grad_clip=paddle.nn.ClipGradByGlobalNorm(1e-3)),
    dict(amsgrad=True),
    dict(found_inf=False),
    dict(param_lr=3.0),
    # a Tensor is the parameter's learning rate itself in Paddle, not a factor of the global one: 1.0 means 1.0
    dict(param_lr_tensor=1.0),
    # where Paddle's Optimizer.step would read main_grad or _param_groups instead of AdamW.step's inputs
    dict(main_grad=True),
    dict(enable_tensor_fusion=True),
    dict(parameter_list_without_late_head=True),
], ids=["grad_clip", "amsgrad", "scaler_found_inf", "param_learning_rate", "param_learning_rate_tensor", "main_grad",
        "tensor_fusion", "parameter_list_is_not_param_groups"])
def test_adamw_takes_paddles_step_for_what_its_own_does_not_reproduce(extra):
    from paddletrainer.optim.optimization import AdamW

    def build(cls):
        def make(model, sched):
            if "param_lr" in extra:
                model.fc.weight.optimize_attr["learning_rate"] = extra["param_lr"]
            if "param_lr_tensor" in extra:
                model.fc.weight.optimize_attr["learning_rate"] = paddle.to_tensor(extra["param_lr_tensor"])
            if "main_grad" in extra:  # what mixed-precision layers and stage 3's use_main_grad attach
                model.fc.weight.main_grad = paddle.zeros_like(model.fc.weight)
            kwargs = {k: v for k, v in extra.items() if k in ("grad_clip", "amsgrad")}
            opt = cls(learning_rate=sched, parameters=model.parameters(), weight_decay=0.1, **kwargs)
            if "found_inf" in extra:  # what GradScaler._unscale leaves on the optimizer
                opt._set_auxiliary_var("found_inf", paddle.to_tensor(extra["found_inf"]))
            if "enable_tensor_fusion" in extra:
                opt.enable_tensor_fusion = True
            if "parameter_list_without_late_head" in extra:  # as stage 3 reassigns _parameter_list alone
                opt._parameter_list = [p for p in opt._parameter_list if p is not model.late.weight]
            if cls is AdamW:
                assert opt._direct_parameters() is None
            return opt
        return make

    (p_ours, s_ours, _), (p_theirs, s_theirs, _) = _twin_runs(build(AdamW), build(paddle.optimizer.AdamW), steps=3)
    for a, b in zip(p_ours + s_ours, p_theirs + s_theirs):
        assert (a == b).all()


def test_adamw_leaves_master_weight_parameters_to_paddles_step():
    # bf16 under multi_precision updates an fp32 master weight: Paddle's CPU build has no bf16 AdamW kernel to check
    # a direct call against, so that path stays Paddle's own
    from paddletrainer.optim.optimization import AdamW

    param = paddle.create_parameter([4, 4], dtype="bfloat16", default_initializer=paddle.nn.initializer.Constant(0.5))
    assert AdamW(learning_rate=0.1, parameters=[param], multi_precision=True)._direct_parameters() is None
    fp32 = paddle.create_parameter([4, 4], dtype="float32")
    assert AdamW(learning_rate=0.1, parameters=[fp32], multi_precision=True)._direct_parameters() == [fp32]
