"""Single-process save/load: bit-exact round trip, async == sync, integrity, refusal, rotation, RNG."""
import json
import os
import random

import numpy as np
import paddle
import pytest

from paddletrainer.checkpoint import (
    CHECKPOINT_COMPLETE_MARKER,
    CheckpointCorruptError,
    CheckpointError,
    CheckpointMismatchError,
    Checkpointer,
    get_last_complete_checkpoint,
    list_complete_checkpoints,
    load_checkpoint,
    read_index,
    rotate_checkpoints,
    save_checkpoint,
)
from paddletrainer.trainer_utils import get_last_checkpoint


def make(hidden=16, seed=3):
    paddle.seed(seed)
    model = paddle.nn.Sequential(paddle.nn.Linear(8, hidden), paddle.nn.ReLU(), paddle.nn.Linear(hidden, 4))
    sched = paddle.optimizer.lr.CosineAnnealingDecay(0.01, 10)
    opt = paddle.optimizer.AdamW(learning_rate=sched, parameters=model.parameters(), weight_decay=0.1)
    return model, opt, sched


def train(model, opt, sched, steps, seed=0):
    rs = np.random.RandomState(seed)
    for _ in range(steps):
        x = paddle.to_tensor(rs.randn(4, 8).astype("float32"))
        model(x).square().mean().backward()
        opt.step()
        opt.clear_grad()
        sched.step()


def opt_state(model, opt):
    """Accumulators by parameter position (parameter names differ between two model instances)."""
    return {
        (kind, i): opt._accumulators[kind][p.name].numpy()
        for kind in opt._accumulators
        for i, p in enumerate(model.parameters())
    }


def test_save_load_round_trip_is_bit_exact_and_training_continues_identically(tmp_path):
    model, opt, sched = make()
    train(model, opt, sched, 3)
    ckpt = save_checkpoint(
        str(tmp_path / "checkpoint-3"), model=model, optimizer=opt, lr_scheduler=sched,
        trainer_state={"global_step": 3}, data_state={"consumed_samples": 12},
    )
    model2, opt2, sched2 = make(seed=99)
    loaded = load_checkpoint(ckpt, model=model2, optimizer=opt2, lr_scheduler=sched2)
    assert loaded.trainer_state == {"global_step": 3}
    assert loaded.data_state == {"consumed_samples": 12}
    assert loaded.optimizer_restored and loaded.rng_restored
    for a, b in zip(model.parameters(), model2.parameters()):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    s1, s2 = opt_state(model, opt), opt_state(model2, opt2)
    assert s1.keys() == s2.keys() and len(s1) == 16
    for k in s1:
        np.testing.assert_array_equal(s1[k], s2[k])
    assert sched2.state_dict() == sched.state_dict()
    train(model, opt, sched, 2, seed=5)
    train(model2, opt2, sched2, 2, seed=5)
    for a, b in zip(model.parameters(), model2.parameters()):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_rng_state_is_restored_in_the_same_layout(tmp_path):
    model, opt, sched = make()
    paddle.seed(7)
    random.seed(7)
    np.random.seed(7)
    ckpt = save_checkpoint(str(tmp_path / "checkpoint-1"), model=model)
    expected = (random.random(), np.random.rand(), paddle.rand([2]).numpy())
    load_checkpoint(ckpt, model=model)
    got = (random.random(), np.random.rand(), paddle.rand([2]).numpy())
    assert expected[:2] == got[:2]
    np.testing.assert_array_equal(expected[2], got[2])


def test_async_save_writes_the_same_bytes_as_sync_save(tmp_path):
    model, opt, sched = make()
    train(model, opt, sched, 2)
    sync_dir = save_checkpoint(str(tmp_path / "sync" / "checkpoint-2"), model=model, optimizer=opt, save_rng=False)
    saver = Checkpointer(model=model, optimizer=opt, save_rng=False)
    async_dir = saver.save(str(tmp_path / "async" / "checkpoint-2"), async_save=True)
    # training goes on once the host copy is taken: later steps must not leak in
    saver.wait_for_snapshot()
    train(model, opt, sched, 1)
    assert saver.finish() == async_dir
    files = sorted(f for f in os.listdir(sync_dir) if f.endswith(".safetensors"))
    assert files == sorted(f for f in os.listdir(async_dir) if f.endswith(".safetensors")) and len(files) == 2
    for f in files:
        assert (tmp_path / "sync" / "checkpoint-2" / f).read_bytes() == (tmp_path / "async" / "checkpoint-2" / f).read_bytes()
    assert read_index(sync_dir)["tensors"] == read_index(async_dir)["tensors"]


