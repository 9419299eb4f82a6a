"""A checkpoint whose files are wrong in any way ends in a CheckpointError naming the file (and the field), never a
traceback, a hang, a read outside the checkpoint or nonsense accepted: file names that leave the directory,
symlinks out of it, FIFOs and devices, ill-typed or out-of-range fields of every JSON file (each with a matching
size and crc32 in the index, as whoever can edit a file can also edit the index), malformed indexes, absurd
safetensors headers, and a full disk while the index is published."""
import errno
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import zlib

import paddle
import pytest

from paddletrainer import Trainer, TrainingArguments
from paddletrainer.checkpoint import CheckpointError, placement as L, load_checkpoint, read_index, save_checkpoint
from paddletrainer.checkpoint import save as ckpt_io
from paddletrainer.checkpoint.export import merged_model_state
from paddletrainer.parallel.layout import Layout
from toy_models import RegressionModel, regression_data

SHARD = L.model_file_name(0, 0)
RNG = L.rng_file_name(Layout(world_size=1).cell_name({}))
HERE = os.path.dirname(os.path.abspath(__file__))


def args_for(out, **kw):
    base = dict(output_dir=str(out), per_device_train_batch_size=8, learning_rate=0.1, max_steps=2, logging_steps=1,
                save_strategy="steps", save_steps=2, evaluation_strategy="no", disable_tqdm=True, report_to="none",
                seed=42)
    base.update(kw)
    return TrainingArguments(**base)


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """checkpoint-2 of a 2-step Trainer run: shards, index, trainer/data state, scheduler, RNG."""
    out = tmp_path_factory.mktemp("source") / "out"
    Trainer(model=RegressionModel(), args=args_for(out), train_dataset=regression_data()).train()
    return str(out / "checkpoint-2")


@pytest.fixture
def ckpt(source, tmp_path):
    """A fresh copy of the source checkpoint (``tmp_path/run/checkpoint-2``) for a test to damage."""
    path = str(tmp_path / "run" / "checkpoint-2")
    shutil.copytree(source, path)
    return path


def load(path):
    scheduler = paddle.optimizer.lr.LambdaDecay(0.1, lambda s: 1.0)
    return load_checkpoint(path, model=RegressionModel(), lr_scheduler=scheduler)


def edit_index(path, fn):
    index_path = os.path.join(path, L.INDEX_NAME)
    with open(index_path) as f:
        index = json.load(f)
    new = fn(index)
    with open(index_path, "w") as f:
        json.dump(index if new is None else new, f)


def rewrite(path, name, data: bytes):
    """Replace file ``name`` by ``data`` and make the index agree with it (size + crc32)."""
    with open(os.path.join(path, name), "wb") as f:
        f.write(data)
    edit_index(path, lambda index: index["files"][name].update(size=len(data), crc32=zlib.crc32(data)))


def edit_json(path, name, fn):
    with open(os.path.join(path, name)) as f:
        doc = json.load(f)
    new = fn(doc)
    rewrite(path, name, json.dumps(doc if new is None else new).encode())


def assert_names(error, path, field):
    """The one-line message ``<file>: field <field>: <what is wrong>; valid: <what would be>``."""
    message = str(error)
    if field:
        assert message.startswith(f"{path}: field {field}: ") and "; valid: " in message, message
    else:
        assert message.startswith(f"{path}: "), message
    assert "\n" not in message


def set_in(keys, value):
    """fn(doc) setting doc[k0][k1]... = value (value ``...``: delete it)."""
    def fn(doc):
        for k in keys[:-1]:
            doc = doc[k]
        if value is ...:
            del doc[keys[-1]]
        else:
            doc[keys[-1]] = value
    return fn


