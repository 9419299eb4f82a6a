"""A model built under ``paddle.LazyGuard``: stage 3's per-rank slices hold exactly what one process built
eagerly from the same seed has there, no sliced parameter is ever materialised, and every layout stage 3 cannot
start from slices refuses such a model by name before any process group."""
import types

import numpy as np
import paddle
import pytest

from paddletrainer import Trainer, TrainingArguments
from paddletrainer.parallel import lazy_init


class WholeNormal(paddle.nn.initializer.Normal):
    """A user's initializer (its own ``forward``): not one whose stream lazy_init knows how to draw in pieces."""

    def forward(self, var, block=None):
        return super().forward(var, block)


class Net(paddle.nn.Layer):
    """One parameter per initializer kind the slices are drawn for, one drawn whole (a user's initializer),
    and one created after the sublayers but listed first by ``parameters()``."""

    def __init__(self):
        super().__init__()
        attr = paddle.ParamAttr
        self.xavier = paddle.nn.Linear(7, 9)  # Xavier-uniform weight (fans of the whole shape), zero bias
        self.normal = paddle.nn.Linear(5, 7, weight_attr=attr(initializer=paddle.nn.initializer.Normal(0, 0.1)))
        self.trunc = paddle.nn.Linear(3, 11, weight_attr=attr(initializer=paddle.nn.initializer.TruncatedNormal()))
        self.kaiming = paddle.nn.Linear(4, 6, weight_attr=attr(initializer=paddle.nn.initializer.KaimingNormal()))
        self.whole = paddle.nn.Linear(6, 6, weight_attr=attr(initializer=WholeNormal(0, 0.1)))
        self.small = paddle.create_parameter([3], "float32")  # at or below the segment size: whole


def _flat_padded(value, start, end):
    flat = np.concatenate([value.ravel(), np.zeros(max(end - value.size, 0), value.dtype)])
    return flat[start:end]


@pytest.mark.parametrize("nranks", [2, 3])
def test_each_ranks_slices_equal_the_eager_models_and_nothing_sliced_is_materialised(monkeypatch, nranks):
    monkeypatch.setattr(lazy_init, "CHUNK", 4)  # many chunks per parameter; odd-sized tails (Normal draws pairs)
    paddle.seed(11)
    eager = {p.name: p.numpy() for p in Net().parameters()}
    for rank in range(nranks):
        paddle.seed(11)
        with paddle.LazyGuard():
            model = Net()
        assert lazy_init.is_lazy(model)
        ranges = lazy_init.stage3_slice_ranges(model, rank=rank, nranks=nranks, segment_size=3, device="cpu")
        lazy_init.materialize_stage3(model, ranges)
        assert not lazy_init.is_lazy(model)
        for param, value in zip(model.parameters(), eager.values()):
            if param.name in ranges:
                start, end = ranges[param.name]
                assert not param._is_initialized(), f"{param.name} was materialised whole"
                np.testing.assert_array_equal(getattr(param, lazy_init.SLICE_ATTR).numpy(),
                                              _flat_padded(value, start, end), err_msg=param.name)
            else:
                np.testing.assert_array_equal(param.numpy(), value, err_msg=param.name)
        assert len(ranges) == 10  # every weight and bias (6..99 elements) sliced, not the 3-element parameter


def test_the_ranks_ranges_tile_the_padded_buffer_as_paddle_aligns_it():
    with paddle.LazyGuard():
        model = Net()
    per_rank = [lazy_init.stage3_slice_ranges(model, rank=r, nranks=2, segment_size=20, device="cpu")
                for r in range(2)]
    for name, (start, end) in per_rank[0].items():
        assert start == 0 and per_rank[1][name] == (end, 2 * end)
        assert 2 * end == 1024  # Paddle's CPU alignment: 4096 bytes of fp32


@pytest.mark.parametrize("stage,offload,cast,refused", [
    (0, False, False, r'only sharding stage 3 \(sharding="stage3"'),
    (2, False, False, r'only sharding stage 3 \(sharding="stage3"'),
    (3, True, False, "without sharding offload"),
    (3, False, True, "without fp16_opt_level O2"),
])
def test_a_lazy_model_is_refused_where_stage3_cannot_start_it_from_slices(stage, offload, cast, refused):
    with paddle.LazyGuard():
        model = Net()
    config = types.SimpleNamespace(sharding_stage=stage, sharding_offload=offload)
    with pytest.raises(ValueError, match=r"Net was built under paddle\.LazyGuard.*" + refused):
        lazy_init.check_lazy_model(model, config, cast)
    lazy_init.check_lazy_model(Net(), config, cast)  # an eagerly built model: nothing to refuse


def test_the_trainer_refuses_a_lazy_model_without_stage3_before_any_group(tmp_path, monkeypatch):
    import paddletrainer.trainer as trainer_module

    def no_groups(*_):
        raise AssertionError("init_topology was reached")

    monkeypatch.setattr(trainer_module, "init_topology", no_groups)
    with paddle.LazyGuard():
        model = Net()
    args = TrainingArguments(output_dir=str(tmp_path), report_to="none")
    with pytest.raises(ValueError, match=r"Net was built under paddle\.LazyGuard"):
        Trainer(model=model, args=args)


def test_a_lazy_model_without_a_recorded_creation_order_is_refused_by_name():
    with paddle.LazyGuard():
        model = Net()
    unrecorded = model.xavier.weight  # as if built before paddletrainer's Trainer (and with it lazy_init) was imported
    delattr(unrecorded, lazy_init.ORDER_ATTR)
    config = types.SimpleNamespace(sharding_stage=3, sharding_offload=False)
    with pytest.raises(ValueError, match=rf"before paddletrainer's Trainer was imported \({unrecorded.name} has no"):
        lazy_init.check_lazy_model(model, config)


def test_a_lazy_model_from_model_init_is_refused_under_o2_like_one_passed_in():
    with paddle.LazyGuard():
        model = Net()
    config = types.SimpleNamespace(sharding_stage=3, sharding_offload=False)
    with pytest.raises(ValueError, match="without fp16_opt_level O2"):
        lazy_init.start_lazy_model(model, None, config, rewind_rng=False, weights_cast=True)