def test_async_save_is_published_only_at_the_next_collective_point(tmp_path):
    model, _, _ = make()
    saver = Checkpointer(model=model)
    first = saver.save(str(tmp_path / "checkpoint-1"), async_save=True)
    assert not os.path.exists(first)  # still a tmp dir until finish() / the next save
    second = saver.save(str(tmp_path / "checkpoint-2"), async_save=True)
    assert list_complete_checkpoints(str(tmp_path)) == [first]
    saver.finish()
    assert list_complete_checkpoints(str(tmp_path)) == [first, second]


def test_save_checkpoint_refuses_async_save_instead_of_never_publishing_it(tmp_path):
    model, _, _ = make()
    with pytest.raises(TypeError, match="Checkpointer"):
        save_checkpoint(str(tmp_path / "checkpoint-1"), model=model, async_save=True)
    assert not os.listdir(tmp_path)  # refused before anything was written


def test_corrupt_file_is_detected_and_named(tmp_path):
    model, opt, _ = make()
    ckpt = save_checkpoint(str(tmp_path / "checkpoint-1"), model=model, optimizer=opt)
    path = os.path.join(ckpt, "model_state.tp00_pp00.safetensors")
    data = bytearray(open(path, "rb").read())
    data[-3] ^= 0xFF  # flip bits in the tensor data: same size, different crc
    open(path, "wb").write(bytes(data))
    with pytest.raises(CheckpointCorruptError) as e:
        load_checkpoint(ckpt, model=make()[0])
    assert e.value.files == ["model_state.tp00_pp00.safetensors"]
    assert "crc32" in str(e.value)


def test_checkpoint_of_another_model_is_refused_with_every_mismatch(tmp_path):
    model, _, _ = make(hidden=16)
    ckpt = save_checkpoint(str(tmp_path / "checkpoint-1"), model=model)
    other = paddle.nn.Sequential(paddle.nn.Linear(8, 32), paddle.nn.ReLU(), paddle.nn.Linear(32, 4), paddle.nn.Linear(4, 1))
    with pytest.raises(CheckpointMismatchError) as e:
        load_checkpoint(ckpt, model=other)
    assert e.value.mismatches == [
        "shape mismatch: model/0.bias checkpoint [16] vs model [32]",
        "shape mismatch: model/0.weight checkpoint [8, 16] vs model [8, 32]",
        "shape mismatch: model/2.weight checkpoint [16, 4] vs model [32, 4]",
        "missing in checkpoint: model/3.bias [1]",
        "missing in checkpoint: model/3.weight [4, 1]",
    ]


def test_optimizer_states_with_no_tensor_on_a_rank_that_steps_their_parameters_are_named_in_a_warning(tmp_path):
    model, opt, sched = make()
    train(model, opt, sched, 1)
    ckpt = save_checkpoint(str(tmp_path / "checkpoint-1"), model=model, optimizer=opt, save_rng=False)
    model2, _, _ = make(seed=5)
    sgd = paddle.optimizer.SGD(learning_rate=0.1, parameters=model2.parameters())  # steps them, holds no state
    loaded = load_checkpoint(ckpt, model=model2, optimizer=sgd, load_rng=False)
    unplaced = [w for w in loaded.warnings if "no tensor to go to" in w]
    assert len(unplaced) == 1 and "optim/0.weight/moment1" in unplaced[0] and "16 optimizer state(s)" in unplaced[0]


def test_optimizer_states_of_parameters_another_rank_steps_load_without_a_warning(tmp_path):
    model, opt, sched = make()
    train(model, opt, sched, 1)
    ckpt = save_checkpoint(str(tmp_path / "checkpoint-1"), model=model, optimizer=opt, save_rng=False)
    model2, _, _ = make(seed=5)
    # like sharding stage 1/2: this rank's optimizer owns the first layer's parameters only
    own = paddle.optimizer.AdamW(learning_rate=0.1, parameters=list(model2[0].parameters()))
    loaded = load_checkpoint(ckpt, model=model2, optimizer=own, load_rng=False)
    assert not [w for w in loaded.warnings if "no tensor to go to" in w]
    for kind in ("moment1", "moment2"):
        np.testing.assert_array_equal(own._accumulators[kind][model2[0].weight.name].numpy(),
                                      opt._accumulators[kind][model[0].weight.name].numpy())


