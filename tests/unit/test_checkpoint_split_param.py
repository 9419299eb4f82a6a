"""Sharding stage 1 V2 (split_param) optimizer states: a slice parameter's moments are flat ranges of the
parameter, its beta powers stay per-parameter scalars, even when the slice has one element."""
import paddle
from paddle.base.framework import EagerParamBase

from paddletrainer.checkpoint.local_state import ensure_accumulators, rank_state


def model_and_one_element_slice(start=5):
    """A [4, 3] weight and an AdamW stepping a 1-element split_param slice of it (flat range [start, start+1))."""
    paddle.seed(0)
    model = paddle.nn.Linear(4, 3, bias_attr=False)
    weight = model.weight
    slice_param = EagerParamBase(shape=[1], dtype=weight.dtype, name=weight.name)  # V2 names it like the param
    slice_param.set_value(weight.numpy().reshape(-1)[start:start + 1])
    slice_param.ckpt_flat_range = (start, start + 1)
    opt = paddle.optimizer.AdamW(learning_rate=0.1, parameters=[slice_param])
    ensure_accumulators(opt)
    return model, opt


def test_one_element_slice_keeps_beta_powers_per_parameter_and_moments_as_its_flat_range():
    model, opt = model_and_one_element_slice()
    placed = {key.rsplit("/", 1)[1]: lt.placement for key, lt in rank_state(model, opt).optims.items()}
    for kind in ("beta1_pow_acc", "beta2_pow_acc"):
        assert placed[kind].flat is None and tuple(placed[kind].global_shape) == (1,), kind
    for kind in ("moment1", "moment2"):
        assert placed[kind].flat == (5, 6) and tuple(placed[kind].global_shape) == (4, 3), kind

