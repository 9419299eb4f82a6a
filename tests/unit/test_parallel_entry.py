"""One way into ``parallel/``: ``init_topology``, ``build_strategy``, ``parallelize`` and ``apply_sharding`` take a
``ParallelConfig`` and nothing else, and trust it. The cases ``apply_sharding`` used to check a second time are
refused by ``ParallelConfig`` alone (the one verdict), each naming the option and what is valid."""
import paddle
import pytest

from paddletrainer import TrainingArguments
from paddletrainer.parallel import apply, topology as topo_mod
from paddletrainer.parallel.config import ParallelConfig, resolve_layout
from paddletrainer.parallel.layout import DEFAULT_TOPO_ORDER, Layout, hybrid_order
from paddletrainer.parallel.sharding import apply_sharding
from paddletrainer.parallel.topology import Topology


def _args(tmp_path):
    return TrainingArguments(output_dir=str(tmp_path), report_to="none")


@pytest.mark.parametrize("call", [
    lambda args: topo_mod.init_topology(args),
    lambda args: topo_mod.build_strategy(args, on_cpu=True),
    lambda args: topo_mod.check_cpu_options(args),
    lambda args: apply.parallelize(paddle.nn.Linear(2, 2), None, Topology.of(), args),
    lambda args: apply_sharding(paddle.nn.Linear(2, 2), None, topology=Topology.of(), config=args),
], ids=["init_topology", "build_strategy", "check_cpu_options", "parallelize", "apply_sharding"])
def test_the_entry_points_take_a_parallel_config_not_the_arguments(tmp_path, call):
    with pytest.raises(TypeError, match=r"takes a ParallelConfig \(TrainingArguments.parallel_config\), got "
                                        r"TrainingArguments$"):
        call(_args(tmp_path))


def test_parallelize_takes_the_segment_size_from_the_config_only():
    one = Topology.of()
    model = paddle.nn.Linear(2, 2)
    optimizer = paddle.optimizer.SGD(parameters=model.parameters())
    with pytest.raises(TypeError, match="stage3_segment_size"):
        apply.parallelize(model, optimizer, one, ParallelConfig(layout=one.layout), stage3_segment_size=10)
    with pytest.raises(TypeError):  # no config: no "every default" path beside the config
        apply.parallelize(model, optimizer, one)


def test_parallelize_refuses_a_config_of_another_layout():
    one = Topology.of()
    model = paddle.nn.Linear(2, 2)
    other = ParallelConfig(layout=Layout(world_size=2, tp=2))
    with pytest.raises(ValueError, match=r"^parallelize: the config's layout dp1·sharding1·tp2·pp1 is not the "
                                         r"topology's dp1·sharding1·tp1·pp1; pass the ParallelConfig init_topology"):
        apply.parallelize(model, paddle.optimizer.SGD(parameters=model.parameters()), one, other)


# Every case apply_sharding's own checks caught, and the line ParallelConfig refuses it with.
FORMER_SHARDING_CHECKS = [
    ("stage without a group", Layout(world_size=2, dp=2), dict(sharding_stage=2),
     r"^sharding stage 2 with sharding_parallel_degree=1: a sharding group needs"),
    ("stage outside 1..3", Layout(world_size=2, sharding=2), dict(sharding_stage=4),
     r"^sharding stage 4 with sharding_parallel_degree=2"),
    ("stage1 offload", Layout(world_size=2, sharding=2), dict(sharding_stage=1, sharding_offload=True),
     r"^sharding='stage1 offload': stage1 has no offload; use 'stage3 offload'$"),
    ("stage2 with pp", Layout(world_size=4, sharding=2, pp=2), dict(sharding_stage=2, accumulate_steps=2),
     r"^sharding='stage2' cannot be combined with pipeline_parallel_degree=2: use sharding='stage1'"),
    ("stage3 with pp", Layout(world_size=4, sharding=2, pp=2), dict(sharding_stage=3, accumulate_steps=2),
     r"^sharding='stage3' cannot be combined with pipeline_parallel_degree=2"),
    ("stage3 with tp", Layout(world_size=4, sharding=2, tp=2), dict(sharding_stage=3),
     r"^sharding='stage3' cannot be combined with tensor_parallel_degree=2: use sharding='stage1' or 'stage2'"),
    # apply_sharding let stage-2 offload through with half-precision weights and no dp; the config refuses it
    # in every configuration (a checkpoint cannot map Paddle's fused host buffer back to parameters)
    ("stage2 offload", Layout(world_size=2, sharding=2), dict(sharding_stage=2, sharding_offload=True),
     r"^sharding='stage2 offload' is not supported by paddletrainer: .* use 'stage3 offload'$"),
    ("stage2 offload with dp", Layout(world_size=4, dp=2, sharding=2), dict(sharding_stage=2, sharding_offload=True),
     r"^sharding='stage2 offload' is not supported by paddletrainer"),
]


@pytest.mark.parametrize("layout, options, message", [c[1:] for c in FORMER_SHARDING_CHECKS],
                         ids=[c[0] for c in FORMER_SHARDING_CHECKS])
def test_parallel_config_alone_refuses_what_apply_sharding_checked_again(layout, options, message):
    with pytest.raises(ValueError, match=message):
        ParallelConfig(layout=layout, **options)


def test_apply_sharding_needs_a_config_with_a_stage():
    one = Topology.of()
    with pytest.raises(ValueError, match="apply_sharding: the config has no sharding stage"):
        apply_sharding(paddle.nn.Linear(2, 2), None, topology=one, config=ParallelConfig(layout=one.layout))


def test_the_topo_order_default_is_written_once():
    assert Layout(world_size=1).topo_order == DEFAULT_TOPO_ORDER == Topology.of().layout.topo_order
    assert resolve_layout(1, False, {}).topo_order == DEFAULT_TOPO_ORDER
    with pytest.raises(ValueError, match="hybrid_parallel_topo_order must be"):
        hybrid_order(None)  # no second default: None is TrainingArguments' to translate, as PaddleNLP does


def test_the_arguments_fill_in_the_default_topo_order(tmp_path):
    args = _args(tmp_path)
    assert args.hybrid_parallel_topo_order == DEFAULT_TOPO_ORDER == args.parallel_config.layout.topo_order