def test_incomplete_directories_are_not_checkpoints(tmp_path):
    model, _, _ = make()
    good = save_checkpoint(str(tmp_path / "checkpoint-1"), model=model)
    os.makedirs(tmp_path / "checkpoint-5")  # no marker: e.g. a copy interrupted by hand
    os.makedirs(tmp_path / "checkpoint-9.tmp-123-abc")  # a crashed save
    assert list_complete_checkpoints(str(tmp_path)) == [good]
    assert get_last_complete_checkpoint(str(tmp_path)) == good
    assert get_last_checkpoint(str(tmp_path)) == good  # trainer_utils agrees on the marker
    with pytest.raises(CheckpointError, match="not a complete checkpoint"):
        load_checkpoint(str(tmp_path / "checkpoint-5"), model=model)
    save_checkpoint(str(tmp_path / "checkpoint-2"), model=model)
    assert not os.path.exists(tmp_path / "checkpoint-9.tmp-123-abc")  # the next save cleans it


def test_resave_of_the_same_step_replaces_it(tmp_path):
    model, _, _ = make()
    ckpt = save_checkpoint(str(tmp_path / "checkpoint-1"), model=model, trainer_state={"v": 1})
    save_checkpoint(ckpt, model=model, trainer_state={"v": 2})
    assert load_checkpoint(ckpt, model=model).trainer_state == {"v": 2}
    assert os.listdir(tmp_path) == ["checkpoint-1"]


def test_rotation_on_disk_keeps_best_and_newest(tmp_path):
    model, _, _ = make()
    for step in (1, 2, 3, 4):
        save_checkpoint(str(tmp_path / f"checkpoint-{step}"), model=model, save_rng=False)
    deleted = rotate_checkpoints(str(tmp_path), 2, best_checkpoint=str(tmp_path / "checkpoint-1"))
    assert [os.path.basename(p) for p in deleted] == ["checkpoint-2", "checkpoint-3"]
    assert sorted(os.listdir(tmp_path)) == ["checkpoint-1", "checkpoint-4"]
    # rotation as part of saving
    save_checkpoint(str(tmp_path / "checkpoint-5"), model=model, save_total_limit=1)
    assert sorted(os.listdir(tmp_path)) == ["checkpoint-5"]


def test_index_records_every_file_with_size_and_crc(tmp_path):
    model, opt, sched = make()
    train(model, opt, sched, 1)
    ckpt = save_checkpoint(str(tmp_path / "checkpoint-1"), model=model, optimizer=opt, lr_scheduler=sched)
    index = read_index(ckpt)
    on_disk = set(os.listdir(ckpt)) - {CHECKPOINT_COMPLETE_MARKER, "checkpoint_index.json"}
    assert set(index["files"]) == on_disk
    for name, meta in index["files"].items():
        assert os.path.getsize(os.path.join(ckpt, name)) == meta["size"]
    kinds = {k.rsplit("/", 1)[1] for k in index["tensors"] if k.startswith("optim/")}
    assert kinds == {"moment1", "moment2", "beta1_pow_acc", "beta2_pow_acc"}
    assert json.load(open(os.path.join(ckpt, "scheduler.json")))["last_epoch"] == 1


def _topology(**kw):
    import types

    base = dict(world_size=1, rank=0, dp_degree=1, dp_rank=0, sharding_degree=1, sharding_rank=0,
                tp_degree=1, tp_rank=0, pp_degree=1, pp_rank=0)
    base.update(kw)
    return types.SimpleNamespace(**base)


def test_a_tensor_parallel_param_without_split_axis_aborts_the_save_with_its_name(tmp_path):
    model, _, _ = make()
    model[0].weight.is_distributed = True  # no split_axis: the save cannot know how it is split
    with pytest.raises(CheckpointError, match=r"rank 0 failed preparing the save.*0\.weight"):
        save_checkpoint(str(tmp_path / "checkpoint-1"), model=model, topology=_topology(tp_degree=2))
    assert list_complete_checkpoints(str(tmp_path)) == []


