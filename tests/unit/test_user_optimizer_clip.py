"""A user's optimizer keeps its clip and its groups' settings: the clip is lifted off the optimizer and applied
after the gradient sync exactly as Paddle applies it in one process (per parameter group), clip classes that
cannot be honoured on a layout are refused by name, and sharding stage 2 keeps each group's weight decay."""
import numpy as np
import paddle
import pytest

from paddletrainer import checks
from paddletrainer.parallel.clipping import (GradientClip, check_gradient_clip, clip_gradients,
                                             take_gradient_clip)
from paddletrainer.parallel.config import ParallelConfig
from paddletrainer.parallel.layout import Layout
from paddletrainer.parallel.data_parallel import LocalOptimizer
from paddletrainer.parallel.sharding import _parameter_settings_kept
from paddletrainer.parallel.topology import Topology

ONE = Topology.of()  # one process


def _params(n=4, seed=0):
    paddle.seed(seed)
    return [paddle.create_parameter([3, 5], "float32") for _ in range(n)]


def _set_grads(params, seed):
    rng = np.random.RandomState(seed)
    loss = sum((p * paddle.to_tensor(rng.randn(*p.shape).astype("float32") * (i + 1))).sum()
               for i, p in enumerate(params))
    loss.backward()


def _groups(params, **extra):
    first = {"params": params[:2], "learning_rate": 0.5, "weight_decay": 0.1, **extra.get("first", {})}
    second = {"params": params[2:], **extra.get("second", {})}
    return [first, second]


def _paddle_clipped(params, seed, build):
    """The gradients after Paddle's own step-time clip, per group (what one process applies)."""
    optimizer = build(params)
    _set_grads(params, seed)
    out = {}
    for group in optimizer._param_groups:
        clip = group["grad_clip"]
        pairs = [(p, p.grad) for p in group["params"]]
        for p, g in (clip(pairs) if clip is not None else pairs):
            out[p.name] = g.numpy()
    return [out[p.name] for p in params]


def _ours_clipped(params, seed, build):
    optimizer = build(params)
    clip = take_gradient_clip(optimizer)
    _set_grads(params, seed)
    clip_gradients(LocalOptimizer(optimizer, topology=ONE), ONE, clip)
    return [p.grad.numpy() for p in params], optimizer


@pytest.mark.parametrize("variant", ["optimizer_clip", "per_group_clip", "by_value", "need_clip_false"])
def test_the_users_clip_is_applied_per_group_as_paddle_applies_it(variant):
    def build(params):
        if variant == "optimizer_clip":
            groups, clip = _groups(params), paddle.nn.ClipGradByGlobalNorm(0.5)
        elif variant == "per_group_clip":
            groups = _groups(params, first={"grad_clip": paddle.nn.ClipGradByGlobalNorm(0.3)},
                             second={"grad_clip": paddle.nn.ClipGradByGlobalNorm(4.0)})
            clip = None
        elif variant == "by_value":
            groups, clip = _groups(params), paddle.nn.ClipGradByValue(0.7, -0.7)
        else:
            params[0].need_clip = False  # Paddle leaves it out of the norm and the scaling
            groups, clip = _groups(params), paddle.nn.ClipGradByGlobalNorm(0.5)
        return paddle.optimizer.AdamW(learning_rate=0.1, parameters=groups, grad_clip=clip)

    expected = _paddle_clipped(_params(), 3, build)
    got, optimizer = _ours_clipped(_params(), 3, build)
    for ours, paddles in zip(got, expected):
        np.testing.assert_allclose(ours, paddles, rtol=1e-6, atol=1e-7)
    # the clip is gone from the optimizer and its groups: Paddle's step will not clip a second time
    assert optimizer._grad_clip is None and all(g["grad_clip"] is None for g in optimizer._param_groups)


