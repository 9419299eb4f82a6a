"""The stage-3 reduce-scatter refuses to run on Paddle code other than what it reproduces (no processes needed)."""
import paddle
import pytest
from paddle.distributed.fleet.meta_parallel.sharding import group_sharded_stage3 as gs3

from paddletrainer import paddle_contract
from paddletrainer.parallel import sharding


@pytest.fixture(autouse=True)
def fresh_check():
    sharding.check_paddle_stage3_sources.cache_clear()  # the result is cached per process
    yield
    sharding.check_paddle_stage3_sources.cache_clear()


def test_the_installed_paddle_passes_the_stage3_source_check():
    sharding.check_paddle_stage3_sources()


def _with_an_extra_step(monkeypatch, changed_function):
    original = paddle_contract._paddle_source

    def source(func):
        text = original(func)
        if func is changed_function:  # a Paddle upgrade that adds one statement after the function's last one
            last = text.rstrip("\n").splitlines()[-1]
            text += " " * (len(last) - len(last.lstrip())) + "found_inf = None\n"
        return text

    monkeypatch.setattr(paddle_contract, "_paddle_source", source)


@pytest.mark.parametrize("owner, name", [(gs3.GroupShardedStage3, "_get_allreduce_fn"),
                                         (gs3.GroupShardedStage3, "_flatten_layer_params"),
                                         (gs3, "_create_params_grad"),
                                         (gs3.ForwardPostHooks, "backward"),
                                         (gs3.GroupShardedStage3, "_sync_params_and_buffers"),
                                         (gs3.GroupShardedStage3, "_param_storage")])
def test_a_step_added_to_a_reproduced_paddle_function_fails_the_check_naming_it(monkeypatch, owner, name):
    _with_an_extra_step(monkeypatch, getattr(owner, name))
    with pytest.raises(RuntimeError, match=rf"\.{name} differs from Paddle 3\.3\.1's .*re-check"):
        sharding.check_paddle_stage3_sources()


def test_comments_and_spacing_in_paddles_source_do_not_fail_the_check(monkeypatch):
    original = paddle_contract._paddle_source

    def reformatted(func):
        lines = original(func).splitlines()
        return "\n".join(f"{line}   # a comment" if line.strip().startswith("if ") else line for line in lines) + "\n\n"

    monkeypatch.setattr(paddle_contract, "_paddle_source", reformatted)
    sharding.check_paddle_stage3_sources()


def test_a_vanished_paddle_function_fails_the_check(monkeypatch):
    monkeypatch.delattr(gs3, "_create_params_grad")
    with pytest.raises(RuntimeError, match=r"_create_params_grad cannot be read"):
        sharding.check_paddle_stage3_sources()


def test_stage3_construction_runs_the_check_before_paddles_constructor(monkeypatch):
    def changed(_func):
        return "def f():\n    return 1\n"

    monkeypatch.setattr(paddle_contract, "_paddle_source", changed)
    monkeypatch.setattr(gs3.GroupShardedStage3, "__init__", lambda *a, **k: pytest.fail("Paddle's constructor ran"))
    with pytest.raises(RuntimeError, match="_ReduceScatterStage3"):
        sharding._ReduceScatterStage3(paddle.nn.Linear(2, 2))