def test_a_failing_write_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    from paddletrainer.checkpoint import save

    model, _, _ = make()
    good = save_checkpoint(str(tmp_path / "checkpoint-1"), model=model)

    def disk_full(path, arrays):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(save, "write_safetensors", disk_full)  # what save_checkpoint calls
    saver = Checkpointer(model=model)
    saver.save(str(tmp_path / "checkpoint-2"), async_save=True)
    with pytest.raises(CheckpointError, match="rank 0 failed writing its files: OSError"):
        saver.finish()
    assert list_complete_checkpoints(str(tmp_path)) == [good]
    load_checkpoint(good, model=model)


def test_bfloat16_weights_round_trip_exactly_and_widen_exactly_into_float32(tmp_path):
    paddle.seed(1)
    bf16 = paddle.nn.Linear(4, 3)
    bf16.to(dtype="bfloat16")
    ckpt = save_checkpoint(str(tmp_path / "checkpoint-1"), model=bf16)
    assert read_index(ckpt)["tensors"]["model/weight"]["dtype"] == "bfloat16"
    again = paddle.nn.Linear(4, 3)
    again.to(dtype="bfloat16")
    load_checkpoint(ckpt, model=again)
    np.testing.assert_array_equal(again.weight.numpy(), bf16.weight.numpy())  # same uint16 bit patterns
    fp32 = paddle.nn.Linear(4, 3)
    load_checkpoint(ckpt, model=fp32)
    np.testing.assert_array_equal(fp32.weight.numpy(), bf16.weight.astype("float32").numpy())


@pytest.mark.parametrize("implementation", ["isal", "zlib fallback"])
def test_write_safetensors_is_read_by_safetensors_and_its_crc_matches_the_file(implementation, tmp_path, monkeypatch):
    # Our writer streams arrays from their own memory and checksums them on the side (each tensor once, the
    # file's crc combined from those): the file must be standard safetensors and the recorded crc32/size
    # exactly those of the bytes on disk, with ISA-L's combine or without it.
    from safetensors import safe_open

    import zlib

    from paddletrainer.checkpoint import checksum
    from paddletrainer.checkpoint.write import write_safetensors

    if implementation == "zlib fallback":
        monkeypatch.setattr(checksum, "_crc32_combine", None)
    else:
        pytest.importorskip("isal.isal_zlib")

    arrays = {"matrix": np.arange(12, dtype=np.float32).reshape(3, 4), "empty": np.zeros(0, np.float16),
              "scalar": np.array(5, np.int64), "mask": np.array([True, False]),
              "strided_bf16_bits": np.arange(6, dtype=np.uint16)[::2], "big_endian": np.arange(3, dtype=">f4")}
    path = str(tmp_path / "shard.safetensors")
    record = write_safetensors(path, arrays)
    crc = zlib.crc32(open(path, "rb").read())
    assert {k: record[k] for k in ("size", "crc32")} == {"size": os.path.getsize(path), "crc32": crc}
    raw = open(path, "rb").read()
    header_end = 8 + int.from_bytes(raw[:8], "little")
    assert record["parts"]["__header__"] == zlib.crc32(raw[:header_end])
    with safe_open(path, framework="np") as f:
        for name in arrays:  # each array's own crc32: what a partial reader verifies
            assert record["parts"][name] == zlib.crc32(np.ascontiguousarray(f.get_tensor(name)).tobytes()), name
    with safe_open(path, framework="np") as f:
        assert sorted(f.keys()) == sorted(arrays)
        for name, expected in arrays.items():
            got = f.get_tensor(name)
            assert got.shape == expected.shape and np.array_equal(got, expected), name


def test_sync_save_writes_from_tensor_memory_and_async_save_from_a_snapshot():
    from paddletrainer.checkpoint.local_state import host_array

    t = paddle.arange(4, dtype="float32")
    view, snapshot = host_array(t, copy=False), host_array(t, copy=True)
    t.add_(paddle.ones([4]))
    assert view.tolist() == [1, 2, 3, 4] and snapshot.tolist() == [0, 1, 2, 3]
    bf16 = paddle.ones([2], dtype="float32").astype("bfloat16")  # no NumPy dtype: uint16 bits, a copy
    assert host_array(bf16, copy=False).dtype == np.uint16


