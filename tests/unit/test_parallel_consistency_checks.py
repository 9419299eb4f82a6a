"""Refusals and guards of the parallel wrappers, each proven in one process: a model and ``sequence_parallel`` that
disagree under tp, stage 2's deferred reduction asked to drop accumulated gradients, and the CPU reduce-scatter
called on a rank outside its group."""
import paddle
import pytest

from paddletrainer.parallel import apply
from paddletrainer.parallel.config import ParallelConfig
from paddletrainer.parallel.cpu.reduce_scatter import _reduce_scatter_tensor_in_dygraph, reduce_scatter_into
from paddletrainer.parallel.sequence import check_sequence_parallel_model
from paddletrainer.parallel.sharding import stage2_no_sync
from paddletrainer.parallel.topology import Topology

TP2 = Topology.of(rank=0, local_rank=0, tp_degree=2, hcg=object())  # a stand-in: nothing reaches its groups


def _model(marked: bool):
    model = paddle.nn.Sequential(paddle.nn.Linear(2, 2), paddle.nn.LayerNorm(2))
    if marked:  # what a PaddleNLP model built with config.sequence_parallel does to its norms
        model[1].weight.sequence_parallel = True
    return model


@pytest.mark.parametrize("marked,enabled,phrase", [(True, False, "sequence_parallel is off"),
                                                   (False, True, "sequence_parallel is on")])
def test_parallelize_refuses_a_model_that_disagrees_with_sequence_parallel_under_tensor_parallel(marked, enabled,
                                                                                                  phrase):
    model = _model(marked)
    config = ParallelConfig(layout=TP2.layout, sequence_parallel=enabled)
    with pytest.raises(ValueError, match=phrase) as err:
        apply.parallelize(model, paddle.optimizer.SGD(parameters=model.parameters()), TP2, config)
    assert "\n" not in str(err.value)


def test_a_model_that_agrees_with_sequence_parallel_passes_the_check():
    check_sequence_parallel_model(_model(marked=True), True)
    check_sequence_parallel_model(_model(marked=False), False)


class Stage2Stub:
    """The members of ``GroupShardedStage2`` that stage 2's deferred reduction uses. Its forward calls
    ``_init_internal_storage(needs_fresh)``: with needs_fresh (first forward, or the trainable parameters
    changed) Paddle rebuilds the gradient storage from scratch; ``rebuilt`` counts those calls."""

    training = True

    def __init__(self):
        self._trainable_params = [object(), object()]
        self._grad_reduced = [True, True]
        self.rebuilt = []

    def _init_internal_storage(self, needs_fresh):
        self.rebuilt.append(needs_fresh)

    def _clear_counters(self):
        self._grad_reduced = [True] * len(self._trainable_params)


def test_stage2_keeps_gradients_accumulated_under_no_sync_for_the_reducing_forward():
    model = Stage2Stub()
    with stage2_no_sync(model):
        model._init_internal_storage(True)  # the first forward builds the storage
        assert model._grad_reduced == [False, False]  # the hooks skip this backward
    model._init_internal_storage(False)  # the last micro-batch: hooks armed, buffers kept
    assert model.rebuilt == [True] and model._grad_reduced == [True, True]


def test_stage2_refuses_to_rebuild_its_gradient_storage_while_gradients_are_accumulated():
    model = Stage2Stub()
    with stage2_no_sync(model):
        model._init_internal_storage(True)
    with pytest.raises(RuntimeError, match="stop_gradient only between optimizer steps"):
        model._init_internal_storage(True)  # e.g. a parameter was frozen between micro-batches
    assert model.rebuilt == [True]  # the accumulated gradients were not dropped


class NotAMember:
    """A process group this rank is not part of (Paddle gives such a rank ``rank == -1``)."""

    nranks, rank, name = 2, -1, "tp"

    def is_member(self):
        return False


def test_cpu_reduce_scatter_on_a_rank_outside_the_group_writes_nothing_and_returns_a_finished_task():
    out = paddle.full([2], 7.0)
    values = paddle.arange(4, dtype="float32")
    reduce_scatter_into(out, values, group=NotAMember())
    assert out.tolist() == [7.0, 7.0]  # not some member's chunk of the unreduced input
    task = _reduce_scatter_tensor_in_dygraph(out, values, paddle.distributed.ReduceOp.SUM, NotAMember(),
                                             sync_op=False, use_calc_stream=False)
    assert task.is_completed() and out.tolist() == [7.0, 7.0]


class SecondOfTwo:
    """Rank 1 of a 2-rank group, whose all-reduce the test plays (the other rank holds the same values)."""

    nranks, rank, name = 2, 1, "sharding"


def test_cpu_reduce_scatter_of_a_scratch_gradient_reduces_it_in_place_in_pieces(monkeypatch):
    from paddletrainer.parallel.cpu import reduce_scatter as fill

    reduced_sizes = []

    def all_reduce(tensor, op=None, group=None, **_):  # both ranks hold these values: the sum doubles them
        reduced_sizes.append(int(tensor.numel()))
        tensor.scale_(2.0)

    monkeypatch.setattr(fill, "ALL_REDUCE_PIECE_BYTES", 4 * 5)  # 5 float32 elements a piece
    monkeypatch.setattr(fill.dist, "all_reduce", all_reduce)
    gradient = paddle.arange(24, dtype="float32")
    out = paddle.zeros([12])
    reduce_scatter_into(out, gradient, group=SecondOfTwo(), scratch_input=True)
    assert reduced_sizes == [5, 5, 5, 5, 4]  # never the whole gradient at once: gloo's working memory is 2/n of it
    assert out.tolist() == [2.0 * v for v in range(12, 24)]
    assert gradient.tolist() == [2.0 * v for v in range(24)]  # reduced where it lies, no copy