# ----------------------------------------------------------------------------------- JSON fields
TRAINER_STATE_CASES = {
    "global_step_negative": (set_in(["global_step"], -5), "global_step"),
    "global_step_string": (set_in(["global_step"], "2"), "global_step"),
    "global_step_float": (set_in(["global_step"], 2.5), "global_step"),
    "global_step_bool": (set_in(["global_step"], True), "global_step"),
    "consumed_samples_1e30": (set_in(["consumed_samples"], 1e30), "consumed_samples"),
    "consumed_samples_negative": (set_in(["consumed_samples"], -16), "consumed_samples"),
    "skipped_steps_string": (set_in(["skipped_steps"], "0"), "skipped_steps"),
    "epoch_string": (set_in(["epoch"], "half"), "epoch"),
    "total_flos_negative": (set_in(["total_flos"], -1.0), "total_flos"),
    "log_history_object": (set_in(["log_history"], {}), "log_history"),
    "log_history_entry_number": (set_in(["log_history"], [3]), "log_history[0]"),
    "best_model_checkpoint_number": (set_in(["best_model_checkpoint"], 5), "best_model_checkpoint"),
    "is_world_process_zero_string": (set_in(["is_world_process_zero"], "yes"), "is_world_process_zero"),
    "a_list": (lambda doc: [doc], ""),
}
DATA_STATE_CASES = {
    "consumed_samples_1e30": (set_in(["consumed_samples"], 1e30), "consumed_samples"),
    "consumed_samples_negative": (set_in(["consumed_samples"], -1), "consumed_samples"),
    "consumed_samples_string": (set_in(["consumed_samples"], "16"), "consumed_samples"),
    "consumed_samples_null": (set_in(["consumed_samples"], None), "consumed_samples"),
    "consumed_samples_missing": (set_in(["consumed_samples"], ...), "consumed_samples"),
    "a_number": (lambda doc: 16, ""),
    # a resume sets gradient_accumulation_steps = global_batch_size / (per-device batch x data ranks)
    "global_batch_size_zero": (set_in(["global_batch_size"], 0), "global_batch_size"),
    "global_batch_size_negative": (set_in(["global_batch_size"], -8), "global_batch_size"),
    "global_batch_size_string": (set_in(["global_batch_size"], "eight"), "global_batch_size"),
    "global_batch_size_float": (set_in(["global_batch_size"], 8.5), "global_batch_size"),
}
RNG_CASES = {
    "python_state_short": (lambda d: d["python"].update(state=d["python"]["state"][:10]), "python.state"),
    "python_word_negative": (set_in(["python", "state", 0], -1), "python.state[0]"),
    "python_position_beyond": (set_in(["python", "state", 624], 9999), "python.state[624]"),
    "python_gauss_string": (set_in(["python", "gauss_next"], "x"), "python.gauss_next"),
    "numpy_key_above_uint32": (set_in(["numpy", "keys", 0], 2 ** 40), "numpy.keys[0]"),
    "numpy_pos_beyond": (set_in(["numpy", "pos"], 700), "numpy.pos"),
    "numpy_has_gauss_string": (set_in(["numpy", "has_gauss"], "no"), "numpy.has_gauss"),
    "numpy_missing": (set_in(["numpy"], ...), "numpy"),
    "paddle_empty": (set_in(["paddle"], []), "paddle"),
    "paddle_seed_negative": (set_in(["paddle", 0, "seed"], -1), "paddle[0].seed"),
    "paddle_engine_text": (set_in(["paddle", 0, "engine"], "not numbers"), "paddle[0].engine"),
    "tracker_list": (set_in(["tracker"], []), "tracker"),
}
SCHEDULER_CASES = {
    "last_epoch_string": (set_in(["last_epoch"], "2"), "last_epoch"),
    "last_epoch_below_minus_one": (set_in(["last_epoch"], -7), "last_epoch"),
    "last_lr_missing": (set_in(["last_lr"], ...), "last_lr"),
    "last_lr_string": (set_in(["last_lr"], "0.1"), "last_lr"),
}
JSON_CASES = [(L.TRAINER_STATE_NAME, c, *v) for c, v in TRAINER_STATE_CASES.items()] + \
    [(L.DATA_STATE_NAME, c, *v) for c, v in DATA_STATE_CASES.items()] + \
    [(RNG, c, *v) for c, v in RNG_CASES.items()] + [(L.SCHEDULER_NAME, c, *v) for c, v in SCHEDULER_CASES.items()]