def test_ensure_accumulators_expands_param_groups():
    # momentum with weight decay builds two param groups (decayed / not): resume must not choke on them
    from paddletrainer.checkpoint.local_state import ensure_accumulators
    from paddletrainer.optim.optimization import create_optimizer

    model = paddle.nn.Sequential(paddle.nn.Linear(3, 4), paddle.nn.LayerNorm(4))
    opt = create_optimizer(model, 0.1, optim="momentum", weight_decay=0.1)
    assert isinstance(opt._parameter_list[0], dict)
    ensure_accumulators(opt)
    assert {p.name for p in model.parameters()} <= set(opt._accumulators["velocity"])


@pytest.mark.parametrize("offload", [False, True])
def test_stage3_slice_accumulators_are_created_for_the_slice_and_reused_by_its_step(offload):
    from paddle.base.framework import EagerParamBase

    from paddletrainer.checkpoint.local_state import ensure_accumulators

    param = paddle.create_parameter([4, 3], "float32")
    param.fw_storage = paddle.zeros([8])  # this rank's slice of the 12 elements, padded to 8
    param.fw_storage.name = "slice@" + param.name
    param.master_weight = paddle.zeros([8], dtype="float32") if offload else None
    opt = paddle.optimizer.AdamW(learning_rate=0.1, parameters=[param])
    ensure_accumulators(opt)
    moment = opt._accumulators["moment1"]["slice@" + param.name]
    assert moment.shape == [8] and param.name not in opt._accumulators["moment1"]

    # the step GroupShardedStage3 runs: a stand-in of the slice under the same name, with a gradient
    stand_in = EagerParamBase(shape=[8], dtype="float32", name="slice@" + param.name)
    paddle.ones([8])._share_buffer_to(stand_in)
    stand_in._copy_gradient_from(paddle.full([8], 2.0))
    opt._parameter_list = [stand_in]
    opt.step()
    assert opt._accumulators["moment1"]["slice@" + param.name] is moment
    assert float(moment.abs().sum()) > 0, "the step did not update the pre-created accumulator"


def test_stage3_slice_states_the_optimizer_never_created_are_reported_as_unplaced():
    import types

    from paddletrainer.checkpoint.placement import unplaced_optimizer_states
    from paddletrainer.checkpoint.local_state import rank_state

    model = paddle.nn.Linear(4, 3, bias_attr=False)
    model.weight.fw_storage = paddle.zeros([6])  # sharding rank 0's half of the 12 elements
    topo = types.SimpleNamespace(rank=0, dp_degree=1, dp_rank=0, sharding_degree=2, sharding_rank=0,
                                 tp_degree=1, tp_rank=0, pp_degree=1, pp_rank=0)
    # an optimizer that (wrongly) skipped the released stage-3 parameter holds nothing for it
    lost = paddle.optimizer.AdamW(learning_rate=0.1, parameters=[paddle.create_parameter([1], "float32")])
    held = rank_state(model, lost, topo)
    assert held.stepped == {"weight"}
    index = {"tensors": {"model/weight": {}, "optim/weight/moment1": {}, "optim/weight/beta1_pow_acc": {}}}
    assert unplaced_optimizer_states(index, held.stepped, held.models) == ["optim/weight/beta1_pow_acc",
                                                                            "optim/weight/moment1"]


def with_offload_masters(model, value=None):
    """Give every parameter a host fp32 master, as sharding stage 3 offload does (``param.master_weight``)."""
    for p in model.parameters():
        p.master_weight = paddle.full(p.shape, value, "float32") if value is not None else p.detach().clone()
    return model


def test_offload_master_weights_are_saved_as_master_states_and_restored(tmp_path):
    model, opt, sched = make()
    train(model, opt, sched, 2)
    with_offload_masters(model)
    model[0].weight.master_weight.add_(paddle.full(model[0].weight.shape, 1e-3))  # a master ahead of its weight
    ckpt = save_checkpoint(str(tmp_path / "checkpoint-2"), model=model, optimizer=opt)
    assert any(k.endswith("/master_weight") for k in read_index(ckpt)["tensors"])

    model2, opt2, _ = make(seed=99)
    with_offload_masters(model2, value=0.0)
    load_checkpoint(ckpt, model=model2, optimizer=opt2)
    for p, p2 in zip(model.parameters(), model2.parameters()):
        assert np.array_equal(p2.master_weight.numpy(), p.master_weight.numpy())
        assert np.array_equal(p2.numpy(), p.numpy())


