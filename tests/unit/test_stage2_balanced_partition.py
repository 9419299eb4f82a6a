"""Sharding stage 2 assigns whole parameters to ranks largest first, so the ranks' shares are near-equal, and
refuses to run on Paddle stage-2 code other than what the partition was written against (no processes needed)."""
import weakref
from types import SimpleNamespace

import paddle
import pytest
from paddle.distributed.fleet.meta_parallel.sharding.group_sharded_optimizer_stage2 import GroupShardedOptimizerStage2
from paddle.distributed.fleet.meta_parallel.sharding.group_sharded_stage2 import GroupShardedStage2

from paddletrainer import paddle_contract
from paddletrainer.parallel import sharding


class FakeParam:
    def __init__(self, name, shape, trainable=True):
        self.name, self.shape, self.trainable = name, shape, trainable

    def _numel(self):
        n = 1
        for d in self.shape:
            n *= d
        return n


def llama_parameters(vocab=32000, hidden=1024, intermediate=2816, layers=8):
    """PaddleNLP ``LlamaForCausalLM``'s parameters (untied head, no GQA) in ``named_parameters()`` order."""
    params = [FakeParam("llama.embed_tokens.weight", [vocab, hidden])]
    for i in range(layers):
        prefix = f"llama.layers.{i}."
        params += [FakeParam(prefix + f"self_attn.{n}_proj.weight", [hidden, hidden]) for n in "qkvo"]
        params += [FakeParam(prefix + "mlp.gate_proj.weight", [hidden, intermediate]),
                   FakeParam(prefix + "mlp.up_proj.weight", [hidden, intermediate]),
                   FakeParam(prefix + "mlp.down_proj.weight", [intermediate, hidden]),
                   FakeParam(prefix + "input_layernorm.weight", [hidden]),
                   FakeParam(prefix + "post_attention_layernorm.weight", [hidden])]
    return params + [FakeParam("llama.norm.weight", [hidden]), FakeParam("lm_head.weight", [hidden, vocab])]


def segments(optimizer_class, params, world_size):
    """``optimizer_class._segment_params`` on a stand-in holding just what it reads."""
    stand_in = SimpleNamespace(_local_params=params, world_size=world_size)
    setattr(stand_in, sharding._PADDLE_SEGMENTS, [])
    return optimizer_class._segment_params(stand_in)


def totals(segs):
    return [sum(p._numel() for p in seg if p.trainable) for seg in segs]


def test_the_168m_llama_is_split_within_5_percent_over_two_ranks_where_paddles_greedy_is_not():
    params = llama_parameters()
    assert sum(p._numel() for p in params) == 168_313_856  # docs/benchmarks.md, "Sharding stage 2: balanced partition"
    paddle_totals = totals(segments(GroupShardedOptimizerStage2, params, 2))
    ours = totals(segments(sharding._BalancedStage2Optimizer, params, 2))
    assert max(paddle_totals) > 1.05 * min(paddle_totals)  # 99.1M / 69.2M: what the partition fixes
    assert max(ours) <= 1.05 * min(ours), ours
    assert sum(ours) == sum(paddle_totals)


@pytest.mark.parametrize("world_size", [2, 3, 4, 8])
def test_every_parameter_is_on_exactly_one_rank_in_model_order(world_size):
    params = llama_parameters(vocab=640, hidden=64, intermediate=128, layers=3)
    params[5].trainable = False  # a frozen parameter still belongs to one rank (Paddle counts it as size 0)
    segs = segments(sharding._BalancedStage2Optimizer, params, world_size)
    assert len(segs) == world_size
    placed = [p for seg in segs for p in seg]
    assert sorted(map(id, placed)) == sorted(map(id, params))
    position = {id(p): i for i, p in enumerate(params)}
    for seg in segs:
        assert [position[id(p)] for p in seg] == sorted(position[id(p)] for p in seg)


def test_the_partition_depends_on_sizes_and_order_only():
    a = segments(sharding._BalancedStage2Optimizer, llama_parameters(), 4)
    b = segments(sharding._BalancedStage2Optimizer, llama_parameters(), 4)  # new objects: other ids and hashes
    assert [[p.name for p in seg] for seg in a] == [[p.name for p in seg] for seg in b]
    # equal sizes: the earlier item first, ties to the lower rank
    assert sharding.balanced_partition([5, 5, 5, 5], 2) == [0, 1, 0, 1]
    assert sharding.balanced_partition([1, 8, 3, 4], 2) == [1, 0, 1, 1]  # 8 | 4, 3, 1 (model order: 1, 3, 4)