@pytest.mark.parametrize("name,case,fn,field", JSON_CASES, ids=[f"{n.split('.')[0]}-{c}" for n, c, *_ in JSON_CASES])
def test_an_ill_typed_or_out_of_range_field_is_named_with_its_file(ckpt, name, case, fn, field):
    edit_json(ckpt, name, fn)
    with pytest.raises(CheckpointError) as info:
        load(ckpt)
    assert_names(info.value, os.path.join(ckpt, name), field)


@pytest.mark.parametrize("name,fn,field", [
    (L.TRAINER_STATE_NAME, set_in(["global_step"], -5), "global_step"),  # would train 7 steps instead of 0 more
    (L.TRAINER_STATE_NAME, set_in(["global_step"], ...), "global_step"),  # would restart the schedule at step 0
    (L.DATA_STATE_NAME, set_in(["consumed_samples"], 1e30), "consumed_samples"),  # would end training at once
    (L.DATA_STATE_NAME, set_in(["global_batch_size"], 0), "global_batch_size"),  # would accumulate 0 micro-batches
    (L.DATA_STATE_NAME, set_in(["global_batch_size"], "8x"), "global_batch_size"),  # was a raw ValueError
    # an old checkpoint (no global batch recorded) computes it from its arguments
    (L.TRAINING_ARGS_NAME, set_in(["per_device_train_batch_size"], 0), "per_device_train_batch_size"),
    (L.TRAINING_ARGS_NAME, set_in(["gradient_accumulation_steps"], "2"), "gradient_accumulation_steps"),
], ids=["global_step_-5", "global_step_missing", "consumed_samples_1e30", "global_batch_size_0",
        "global_batch_size_string", "old_per_device_batch_0", "old_accumulation_string"])
def test_resuming_the_trainer_from_nonsense_state_stops_with_the_file_and_field(ckpt, name, fn, field):
    if name == L.TRAINING_ARGS_NAME:
        edit_json(ckpt, L.DATA_STATE_NAME, set_in(["global_batch_size"], ...))
    edit_json(ckpt, name, fn)
    trainer = Trainer(model=RegressionModel(), args=args_for(os.path.dirname(ckpt), max_steps=4),
                      train_dataset=regression_data())
    with pytest.raises(CheckpointError) as info:
        trainer.train(resume_from_checkpoint=ckpt)
    assert_names(info.value, os.path.join(ckpt, name), field)
    assert not os.path.exists(os.path.join(os.path.dirname(ckpt), "checkpoint-4"))  # nothing trained