def test_offload_masters_missing_from_a_checkpoint_start_from_the_loaded_weights(tmp_path):
    model, opt, sched = make()
    train(model, opt, sched, 2)
    ckpt = save_checkpoint(str(tmp_path / "checkpoint-2"), model=model, optimizer=opt)  # saved without offload

    for optimizer in (None, "fresh"):  # weights only (e.g. the best model at the end) or a full resume
        model2, opt2, _ = make(seed=99)
        with_offload_masters(model2, value=0.0)
        load_checkpoint(ckpt, model=model2, optimizer=opt2 if optimizer else None)
        for p, p2 in zip(model.parameters(), model2.parameters()):
            assert np.array_equal(p2.master_weight.numpy(), p.numpy())


def test_a_load_reads_each_file_once_checksumming_the_bytes_it_uses(tmp_path, monkeypatch):
    # One pass per file: the bytes that are checksummed are the bytes loaded (no verify pass, then a
    # second read through safetensors); same-layout tensors are read straight into their memory.
    from paddletrainer.checkpoint import read

    model, opt, sched = make()
    train(model, opt, sched, 2)
    ckpt = save_checkpoint(str(tmp_path / "checkpoint-2"), model=model, optimizer=opt, save_rng=False)
    opened, real_open = [], read.open_member

    def counting_open(ckpt_dir, name):  # every checkpoint file is opened through read.open_member
        opened.append(name)
        return real_open(ckpt_dir, name)

    monkeypatch.setattr(read, "open_member", counting_open)
    monkeypatch.setattr(read, "safe_open", lambda *a, **k: pytest.fail("a second read through safe_open"))
    model2, opt2, _ = make(seed=99)
    load_checkpoint(ckpt, model=model2, optimizer=opt2)
    shards = sorted(f for f in os.listdir(ckpt) if f.endswith(".safetensors"))
    assert sorted(f for f in opened if f.endswith(".safetensors")) == shards  # each shard opened once
    for a, b in zip(model.parameters(), model2.parameters()):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    s1, s2 = opt_state(model, opt), opt_state(model2, opt2)
    for k in s1:
        np.testing.assert_array_equal(s1[k], s2[k])


def test_small_files_and_exported_shards_are_read_once_and_verified_as_read(tmp_path, monkeypatch):
    # JSON/RNG files and the model shards an export merges: one open each (the bytes checksummed are the
    # bytes used), and a corrupt small file is still refused.
    import builtins

    from paddletrainer.checkpoint import read
    from paddletrainer.checkpoint.export import export_for_from_pretrained

    model, opt, sched = make()
    train(model, opt, sched, 2)
    ckpt = save_checkpoint(str(tmp_path / "checkpoint-2"), model=model, optimizer=opt, lr_scheduler=sched,
                           trainer_state={"global_step": 2}, data_state={"consumed_samples": 8})
    opened, real_open, real_open_member = [], builtins.open, read.open_member

    def counting_open(path, *args, **kwargs):
        opened.append(os.path.basename(str(path)))
        return real_open(path, *args, **kwargs)

    def counting_open_member(ckpt_dir, name):  # checkpoint files are opened through read.open_member
        opened.append(name)
        return real_open_member(ckpt_dir, name)

    monkeypatch.setattr(builtins, "open", counting_open)
    monkeypatch.setattr(read, "open_member", counting_open_member)
    monkeypatch.setattr(read, "safe_open", lambda *a, **k: pytest.fail("a second read through safe_open"))
    model2, opt2, sched2 = make(seed=99)
    res = load_checkpoint(ckpt, model=model2, optimizer=opt2, lr_scheduler=sched2)
    small = [f for f in read_index(ckpt)["files"] if not f.endswith(".safetensors") and f in opened]
    assert {"trainer_state.json", "scheduler.json", "data_state.json"} <= set(small) and res.rng_restored
    assert any(f.startswith("rng_state") for f in small)
    assert {f: opened.count(f) for f in small} == {f: 1 for f in small}

    opened.clear()
    export_for_from_pretrained(ckpt, str(tmp_path / "export"), require_config=False)
    model_files = sorted({p["file"] for k, t in read_index(ckpt)["tensors"].items() if k.startswith("model/")
                          for p in t["pieces"]})
    assert sorted(f for f in opened if f in model_files) == model_files  # each once: no verify pass first
    monkeypatch.undo()

    with open(os.path.join(ckpt, "scheduler.json"), "r+b") as f:
        first = f.read(1)
        f.seek(0)
        f.write(b"[" if first != b"[" else b"{")
    with pytest.raises(CheckpointCorruptError, match="scheduler.json"):
        load_checkpoint(ckpt, model=model2, optimizer=opt2, lr_scheduler=sched2)


