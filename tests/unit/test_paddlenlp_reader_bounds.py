"""The readers of PaddleNLP's files (unified checkpoints, a LoRA merge's base model) follow our own format's rule:
plain names inside the named directory, no symlink out, regular files, sizes bounded before a read, every
safetensors header field checked, one error naming the file and field; a float tensor is never read from integer
bytes. Small hand-made files: an index, a shard, a symlink."""
import json
import os
import struct

import numpy as np
import paddle
import pytest
from safetensors.numpy import save_file

from paddletrainer.checkpoint import CheckpointError
from paddletrainer.checkpoint.read import MAX_WEIGHT_MAP_BYTES
from paddletrainer.checkpoint.paddlenlp_unified import load_paddlenlp_unified_checkpoint, unified_checkpoint_index
from paddletrainer.checkpoint.peft import read_base_weights
from deadline import within

SHARD = "model-00001-of-00001.safetensors"
WEIGHTS = {"weight": np.arange(6, dtype="float32").reshape(2, 3), "bias": np.ones(3, dtype="float32")}


def write_unified(ckpt, weight_map=None, index_name="model.safetensors.index.json"):
    """A unified checkpoint of ``nn.Linear(2, 3)``'s weights: one shard and its index."""
    os.makedirs(ckpt, exist_ok=True)
    save_file(WEIGHTS, os.path.join(ckpt, SHARD))
    with open(os.path.join(ckpt, index_name), "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map or {k: SHARD for k in WEIGHTS}}, f)
    return str(ckpt)


def write_header(path, header: dict, data: bytes = b""):
    text = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + data)


@pytest.mark.parametrize("where", ["dotdot", "absolute"])
def test_a_weight_map_naming_a_file_outside_the_directory_is_refused(tmp_path, where):
    write_unified(tmp_path / "elsewhere")  # bytes anywhere on disk that must never reach the model
    outside = {"dotdot": "../elsewhere/" + SHARD, "absolute": str(tmp_path / "elsewhere" / SHARD)}[where]
    ckpt = write_unified(tmp_path / "ckpt", {k: outside for k in WEIGHTS})
    with pytest.raises(CheckpointError, match=r"model.safetensors.index.json: field weight_map\.(weight|bias): "
                                              r".* valid: the name of a file in the checkpoint directory"):
        unified_checkpoint_index(ckpt)


def test_a_shard_symlinked_out_of_the_directory_is_refused(tmp_path):
    write_unified(tmp_path / "elsewhere")
    ckpt = write_unified(tmp_path / "ckpt")
    os.remove(os.path.join(ckpt, SHARD))
    os.symlink(tmp_path / "elsewhere" / SHARD, os.path.join(ckpt, SHARD))
    with pytest.raises(CheckpointError, match=rf"{SHARD}: is a symlink to .*, outside the checkpoint directory"):
        unified_checkpoint_index(ckpt)


def test_an_oversized_unified_index_is_refused_before_it_is_read(tmp_path):
    ckpt = write_unified(tmp_path / "ckpt")
    with open(os.path.join(ckpt, "model.safetensors.index.json"), "r+b") as f:
        f.truncate(MAX_WEIGHT_MAP_BYTES + 1)  # sparse: no disk used
    with pytest.raises(CheckpointError, match=rf"model.safetensors.index.json: is {MAX_WEIGHT_MAP_BYTES + 1} "
                                              r"bytes, more than a checkpoint index can be"):
        unified_checkpoint_index(ckpt)


def test_a_fifo_as_the_unified_index_is_refused_at_once(tmp_path):
    ckpt = write_unified(tmp_path / "ckpt")
    os.remove(os.path.join(ckpt, "model.safetensors.index.json"))
    os.mkfifo(os.path.join(ckpt, "model.safetensors.index.json"))  # opening it to read would wait for a writer
    with pytest.raises(CheckpointError, match=r"model.safetensors.index.json: is a FIFO, not a regular file"):
        with within(5):
            unified_checkpoint_index(ckpt)


BAD_HEADERS = {  # header of a shard holding "weight" -> the field the error names
    "a_list": ([1, 2], "header is not a JSON object"),
    "no_shape": ({"weight": {"dtype": "F32", "data_offsets": [0, 24]}}, "shape"),
    "text_shape": ({"weight": {"dtype": "F32", "shape": ["2", 3], "data_offsets": [0, 24]}}, "shape"),
    "offsets_a_number": ({"weight": {"dtype": "F32", "shape": [2, 3], "data_offsets": 24}}, "data_offsets"),
    "entry_a_string": ({"weight": "F32"}, "weight"),
    "negative_dim": ({"weight": {"dtype": "F32", "shape": [-2, -3], "data_offsets": [0, 24]}}, "shape"),
}


