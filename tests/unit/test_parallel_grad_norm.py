"""The public global_grad_norm / clip_grad_norm synchronise the gradients themselves, exactly once per step, and
sum half-precision squares in float32."""
import numpy as np
import paddle

from paddletrainer.parallel import clip_grad_norm, collectives, global_grad_norm
from paddletrainer.parallel.data_parallel import LocalOptimizer
from paddletrainer.parallel.sharding import Stage2Optimizer
from paddletrainer.parallel.topology import Topology

ONE = Topology.of()  # one process


class HalvingStage2Model:
    """What ``ParallelOptimizer.sync_gradients`` calls on a ``GroupShardedStage2`` model, for a sharding degree
    of 2 in one process: ``_grad_scale`` multiplies every gradient by 1/2 in place, as Paddle's does by
    1/sharding. Running it twice in one step would halve the gradients twice."""

    def __init__(self, params):
        self.params = params

    def _grad_scale(self):
        for p in self.params:
            p.grad.scale_(0.5)

    def _dp_allreduce(self):
        pass


def _stage2_optimizer(params):
    inner = paddle.optimizer.SGD(learning_rate=0.1, parameters=params)
    inner._param2rank = {p.name: 0 for p in params}  # this rank owns every parameter
    inner._local_params = params
    return Stage2Optimizer(inner, topology=ONE, model=HalvingStage2Model(params))


def _backward(params, seed):
    rng = np.random.RandomState(seed)
    loss = sum((p * paddle.to_tensor(rng.randn(*p.shape).astype("float32"))).sum() for p in params)
    loss.backward()
    # the norm of the synchronised (halved) gradients
    return float(np.sqrt(sum(((p.grad.numpy().astype("float64") / 2) ** 2).sum() for p in params)))


def _params():
    paddle.seed(0)
    return [paddle.create_parameter([3, 4], "float32"), paddle.create_parameter([5], "float32")]


def test_clip_grad_norm_synchronises_the_gradients_when_the_caller_did_not():
    params = _params()
    optimizer = _stage2_optimizer(params)
    synced_norm = _backward(params, seed=1)
    np.testing.assert_allclose(float(clip_grad_norm(None, optimizer, ONE, 0.0)), synced_norm, rtol=1e-6)


def test_global_grad_norm_synchronises_the_gradients_when_the_caller_did_not():
    params = _params()
    optimizer = _stage2_optimizer(params)
    synced_norm = _backward(params, seed=1)
    np.testing.assert_allclose(float(global_grad_norm(optimizer, ONE)), synced_norm, rtol=1e-6)


def test_the_norm_is_the_same_after_the_loops_sync_when_measured_twice_and_after_the_step():
    params = _params()
    optimizer = _stage2_optimizer(params)
    synced_norm = _backward(params, seed=1)
    optimizer.sync_gradients()  # the Trainer loop's explicit call
    norms = [clip_grad_norm(None, optimizer, ONE, 0.0), clip_grad_norm(None, optimizer, ONE, 0.0),
             global_grad_norm(optimizer, ONE)]
    optimizer.step()
    norms.append(global_grad_norm(optimizer, ONE))  # still this step's gradients until clear_grad
    np.testing.assert_allclose([float(n) for n in norms], [synced_norm] * 4, rtol=1e-6)


def test_clear_grad_ends_the_step_so_the_next_steps_gradients_are_synchronised_again():
    params = _params()
    optimizer = _stage2_optimizer(params)
    _backward(params, seed=1)
    optimizer.sync_gradients()
    optimizer.step()
    optimizer.clear_grad()
    next_norm = _backward(params, seed=2)
    np.testing.assert_allclose(float(global_grad_norm(optimizer, ONE)), next_norm, rtol=1e-6)


def test_half_precision_squares_are_summed_in_float32():
    # bf16 has 8 significant bits: 256 + 1 + 1 + 1 is 259 in float32 but 256 or 260 in bf16
    def param(dtype):
        return paddle.create_parameter([1], dtype, default_initializer=paddle.nn.initializer.Constant(1.0))

    bf16 = [param("bfloat16") for _ in range(4)]
    fp16 = param("float16")  # its square, 300² = 90000, is past fp16's largest value, 65504
    loss = sum((p.astype("float32") * c).sum() for p, c in zip(bf16 + [fp16], [16.0, 1.0, 1.0, 1.0, 300.0]))
    loss.backward()
    assert {p.grad.dtype for p in bf16} == {paddle.bfloat16} and fp16.grad.dtype == paddle.float16
    assert {collectives._squares(p.grad).dtype for p in bf16 + [fp16]} == {paddle.float32}  # what is summed
    optimizer = LocalOptimizer(paddle.optimizer.SGD(parameters=bf16 + [fp16]), topology=ONE)
    norm = global_grad_norm(optimizer, ONE)
    assert norm.dtype == paddle.float32
    np.testing.assert_allclose(float(norm), np.sqrt(259.0 + 90000.0), rtol=1e-6)
    # without fp16's square, bf16 rounding of the sum (±1 in 259) would be far beyond the tolerance
    optimizer = LocalOptimizer(paddle.optimizer.SGD(parameters=bf16), topology=ONE)
    np.testing.assert_allclose(float(global_grad_norm(optimizer, ONE)), np.sqrt(259.0), rtol=1e-6)
