"""clip_grad_norm in one process equals paddle.nn.ClipGradByGlobalNorm (the math every layout must match)."""
import numpy as np
import paddle

from paddletrainer.parallel import clip_grad_norm, parallelize
from paddletrainer.parallel.collectives import _scale_in_place
from paddletrainer.parallel.config import ParallelConfig
from paddletrainer.parallel.topology import Topology

ONE = Topology.of()  # one process


def _train(clip_with_paddle: bool, max_norm: float, steps: int = 3):
    paddle.seed(3)
    model = paddle.nn.Sequential(paddle.nn.Linear(4, 8), paddle.nn.Tanh(), paddle.nn.Linear(8, 1))
    clip = paddle.nn.ClipGradByGlobalNorm(max_norm) if clip_with_paddle else None
    opt = paddle.optimizer.AdamW(learning_rate=0.05, parameters=model.parameters(), grad_clip=clip)
    if not clip_with_paddle:
        model, opt = parallelize(model, opt, ONE, ParallelConfig(layout=ONE.layout))
    rng = np.random.RandomState(0)
    norms = []
    for _ in range(steps):
        x = paddle.to_tensor(rng.randn(6, 4).astype("float32"))
        loss = (model(x) ** 2).mean() * 10
        loss.backward()
        if clip_with_paddle:
            norms.append(float(paddle.sqrt(sum((p.grad ** 2).sum() for p in model.parameters()))))
        else:
            opt.sync_gradients()
            norms.append(float(clip_grad_norm(model, opt, ONE, max_norm)))
        opt.step()
        opt.clear_grad()
    return norms, [p.numpy() for p in model.parameters()]


def test_clip_grad_norm_matches_paddle_clip_grad_by_global_norm():
    ours_norms, ours_params = _train(False, max_norm=0.5)
    ref_norms, ref_params = _train(True, max_norm=0.5)
    assert max(ref_norms) > 0.5  # clipping is active
    np.testing.assert_allclose(ours_norms, ref_norms, rtol=1e-6)
    for a, b in zip(ours_params, ref_params):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


def test_clip_grad_norm_with_no_limit_only_measures():
    norms, params = _train(False, max_norm=0.0)
    unclipped_norms, unclipped_params = _train(True, max_norm=1e9)
    np.testing.assert_allclose(norms, unclipped_norms, rtol=1e-6)
    for a, b in zip(params, unclipped_params):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


def test_the_cpu_scale_kernel_gives_the_broadcasting_multiplys_product():
    # clip_grad_norm scales float32 gradients on CPU with scale_ (a tensor scale, no host read), and with the
    # broadcasting multiply everywhere else: the products must be the same numbers.
    rng = np.random.RandomState(1)
    values = np.concatenate([rng.randn(4099) * 10.0 ** rng.randint(-30, 30, size=4099), [0.0, -0.0, 1e-38, -3e38]])
    for coef_value in (0.37, 1.0, 1e-7, 0.999999):
        grad = paddle.to_tensor(values.astype("float32"))
        coef = paddle.full([], coef_value, dtype="float32")
        assert grad.place.is_cpu_place() and coef.place.is_cpu_place()  # the scale_ branch
        expected = (grad * coef).numpy()
        _scale_in_place(grad, coef, {})
        np.testing.assert_array_equal(grad.numpy(), expected)
