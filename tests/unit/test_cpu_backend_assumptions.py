"""The CPU backend's fills still match the Paddle code they patch (no processes needed)."""
import importlib
import inspect
from pathlib import Path
from types import SimpleNamespace

import paddle
import pytest

from paddletrainer.parallel import cpu as cpu_backend
from paddletrainer.parallel.cpu import group_stores, pipeline_p2p, sharding_construction, stage3_offload, tp_ops
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


def _changed(*args, **kwargs):  # what a Paddle upgrade left in place of a function: other parameters, other body
    return None


# Per fill module: one Paddle symbol it patches or relies on, and its change (None: the symbol vanished).
BREAKS = {
    "group_stores": ("paddle.distributed.collective", "_new_process_group_impl", None),
    "tp_ops": ("paddle.distributed.fleet.layers.mpu.mp_ops", "_c_split", _changed),
    "pipeline_p2p": ("paddle.distributed.fleet.meta_parallel.pp_utils.p2p_communication", "_recv_on_calc_stream", None),
    "interleave": ("paddle.distributed.fleet.meta_parallel.pp_utils.p2p_communication", "_batched_p2p_ops", _changed),
    "reduce_scatter": ("paddle.distributed.communication.stream.reduce_scatter", "_reduce_scatter_in_dygraph",
                       _changed),
    "sharding_construction": ("paddle.distributed.fleet.utils.tensor_fusion_helper", "get_current_device_type",
                              _changed),
    "stage3_offload": ("paddle.distributed.fleet.meta_parallel.sharding.group_sharded_stage3", "_device2cpu", None),
    "all_to_all": ("paddle.distributed.communication.stream.all_to_all", "_alltoall_single_in_dygraph", _changed),
}


def test_every_fill_module_has_a_broken_assumption_case():
    assert sorted(BREAKS) == sorted(m.__name__.rsplit(".", 1)[1] for m in cpu_backend.FILLS)


@pytest.mark.parametrize("fill", sorted(BREAKS))
def test_a_broken_paddle_assumption_names_the_file_of_the_fill_to_edit(monkeypatch, fill):
    module_name, symbol, replacement = BREAKS[fill]
    module = importlib.import_module(module_name)
    if replacement is None:
        monkeypatch.delattr(module, symbol)
    else:
        monkeypatch.setattr(module, symbol, replacement)
    with pytest.raises(RuntimeError) as raised:
        cpu_backend.check_paddle_assumptions()
    problems = str(raised.value).splitlines()[1:]
    path = f"paddletrainer/parallel/cpu/{fill}.py"
    assert problems and all(line.startswith(f"  - {path}: ") for line in problems), str(raised.value)
    assert (Path(__file__).resolve().parents[2] / path).is_file()


def test_group_store_ports_are_picked_by_the_master_unless_a_base_port_is_set(monkeypatch):
    monkeypatch.delenv(group_stores.STORE_BASE_PORT_ENV, raising=False)
    assert group_stores.store_port_for_group(11) is None  # the group's master picks a free port
    monkeypatch.setenv(group_stores.STORE_BASE_PORT_ENV, "50000")
    assert group_stores.store_port_for_group(11) == 50011


def test_free_port_is_bindable():
    import socket

    port = group_stores._free_port()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", port))


def test_group_sharded_construction_restores_every_patched_symbol():
    from paddle.base import core
    from paddle.distributed.fleet.meta_parallel.sharding import group_sharded_storage

    before = (core.is_compiled_with_cuda, paddle.get_device, group_sharded_storage.ParamStorage.add_rank_params)
    with sharding_construction.group_sharded_construction():
        assert core.is_compiled_with_cuda() is True and paddle.get_device() == "cpu:0"
    after = (core.is_compiled_with_cuda, paddle.get_device, group_sharded_storage.ParamStorage.add_rank_params)
    assert before == after
    with pytest.raises(ZeroDivisionError):
        with sharding_construction.group_sharded_construction():
            1 / 0
    assert core.is_compiled_with_cuda is before[0] and paddle.get_device is before[1]


def test_a_changed_sequence_parallel_reduce_scatter_path_fails_the_assumption_check(monkeypatch):
    from paddle.distributed.fleet.utils import sequence_parallel_utils

    def reduce_scatter(input):  # a Paddle upgrade that reduce-scatters through another call
        return input

    monkeypatch.setattr(sequence_parallel_utils, "reduce_scatter", reduce_scatter)
    with pytest.raises(RuntimeError, match="reduce_scatter.py: sequence_parallel_utils no longer reduce-scatters"):
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
    # Why stage3_offload exists: on CPU, .cpu() aliases, so Paddle's "copy to host, free the device tensor" frees both.
    from paddle.distributed.fleet.meta_parallel.sharding import group_sharded_stage3 as gs3

    original = getattr(gs3._device2cpu, "__wrapped_paddle__", gs3._device2cpu)
    assert not original(paddle.arange(4, dtype="float32"))._is_initialized(), "Paddle's move copies now: drop the fill?"

    source = paddle.arange(4, dtype="float32")
    host = stage3_offload._offload_to_host(source)
    assert host.numpy().tolist() == [0, 1, 2, 3] and not source._is_initialized()

    grad = paddle.arange(4, dtype="float32")  # converting: Paddle frees only its temporary cast
    as_fp32 = stage3_offload._offload_to_host(grad, convert_dtype=True)
    assert grad._is_initialized() and as_fp32.dtype == paddle.float32
    as_fp32.add_(paddle.ones([4]))
    assert grad.numpy().tolist() == [0, 1, 2, 3], "the host copy aliases the gradient"


def test_offload_device_copy_is_a_separate_tensor_in_the_parameters_training_dtype():
    from paddle.distributed.fleet.meta_parallel.sharding import group_sharded_stage3 as gs3

    param = SimpleNamespace(name="w", fw_storage=paddle.arange(4, dtype="float32"))
    saved = dict(getattr(gs3, "param2dtype", {}) or {})
    gs3.param2dtype = {"w": paddle.float32}
    try:
        copy = stage3_offload._offload_to_device(param)
        copy.add_(paddle.ones([4]))
        assert param.fw_storage.numpy().tolist() == [0, 1, 2, 3] and copy.dtype == paddle.float32
        gs3.param2dtype = {"w": paddle.float16}
        assert stage3_offload._offload_to_device(param).dtype == paddle.float16
    finally:
        gs3.param2dtype = saved


def test_every_fill_documents_the_paddle_function_it_replaces():
    for fill in (tp_ops._c_identity, tp_ops._c_split, tp_ops._c_concat, tp_ops._mp_allreduce,
                 tp_ops.parallel_softmax_cross_entropy, tp_ops._broadcast_input_data,
                 pipeline_p2p._send_on_calc_stream, pipeline_p2p._recv_on_calc_stream,
                 stage3_offload._offload_to_host, stage3_offload._offload_to_device):
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