@pytest.mark.parametrize("case", sorted(BAD_HEADERS))
def test_a_malformed_unified_safetensors_header_is_one_error_naming_file_and_field(tmp_path, case):
    header, field = BAD_HEADERS[case]
    ckpt = write_unified(tmp_path / "ckpt", {"weight": SHARD})
    write_header(os.path.join(ckpt, SHARD), header, bytes(24))
    with pytest.raises(CheckpointError) as info:
        unified_checkpoint_index(ckpt)
    assert f"{SHARD}: not a safetensors file" in str(info.value) and field in str(info.value), str(info.value)


def test_float_weights_relabelled_as_integers_are_refused_not_loaded(tmp_path):
    ckpt = write_unified(tmp_path / "ckpt")
    with open(os.path.join(ckpt, SHARD), "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header, data = json.loads(f.read(n)), f.read()
    header["weight"]["dtype"] = "I32"  # the same 4 bytes per value, read as integers and cast to float
    write_header(os.path.join(ckpt, SHARD), header, data)
    model = paddle.nn.Linear(2, 3)
    with pytest.raises(CheckpointError, match=r"dtype mismatch: model/weight is int32 in the checkpoint but "
                                              r"float32 in the model"):
        load_paddlenlp_unified_checkpoint(ckpt, model=model, load_rng=False)


def test_the_control_a_good_unified_checkpoint_loads(tmp_path):
    model = paddle.nn.Linear(2, 3)
    load_paddlenlp_unified_checkpoint(write_unified(tmp_path / "ckpt"), model=model, load_rng=False)
    np.testing.assert_array_equal(model.weight.numpy(), WEIGHTS["weight"])


def test_a_base_model_index_naming_files_outside_it_is_refused(tmp_path):
    secret = tmp_path / "secret"
    secret.mkdir()
    save_file({"weight": np.full((2, 3), 7, "float32")}, str(secret / "s.safetensors"))
    base = tmp_path / "base"
    base.mkdir()
    (base / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"weight": "../secret/s.safetensors"}}))
    with pytest.raises(CheckpointError, match=r"model.safetensors.index.json: field weight_map.weight: "
                                              r"\"../secret/s.safetensors\""):
        read_base_weights(str(base))
    os.remove(base / "model.safetensors.index.json")
    os.symlink(secret / "s.safetensors", base / "model.safetensors")
    with pytest.raises(CheckpointError, match=r"model.safetensors: is a symlink to .*, outside the checkpoint"):
        read_base_weights(str(base))


def test_the_control_a_base_model_s_sharded_weights_are_read(tmp_path):
    base = write_unified(tmp_path / "base")
    got = read_base_weights(base)
    assert sorted(got) == sorted(WEIGHTS) and all(np.array_equal(got[k], WEIGHTS[k]) for k in WEIGHTS)


def _mutants(data: bytes, seed: int, count: int):
    """``data`` cut at every 7th offset, then ``count`` copies with 1-4 bytes set to random values (seeded)."""
    rng = np.random.RandomState(seed)
    yield from (data[:n] for n in range(0, len(data), 7))
    for _ in range(count):
        mutant = bytearray(data)
        for pos in rng.randint(0, len(data), size=rng.randint(1, 5)):
            mutant[pos] = rng.randint(0, 256)
        yield bytes(mutant)


def _outcomes(tmp_path, name, data, seed, load):
    """What ``load`` did with each mutant of file ``name``: {"loaded" | "CheckpointError" | other exception}."""
    seen = {}
    for i, mutant in enumerate(_mutants(data, seed, 300)):
        with open(tmp_path / name, "wb") as f:
            f.write(mutant)
        try:
            with within(10):
                load()
            kind = "loaded"
        except CheckpointError:
            kind = "CheckpointError"
        except BaseException as e:  # noqa: BLE001 - the fuzz's finding: anything but a CheckpointError
            kind = f"{type(e).__name__}: {str(e)[:100]} (mutant {i})"
        seen.setdefault(kind, 0)
        seen[kind] += 1
    return seen


@pytest.mark.parametrize("name", [SHARD, "model.safetensors.index.json"])
def test_fuzzed_unified_files_load_or_end_in_one_checkpoint_error(tmp_path, name):
    ckpt = write_unified(tmp_path)
    data = open(os.path.join(ckpt, name), "rb").read()
    seen = _outcomes(tmp_path, name, data, 7, lambda: load_paddlenlp_unified_checkpoint(
        ckpt, model=paddle.nn.Linear(2, 3), load_rng=False))
    assert set(seen) <= {"loaded", "CheckpointError"} and seen.get("CheckpointError"), seen


def test_fuzzed_pickles_load_or_end_in_one_checkpoint_error(tmp_path):
    from paddletrainer.checkpoint.restricted_pickle import load_pickle

    paddle.save({"weight": paddle.to_tensor(WEIGHTS["weight"]), "step": 3, "names": ["a", "b"]},
                str(tmp_path / "state.pdparams"))
    data = (tmp_path / "state.pdparams").read_bytes()
    seen = _outcomes(tmp_path, "state.pdparams", data, 11, lambda: load_pickle(str(tmp_path / "state.pdparams")))
    assert set(seen) <= {"loaded", "CheckpointError"} and seen.get("CheckpointError"), seen
