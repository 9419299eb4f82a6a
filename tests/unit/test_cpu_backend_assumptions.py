"""The CPU backend's fills still match the Paddle code they patch (no processes needed)."""
import inspect
from types import SimpleNamespace

import paddle
import pytest

from paddletrainer.parallel.cpu import backend as cpu_backend
from paddletrainer.parallel.config import ParallelConfig
from paddletrainer.parallel.topology import Topology


def test_paddle_still_has_every_symbol_the_cpu_backend_patches():
    cpu_backend.check_paddle_assumptions()


def test_a_changed_paddle_signature_fails_the_assumption_check(monkeypatch):
    from paddle.distributed.fleet.layers.mpu import mp_ops

    def moved(x, axis=None):  # a Paddle upgrade that renamed the group argument
        return x

    monkeypatch.setattr(mp_ops, "_c_split", moved)
    with pytest.raises(RuntimeError, match="mp_ops._c_split signature changed"):
        cpu_backend.check_paddle_assumptions()


def test_a_vanished_paddle_symbol_fails_the_assumption_check(monkeypatch):
    from paddle.distributed.fleet.meta_parallel.pp_utils import p2p_communication

    monkeypatch.delattr(p2p_communication, "_recv_on_calc_stream")
    with pytest.raises(RuntimeError, match="_recv_on_calc_stream"):
        cpu_backend.check_paddle_assumptions()


def test_group_store_ports_are_picked_by_the_master_unless_a_base_port_is_set(monkeypatch):
    monkeypatch.delenv(cpu_backend.STORE_BASE_PORT_ENV, raising=False)
    assert cpu_backend.store_port_for_group(11) is None  # the group's master picks a free port
    monkeypatch.setenv(cpu_backend.STORE_BASE_PORT_ENV, "50000")
    assert cpu_backend.store_port_for_group(11) == 50011


def test_free_port_is_bindable():
    import socket

    port = cpu_backend._free_port()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", port))


def test_group_sharded_construction_restores_every_patched_symbol():
    from paddle.base import core
    from paddle.distributed.fleet.meta_parallel.sharding import group_sharded_storage

    before = (core.is_compiled_with_cuda, paddle.get_device, group_sharded_storage.ParamStorage.add_rank_params)
    with cpu_backend.group_sharded_construction():
        assert core.is_compiled_with_cuda() is True and paddle.get_device() == "cpu:0"
    after = (core.is_compiled_with_cuda, paddle.get_device, group_sharded_storage.ParamStorage.add_rank_params)
    assert before == after
    with pytest.raises(ZeroDivisionError):
        with cpu_backend.group_sharded_construction():
            1 / 0
    assert core.is_compiled_with_cuda is before[0] and paddle.get_device is before[1]


def test_a_changed_sequence_parallel_reduce_scatter_path_fails_the_assumption_check(monkeypatch):
    from paddle.distributed.fleet.utils import sequence_parallel_utils

    def reduce_scatter(input):  # a Paddle upgrade that reduce-scatters through another call
        return input

    monkeypatch.setattr(sequence_parallel_utils, "reduce_scatter", reduce_scatter)
    with pytest.raises(RuntimeError, match="review fill 9"):
        cpu_backend.check_paddle_assumptions()


def test_stage3_offload_without_the_cpu_backend_is_refused_before_paddle_frees_anything(monkeypatch):
    from paddletrainer.parallel.sharding import apply_sharding

    monkeypatch.setattr(cpu_backend, "is_installed", lambda: False)
    model = paddle.nn.Linear(2, 2)
    opt = paddle.optimizer.AdamW(parameters=model.parameters())
    topology = Topology.of(rank=0, sharding_degree=2)
    config = ParallelConfig(layout=topology.layout, sharding_stage=3, sharding_offload=True)
    with pytest.raises(RuntimeError, match="init_topology"):
        apply_sharding(model, opt, topology=topology, config=config)


def test_paddles_own_offload_move_destroys_the_tensor_on_cpu_and_the_fill_copies():
    # Why fill 7 exists: on CPU, .cpu() aliases, so Paddle's "copy to host, free the device tensor" frees both.
    from paddle.distributed.fleet.meta_parallel.sharding import group_sharded_stage3 as gs3

    original = getattr(gs3._device2cpu, "__wrapped_paddle__", gs3._device2cpu)
    assert not original(paddle.arange(4, dtype="float32"))._is_initialized(), "Paddle's move copies now: drop fill 7?"

    source = paddle.arange(4, dtype="float32")
    host = cpu_backend._offload_to_host(source)
    assert host.numpy().tolist() == [0, 1, 2, 3] and not source._is_initialized()

    grad = paddle.arange(4, dtype="float32")  # converting: Paddle frees only its temporary cast
    as_fp32 = cpu_backend._offload_to_host(grad, convert_dtype=True)
    assert grad._is_initialized() and as_fp32.dtype == paddle.float32
    as_fp32.add_(paddle.ones([4]))
    assert grad.numpy().tolist() == [0, 1, 2, 3], "the host copy aliases the gradient"


def test_offload_device_copy_is_a_separate_tensor_in_the_parameters_training_dtype():
    from paddle.distributed.fleet.meta_parallel.sharding import group_sharded_stage3 as gs3

    param = SimpleNamespace(name="w", fw_storage=paddle.arange(4, dtype="float32"))
    saved = dict(getattr(gs3, "param2dtype", {}) or {})
    gs3.param2dtype = {"w": paddle.float32}
    try:
        copy = cpu_backend._offload_to_device(param)
        copy.add_(paddle.ones([4]))
        assert param.fw_storage.numpy().tolist() == [0, 1, 2, 3] and copy.dtype == paddle.float32
        gs3.param2dtype = {"w": paddle.float16}
        assert cpu_backend._offload_to_device(param).dtype == paddle.float16
    finally:
        gs3.param2dtype = saved


def test_every_fill_documents_the_paddle_function_it_replaces():
    for fill in (cpu_backend._c_identity, cpu_backend._c_split, cpu_backend._c_concat, cpu_backend._mp_allreduce,
                 cpu_backend.parallel_softmax_cross_entropy, cpu_backend._broadcast_input_data,
                 cpu_backend._send_on_calc_stream, cpu_backend._recv_on_calc_stream,
                 cpu_backend._offload_to_host, cpu_backend._offload_to_device):
        assert "Replaces" in inspect.getdoc(fill), fill.__name__


def test_parallelize_refuses_an_optimizer_still_carrying_a_grad_clip():
    """Inside step() the clip would see only this rank's gradients (and Paddle's GPU-only hybrid clip classes
    would replace it): the Trainer takes it off first (take_gradient_clip); direct callers are told to."""
    from paddletrainer.parallel import parallelize

    topo = Topology.of()  # one process
    model = paddle.nn.Linear(2, 2)
    opt = paddle.optimizer.AdamW(parameters=model.parameters(), grad_clip=paddle.nn.ClipGradByGlobalNorm(1.0))
    with pytest.raises(ValueError, match="take_gradient_clip"):
        parallelize(model, opt, topo, ParallelConfig(layout=topo.layout))
    grouped = paddle.optimizer.AdamW(parameters=[{"params": model.parameters(),
                                                  "grad_clip": paddle.nn.ClipGradByGlobalNorm(1.0)}])
    with pytest.raises(ValueError, match="take_gradient_clip"):
        parallelize(model, grouped, topo, ParallelConfig(layout=topo.layout))