def test_the_partition_is_cached_where_paddles_clear_cache_empties_it():
    params = llama_parameters(vocab=640, hidden=64, intermediate=128, layers=1)
    stand_in = SimpleNamespace(_local_params=params, world_size=2, _dtype_rank_params={}, _param2rank={})
    setattr(stand_in, sharding._PADDLE_SEGMENTS, [])
    first = sharding._BalancedStage2Optimizer._segment_params(stand_in)
    names = [[p.name for p in seg] for seg in first]
    assert sharding._BalancedStage2Optimizer._segment_params(stand_in) is first
    GroupShardedOptimizerStage2._clear_cache(stand_in)
    assert getattr(stand_in, sharding._PADDLE_SEGMENTS) == []
    again = sharding._BalancedStage2Optimizer._segment_params(stand_in)
    assert [[p.name for p in seg] for seg in again] == names and len(names) == 2 and all(names)


class HoldsTensor:
    """A finished reduce task: like gloo's, it keeps the tensor it reduced alive while it is referenced."""

    def __init__(self, tensor):
        self.tensor = tensor

    def wait(self):
        return True


def test_a_synchronous_reduce_task_is_not_kept_so_the_reduced_gradient_is_freed():
    # The gradient a rank reduced to another rank's owner must die with the parameter's reference to it:
    # Paddle's _update_task kept the last task (the embedding's gradient on the non-owner) across the step.
    gradient = paddle.ones([4])
    stand_in = SimpleNamespace(_reduce_overlap=False, _comm_task=None)
    sharding._BalancedStage2Optimizer._update_task(stand_in, HoldsTensor(gradient))
    assert stand_in._comm_task is None
    alive = weakref.ref(gradient)  # paddle Tensors take weak references
    del gradient
    assert alive() is None


def test_an_overlapped_reduce_task_is_kept_for_the_step_to_wait_on():
    stand_in = SimpleNamespace(_reduce_overlap=True, _comm_task=None)
    task = HoldsTensor(None)
    sharding._BalancedStage2Optimizer._update_task(stand_in, task)
    assert stand_in._comm_task is task


def test_a_bad_world_size_is_refused():
    with pytest.raises(ValueError, match="world_size must be >= 1"):
        sharding.balanced_partition([1], 0)


# ---------------------------------------------------------------- the Paddle code the partition relies on
@pytest.fixture
def fresh_check():
    sharding.check_paddle_stage2_sources.cache_clear()  # the result is cached per process
    yield
    sharding.check_paddle_stage2_sources.cache_clear()


def test_the_installed_paddle_passes_the_stage2_source_check(fresh_check):
    sharding.check_paddle_stage2_sources()


@pytest.mark.parametrize("owner, name", [(GroupShardedOptimizerStage2, "_segment_params"),
                                         (GroupShardedOptimizerStage2, "param2rank"),
                                         (GroupShardedOptimizerStage2, "dtype_rank_params"),
                                         (GroupShardedOptimizerStage2, "_clear_cache"),
                                         (GroupShardedStage2, "_fresh_trainable"),
                                         (GroupShardedOptimizerStage2, "_update_task"),
                                         (GroupShardedStage2, "_get_reduce_fn"),
                                         (GroupShardedStage2, "_redefine_opt_step")])
def test_a_changed_paddle_stage2_function_fails_the_check_naming_it(monkeypatch, fresh_check, owner, name):
    original = paddle_contract._paddle_source
    changed = getattr(owner, name)
    changed = changed.fget if isinstance(changed, property) else changed

    def source(func):
        text = original(func)
        if func is changed:  # a Paddle upgrade that adds one statement after the function's last one
            last = text.rstrip("\n").splitlines()[-1]
            text += " " * (len(last) - len(last.lstrip())) + "sizes = None\n"
        return text

    monkeypatch.setattr(paddle_contract, "_paddle_source", source)
    with pytest.raises(RuntimeError, match=rf"_BalancedStage2Optimizer.*\.{name} differs from Paddle 3\.3\.1's"):
        sharding.check_paddle_stage2_sources()


def test_stage2_construction_runs_the_check_before_paddles_constructor(monkeypatch, fresh_check):
    monkeypatch.setattr(paddle_contract, "_paddle_source", lambda _func: "def f():\n    return 1\n")
    monkeypatch.setattr(GroupShardedOptimizerStage2, "__init__", lambda *a, **k: pytest.fail("Paddle's constructor ran"))
    with pytest.raises(RuntimeError, match="_BalancedStage2Optimizer"):
        sharding._BalancedStage2Optimizer(params=[], optim=None)