def test_a_repeat_save_writes_the_optimizer_states_created_since_the_previous_save(tmp_path):
    # repeat saves reuse the previous save's writer assignment only while the tensors are the same: the
    # optimizer creates its moments at its first step, after a first save that had none
    model, opt, sched = make()
    saver = Checkpointer(model=model, optimizer=opt, save_rng=False)
    first = read_index(saver.save(str(tmp_path / "checkpoint-0")))
    assert not any(k.startswith("optim/") for k in first["tensors"])
    train(model, opt, sched, 1)
    again = saver.save(str(tmp_path / "checkpoint-1"))
    model2, opt2, _ = make(seed=99)
    load_checkpoint(again, model=model2, optimizer=opt2)
    s1, s2 = opt_state(model, opt), opt_state(model2, opt2)
    assert any("moment1" in str(k) for k in s1)
    for k in s1:
        np.testing.assert_array_equal(s1[k], s2[k])


def test_the_fast_crc32_gives_zlibs_values_chained_over_chunks():
    # checkpoints written with either implementation must verify with the other
    import zlib

    from paddletrainer.checkpoint.checksum import crc32

    data = np.random.default_rng(0).integers(0, 255, size=(3 << 20) + 7, dtype=np.uint8)
    chained = crc32(data[1000:], crc32(data[:1000]))
    assert chained == crc32(data) == zlib.crc32(data) and crc32(b"", 123) == 123


@pytest.mark.parametrize("implementation", ["isal", "zlib fallback"])
def test_crc32_combine_gives_the_crc32_of_the_concatenation(implementation, monkeypatch):
    # the safetensors writer reads each tensor once and combines the per-tensor crcs into the file's
    import zlib

    from paddletrainer.checkpoint import checksum

    if implementation == "zlib fallback":
        monkeypatch.setattr(checksum, "_crc32_combine", None)
    else:
        pytest.importorskip("isal.isal_zlib")
    data = np.random.default_rng(1).integers(0, 255, size=(5 << 20) + 13, dtype=np.uint8).tobytes()
    for cut in (0, 1, 4097, (1 << 20) + 3, len(data)):  # empty pieces on either side
        a, b = data[:cut], data[cut:]
        assert checksum.crc32_combine(zlib.crc32(a), zlib.crc32(b), len(b)) == zlib.crc32(data)


def test_a_rank_needing_some_tensors_of_a_file_reads_and_verifies_only_those(tmp_path):
    # e.g. replicated beta powers stored in rank 0's optimizer file: the other ranks must not read it all
    from paddletrainer.checkpoint.write import write_safetensors
    from paddletrainer.checkpoint.read import read_verified

    name = "optimizer.tp00_pp00.safetensors"
    arrays = {"big": np.arange(4096, dtype=np.float32), "small": np.array([0.9, 0.999], np.float32)}
    index = {"files": {name: write_safetensors(str(tmp_path / name), arrays)}}
    raw = bytearray((tmp_path / name).read_bytes())
    big_at = len(raw) - arrays["small"].nbytes - arrays["big"].nbytes  # arrays are stored in name order
    raw[big_at + 100] ^= 0xFF  # a bit flip inside "big" only
    (tmp_path / name).write_bytes(bytes(raw))
    got = read_verified(str(tmp_path), index, [name], needed={name: {"small"}})
    np.testing.assert_array_equal(got[name].get_tensor("small"), arrays["small"])  # "big" was neither read nor checked
    with pytest.raises(CheckpointCorruptError, match="crc32 of big"):
        read_verified(str(tmp_path), index, [name], needed={name: {"big"}})
    with pytest.raises(CheckpointCorruptError, match="crc32"):  # the whole file: its crc32
        read_verified(str(tmp_path), index, [name])