# ------------------------------------------------------------------------------------- the index
INDEX_CASES = {
    "files_missing": (set_in(["files"], ...), "files"),
    "files_a_list": (set_in(["files"], []), "files"),
    "size_a_string": (set_in(["files", SHARD, "size"], "184"), f"files[{SHARD!r}].size"),
    "crc32_negative": (set_in(["files", SHARD, "crc32"], -1), f"files[{SHARD!r}].crc32"),
    "crc32_missing": (set_in(["files", SHARD, "crc32"], ...), f"files[{SHARD!r}].crc32"),
    "tensors_missing": (set_in(["tensors"], ...), "tensors"),
    "pieces_empty": (set_in(["tensors", "model/linear.weight", "pieces"], []), "tensors['model/linear.weight'].pieces"),
    "piece_file_unlisted": (set_in(["tensors", "model/linear.weight", "pieces", 0, "file"], "other.safetensors"),
                            "tensors['model/linear.weight'].pieces[0].file"),
    "piece_outside_tensor": (set_in(["tensors", "model/linear.weight", "pieces", 0, "offsets"], [5, 0]),
                             "tensors['model/linear.weight'].pieces[0]"),
    "dtype_unknown": (set_in(["tensors", "model/linear.weight", "dtype"], "complex128"),
                      "tensors['model/linear.weight'].dtype"),
    "version_a_string": (set_in(["version"], "2"), "version"),
    "version_newer": (set_in(["version"], L.FORMAT_VERSION + 1), "version"),
    "rng_files_a_string": (set_in(["rng_files"], "yes"), "rng_files"),
    "a_list": (lambda index: [index], ""),
    "topology_degree_zero": (set_in(["topology", "dp_degree"], 0), "topology['dp_degree']"),
    "peft_a_list": (set_in(["peft"], ["lora"]), "peft"),
    "peft_type_unknown": (set_in(["peft"], {"type": "prefix", "config": {"r": 8, "lora_alpha": 16}}), "peft.type"),
    "peft_config_missing": (set_in(["peft"], {"type": "lora"}), "peft.config"),
    "peft_r_zero": (set_in(["peft"], {"type": "lora", "config": {"r": 0, "lora_alpha": 16}}), "peft.config.r"),
    "peft_alpha_string": (set_in(["peft"], {"type": "lora", "config": {"r": 8, "lora_alpha": "16"}}),
                          "peft.config.lora_alpha"),
}


@pytest.mark.parametrize("case", list(INDEX_CASES))
def test_a_malformed_index_is_named_with_its_field(ckpt, case):
    fn, field = INDEX_CASES[case]
    edit_index(ckpt, fn)
    with pytest.raises(CheckpointError) as info:
        load(ckpt)
    assert_names(info.value, os.path.join(ckpt, L.INDEX_NAME), field)


def move_shard_out(ckpt, new_name_of):
    """Copy the model shard beside the checkpoint and point the index at it by ``new_name_of(outside path)``."""
    outside = os.path.join(os.path.dirname(ckpt), "x.safetensors")
    shutil.copy(os.path.join(ckpt, SHARD), outside)
    name = new_name_of(outside)

    def fn(index):
        index["files"][name] = index["files"].pop(SHARD)
        for t in index["tensors"].values():
            for p in t["pieces"]:
                p["file"] = name if p["file"] == SHARD else p["file"]
    edit_index(ckpt, fn)
    os.remove(os.path.join(ckpt, SHARD))
    return name


@pytest.mark.parametrize("how", ["dotdot", "absolute"])
def test_index_file_names_that_leave_the_checkpoint_are_refused(ckpt, how):
    name = move_shard_out(ckpt, lambda outside: "../x.safetensors" if how == "dotdot" else outside)
    with pytest.raises(CheckpointError) as info:
        load(ckpt)
    assert_names(info.value, os.path.join(ckpt, L.INDEX_NAME), f"files[{name!r}]")


@pytest.mark.parametrize("name", [SHARD, L.TRAINER_STATE_NAME, RNG])
def test_a_symlink_out_of_the_checkpoint_is_refused_and_one_inside_is_followed(ckpt, name):
    outside = os.path.join(os.path.dirname(ckpt), "elsewhere")
    os.rename(os.path.join(ckpt, name), outside)
    os.symlink(outside, os.path.join(ckpt, name))
    with pytest.raises(CheckpointError, match=rf"{name}: is a symlink to .*outside the checkpoint directory"):
        load(ckpt)
    os.remove(os.path.join(ckpt, name))
    os.rename(outside, os.path.join(ckpt, "renamed"))
    os.symlink("renamed", os.path.join(ckpt, name))  # inside: a good checkpoint still loads
    assert load(ckpt).trainer_state["global_step"] == 2


@pytest.mark.parametrize("case", ["marker_without_index", "index_not_json", "shard_is_a_directory",
                                  "state_is_a_directory"])