def test_a_flat_parameter_list_with_grad_clip_is_one_global_norm_clip():
    params = _params()
    optimizer = paddle.optimizer.AdamW(learning_rate=0.1, parameters=params,
                                       grad_clip=paddle.nn.ClipGradByGlobalNorm(0.5))
    clip = take_gradient_clip(optimizer)
    _set_grads(params, 5)
    raw = [p.grad.numpy().astype("float64") for p in params]
    norm = clip_gradients(LocalOptimizer(optimizer, topology=ONE), ONE, clip)
    total = np.sqrt(sum((g ** 2).sum() for g in raw))
    np.testing.assert_allclose(float(norm), total, rtol=1e-6)
    for p, g in zip(params, raw):
        np.testing.assert_allclose(p.grad.numpy(), g * 0.5 / max(total, 0.5), rtol=1e-6)


def test_no_clip_only_measures_the_global_norm():
    params = _params()
    optimizer = paddle.optimizer.AdamW(learning_rate=0.1, parameters=_groups(params))
    clip = take_gradient_clip(optimizer)
    assert clip.groups == [] and clip.describe() == "no gradient clipping"
    _set_grads(params, 7)
    raw = [p.grad.numpy() for p in params]
    norm = clip_gradients(LocalOptimizer(optimizer, topology=ONE), ONE, clip)
    np.testing.assert_allclose(float(norm), np.sqrt(sum((g.astype("float64") ** 2).sum() for g in raw)), rtol=1e-6)
    for p, g in zip(params, raw):
        np.testing.assert_array_equal(p.grad.numpy(), g)


def test_the_trainers_max_grad_norm_is_one_global_clip_and_zero_is_none():
    assert GradientClip.global_norm(0.0).groups == [] and GradientClip.global_norm(None).groups == []
    (group,) = GradientClip.global_norm(2.5).groups
    assert isinstance(group.clip, paddle.nn.ClipGradByGlobalNorm) and group.members is None


def test_clip_classes_that_cannot_be_honoured_are_refused_by_name():
    class MyClip(paddle.nn.ClipGradByGlobalNorm):
        pass

    params = _params()
    with pytest.raises(ValueError, match="auto_skip_clip"):
        take_gradient_clip(paddle.optimizer.AdamW(parameters=params, grad_clip=paddle.nn.ClipGradByGlobalNorm(
            1.0, auto_skip_clip=True)))
    by_norm = take_gradient_clip(paddle.optimizer.AdamW(parameters=params, grad_clip=paddle.nn.ClipGradByNorm(1.0)))
    check_gradient_clip(by_norm, whole_gradients=True)  # one process / plain dp: fine
    with pytest.raises(ValueError, match="ClipGradByNorm"):
        check_gradient_clip(by_norm, whole_gradients=False)
    assert MyClip  # subclasses of the supported classes are accepted as those classes


def test_parameter_groups_under_sharding_stage1_are_refused_before_any_process_group():
    params = _params()
    grouped = paddle.optimizer.AdamW(parameters=_groups(params))
    flat = paddle.optimizer.AdamW(parameters=params)
    stage1 = ParallelConfig(layout=Layout(world_size=2, sharding=2), sharding_stage=1)
    with pytest.raises(ValueError, match="parameter groups are not supported with --sharding stage1"):
        checks.check_optimizer_for_layout(grouped, stage1)
    checks.check_optimizer_for_layout(flat, stage1)
    for stage in (2, 3):
        checks.check_optimizer_for_layout(grouped, ParallelConfig(layout=Layout(world_size=2, sharding=2),
                                                                  sharding_stage=stage))


def test_stage2_construction_keeps_each_groups_weight_decay_decoupled():
    """Paddle's base Optimizer turns a group's float weight_decay into a coupled L2 regularizer on each parameter
    (what GroupShardedOptimizerStage2's constructor runs over the user's groups); the kept settings undo it. If
    Paddle stops doing that, the first assertion fails and the guard can go."""
    params = _params()
    groups = _groups(params)
    with _parameter_settings_kept(groups):
        paddle.optimizer.SGD(learning_rate=0.1, parameters=[dict(g) for g in groups])
        assert isinstance(params[0].regularizer, paddle.regularizer.L2Decay)  # what Paddle does inside
    assert all(p.regularizer is None for p in params)
    assert [p.optimize_attr["learning_rate"] for p in params] == [1.0] * 4  # as before: no AdamW built yet
