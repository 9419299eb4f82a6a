"""Checkpoint load and export write tensors where they already live and merge on the host: they never use the
expected place (the GPU on a GPU machine), and they keep the storage Paddle's buffers share. fp16 parameters with
fp32 master weights and moments save, load and reshard (full → tensor-parallel halves)."""
import re
import types
from pathlib import Path

import numpy as np
import paddle
import pytest

from paddletrainer.checkpoint import load_checkpoint, read_index, save_checkpoint
from paddletrainer.checkpoint.export import export_for_from_pretrained
from paddletrainer.checkpoint.placement import tp_placement
from paddletrainer.checkpoint.local_state import ensure_accumulators

CHECKPOINT_PACKAGE = Path(__file__).resolve().parents[2] / "paddletrainer" / "checkpoint"


def topology(**kw):
    base = dict(world_size=1, rank=0, dp_degree=1, dp_rank=0, sharding_degree=1, sharding_rank=0,
                tp_degree=1, tp_rank=0, pp_degree=1, pp_rank=0)
    base.update(kw)
    return types.SimpleNamespace(**base)


def fp16_model_with_master_weights(out_features=6, fill=None):
    """Linear(4, out) in fp16 with AdamW(multi_precision): fp32 master weights and moments, filled with
    distinct values (the CPU build has no fp16 AdamW kernel, so the states are set rather than trained)."""
    paddle.seed(1)
    model = paddle.nn.Linear(4, out_features)
    model.to(dtype="float16")
    opt = paddle.optimizer.AdamW(learning_rate=0.1, parameters=model.parameters(), multi_precision=True)
    ensure_accumulators(opt)
    if fill is not None:
        rng = np.random.RandomState(fill)
        for t in [*opt._master_weights.values(), *(v for d in opt._accumulators.values() for v in d.values())]:
            t.set_value(rng.randn(*t.shape).astype("float32"))
    return model, opt


def states(model, opt):
    """Every state by (parameter position, kind): master weights and accumulators as host arrays."""
    out = {}
    for i, p in enumerate(model.parameters()):
        master = opt._master_weights[p.name]
        out[(i, "master_weight")] = master.numpy()
        for kind, accs in opt._accumulators.items():
            out[(i, kind)] = accs[master.name].numpy()
    return out


@pytest.fixture
def no_expected_place(monkeypatch):
    """Make any use of the expected place during the test an error (it is the GPU on a GPU machine)."""
    import paddle.base.framework as framework

    def refuse(*args, **kwargs):
        raise AssertionError("checkpoint code used the expected place")

    monkeypatch.setattr(framework, "_current_expected_place", refuse)
    monkeypatch.setattr(framework, "_current_expected_place_", refuse)


def test_fp16_params_with_fp32_masters_and_moments_save_and_load_in_place_without_the_expected_place(tmp_path, request):
    model, opt = fp16_model_with_master_weights(fill=3)
    ckpt = save_checkpoint(str(tmp_path / "checkpoint-1"), model=model, optimizer=opt)
    dtypes = {k: v["dtype"] for k, v in read_index(ckpt)["tensors"].items()}
    assert dtypes["model/weight"] == "float16" and dtypes["optim/weight/master_weight"] == "float32"
    assert dtypes["optim/weight/moment1"] == "float32"

    again, opt2 = fp16_model_with_master_weights(fill=9)
    tensors = [*again.parameters(), *opt2._master_weights.values(),
               *(v for d in opt2._accumulators.values() for v in d.values())]
    pointers = [t.data_ptr() for t in tensors]
    request.getfixturevalue("no_expected_place")
    # RNG states are per device by nature (Paddle's tracker reads the expected place itself), so this
    # test of tensor placement loads tensors only.
    load_checkpoint(ckpt, model=again, optimizer=opt2, load_rng=False)
    assert [t.data_ptr() for t in tensors] == pointers  # written into the existing storage, on its place
    np.testing.assert_array_equal(again.weight.numpy(), model.weight.numpy())
    got, want = states(again, opt2), states(model, opt)
    assert got.keys() == want.keys() and len(got) == 10
    for key in want:
        np.testing.assert_array_equal(got[key], want[key], err_msg=str(key))


def test_fp16_checkpoint_reshards_into_tensor_parallel_halves_with_masters_and_moments(tmp_path):
    model, opt = fp16_model_with_master_weights(fill=5)
    ckpt = save_checkpoint(str(tmp_path / "checkpoint-1"), model=model, optimizer=opt)
    halves = []
    for tp_rank in range(2):  # weight [4, 6] split on axis 1, bias [6] on axis 0: tp rank r holds columns 3r..3r+2
        part, part_opt = fp16_model_with_master_weights(out_features=3)
        part.weight.ckpt_placement = tp_placement([4, 3], 1, tp_rank, 2)
        part.bias.ckpt_placement = tp_placement([3], 0, tp_rank, 2)
        load_checkpoint(ckpt, model=part, optimizer=part_opt, topology=topology(tp_degree=2, tp_rank=tp_rank))
        halves.append((part, part_opt))
    full = states(model, opt)
    np.testing.assert_array_equal(np.concatenate([h.weight.numpy() for h, _ in halves], axis=1), model.weight.numpy())
    for kind in ("master_weight", "moment1", "moment2"):
        parts = [states(h, o) for h, o in halves]
        np.testing.assert_array_equal(np.concatenate([p[(0, kind)] for p in parts], axis=1), full[(0, kind)])
        np.testing.assert_array_equal(np.concatenate([p[(1, kind)] for p in parts], axis=0), full[(1, kind)])
    for p in (states(h, o) for h, o in halves):  # beta powers are replicated
        np.testing.assert_array_equal(p[(0, "beta1_pow_acc")], full[(0, "beta1_pow_acc")])


def test_export_merges_bf16_weights_on_the_host(tmp_path, request):
    model = paddle.nn.Linear(4, 3)
    model.to(dtype="bfloat16")
    ckpt = save_checkpoint(str(tmp_path / "checkpoint-1"), model=model)
    request.getfixturevalue("no_expected_place")
    path = export_for_from_pretrained(ckpt, str(tmp_path / "export"), require_config=False)
    assert Path(path).exists()


def test_checkpoint_code_never_places_data_on_the_expected_place():
    # Tensor.set_value(numpy) and paddle.to_tensor without place= both use the expected place (the GPU).
    offenders = []
    for path in sorted(CHECKPOINT_PACKAGE.glob("*.py")):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#")[0]
            if re.search(r"\.set_value\(", code) or (re.search(r"to_tensor\(", code) and "place=" not in code):
                offenders.append(f"{path.name}:{number}: {line.strip()}")
    assert offenders == []