def test_a_damaged_checkpoint_directory_is_named(ckpt, case):
    target = {"marker_without_index": L.INDEX_NAME, "index_not_json": L.INDEX_NAME,
              "shard_is_a_directory": SHARD, "state_is_a_directory": L.TRAINER_STATE_NAME}[case]
    path = os.path.join(ckpt, target)
    os.remove(path)
    if case == "index_not_json":
        with open(path, "w") as f:
            f.write('{"format": ')
    elif case.endswith("directory"):
        os.mkdir(path)
    with pytest.raises(CheckpointError) as info:
        load(ckpt)
    assert target in str(info.value) and "\n" not in str(info.value)
    if case.endswith("directory"):
        assert "is a directory, not a regular file" in str(info.value)


# -------------------------------------------------------------------------------- shard headers
def edit_header(ckpt, fn=None, length=None):
    """Rewrite the model shard's safetensors header (``fn(header)``) or its length field; index updated."""
    with open(os.path.join(ckpt, SHARD), "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    if length is not None:
        rewrite(ckpt, SHARD, struct.pack("<Q", length) + data[8:])
        return
    header = json.loads(data[8: 8 + n])
    fn(header)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    rewrite(ckpt, SHARD, struct.pack("<Q", len(text)) + text + data[8 + n:])


HEADER_CASES = {
    "offsets_reversed": (set_in(["linear.bias", "data_offsets"], [4, 0]), "linear.bias.data_offsets"),
    "offsets_beyond_the_file": (set_in(["linear.bias", "data_offsets"], [0, 1 << 40]), "linear.bias.data_offsets"),
    "shape_strings": (set_in(["linear.bias", "shape"], ["a"]), "linear.bias.shape[0]"),
    "dtype_unknown": (set_in(["linear.bias", "dtype"], "F128"), "linear.bias.dtype"),
    "entry_a_list": (set_in(["linear.bias"], [1]), "linear.bias"),
}


@pytest.mark.parametrize("case", list(HEADER_CASES))
def test_an_absurd_shard_header_is_refused_before_anything_is_allocated(ckpt, case):
    fn, field = HEADER_CASES[case]
    edit_header(ckpt, fn)
    with pytest.raises(CheckpointError, match=re.escape(f"{SHARD}: not a safetensors file (header field {field}: ")):
        load(ckpt)


def test_a_header_length_beyond_the_file_is_named_on_the_unverified_export_path(ckpt):
    # (the verified load already refused it; safetensors' own reader raised its SafetensorError)
    edit_header(ckpt, length=1 << 60)
    with pytest.raises(CheckpointError, match=rf"{SHARD}: not a safetensors file"):
        merged_model_state(ckpt, verify=False)


# ------------------------------------------------------------------------- FIFOs and devices
_CHILD = r"""
import json, os, resource, signal, sys, time
sys.path.insert(0, sys.argv[1])
import paddle
from paddletrainer.checkpoint import CheckpointError, load_checkpoint
from toy_models import RegressionModel
model = RegressionModel()
with open("/proc/self/status") as f:  # on the old code /dev/zero was read until memory ran out: cap it
    vm = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
resource.setrlimit(resource.RLIMIT_AS, (vm + (2 << 30), resource.getrlimit(resource.RLIMIT_AS)[1]))
def timeout(*_):
    raise TimeoutError("load still running after 20 s")
signal.signal(signal.SIGALRM, timeout)
for case, path in json.loads(sys.argv[2]).items():
    t0 = time.time()
    signal.alarm(20)
    try:
        load_checkpoint(path, model=model)
        out = {"type": None, "message": ""}
    except BaseException as e:
        out = {"type": type(e).__name__, "checkpoint_error": isinstance(e, CheckpointError), "message": str(e)}
    signal.alarm(0)
    print(json.dumps({"case": case, "seconds": time.time() - t0, **out}), flush=True)
os._exit(0)
"""
SPECIAL_CASES = {  # case: (file, what replaces it)
    "shard_dev_zero": (SHARD, "/dev/zero"), "shard_fifo": (SHARD, "fifo"),
    "state_dev_zero": (L.TRAINER_STATE_NAME, "/dev/zero"), "state_fifo": (L.TRAINER_STATE_NAME, "fifo"),
    "rng_fifo": (RNG, "fifo"), "index_dev_zero": (L.INDEX_NAME, "/dev/zero"), "index_fifo": (L.INDEX_NAME, "fifo"),
}


@pytest.fixture(scope="module")
def special_results(source, tmp_path_factory):
    """Load a checkpoint with each file of SPECIAL_CASES replaced by a FIFO or a symlink to /dev/zero, in a
    child process (the old code hung or read without end there): ``{case: result}``, no entry for a hang."""
    root = tmp_path_factory.mktemp("special")
    paths = {}
    for case, (name, what) in SPECIAL_CASES.items():
        path = str(root / case / "checkpoint-2")
        shutil.copytree(source, path)
        os.remove(os.path.join(path, name))
        if what == "fifo":
            os.mkfifo(os.path.join(path, name))
        else:
            os.symlink(what, os.path.join(path, name))
        paths[case] = path
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")]))
    try:
        out = subprocess.run([sys.executable, "-c", _CHILD, HERE, json.dumps(paths)], capture_output=True, text=True,
                             timeout=240, env=env).stdout
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
    return {r["case"]: dict(r, path=paths[r["case"]]) for r in map(json.loads, out.splitlines()) if r.get("case")}


@pytest.mark.parametrize("case", list(SPECIAL_CASES))
def test_a_fifo_or_device_in_place_of_a_file_is_refused_at_once(special_results, case):
    assert case in special_results, "the load hung"
    r, (name, what) = special_results[case], SPECIAL_CASES[case]
    assert r["type"] is not None and r["checkpoint_error"], r
    assert r["seconds"] < 10, r
    expected = "is a FIFO, not a regular file" if what == "fifo" else \
        f"is a symlink to {what}, outside the checkpoint directory"
    assert f"{name}: {expected}" in r["message"], r


# ----------------------------------------------------------------------------------- full disk
def test_a_full_disk_while_the_index_is_published_names_the_file_and_keeps_the_previous_checkpoint(tmp_path,
                                                                                                    monkeypatch):
    model = RegressionModel()
    first = save_checkpoint(str(tmp_path / "checkpoint-1"), model=model, trainer_state={"global_step": 1})
    real_write = ckpt_io.write_file

    def disk_full_on_the_index(path, data):
        if os.path.basename(path) == L.INDEX_NAME:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(path, data)

    monkeypatch.setattr(ckpt_io, "write_file", disk_full_on_the_index)
    with pytest.raises(CheckpointError) as info:
        save_checkpoint(str(tmp_path / "checkpoint-2"), model=model, trainer_state={"global_step": 2})
    message = str(info.value)
    assert L.INDEX_NAME in message and os.strerror(errno.ENOSPC) in message
    assert "previous checkpoint is intact" in message
    monkeypatch.undo()
    assert os.listdir(tmp_path) == ["checkpoint-1"]  # nothing published, the unpublished tmp dir removed
    assert load_checkpoint(first, model=RegressionModel()).trainer_state == {"global_step": 1}


def test_a_directly_saved_checkpoints_index_covers_every_file_written(tmp_path):
    """``save_checkpoint`` called by a user: no file on disk that the index does not list (no silent partial save)."""
    out = save_checkpoint(str(tmp_path / "checkpoint-1"), model=RegressionModel())
    index = read_index(out)
    on_disk = {n for n in os.listdir(out) if not n.startswith(".") and n != "checkpoint_index.json"}
    assert on_disk == set(index["files"])
