"""A tiny PaddleNLP Llama checkpoint saved under one parallel layout loads under others, weights AND AdamW
state, through paddletrainer.parallel's real wrappers (fleet on CPU, gloo).

Proof of each load: the loading layout re-saves what it holds; the merged full tensors of that re-save
must equal the original checkpoint's bit for bit (every key: weights, moment1/2, beta powers), and the
next training step's loss must match the one the saving layout computed.
"""
import json
import os
import subprocess
import sys
import zlib

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ckpt_workers.launcher import HERE, launch  # noqa: E402

from paddletrainer.checkpoint import placement as L  # noqa: E402
from paddletrainer.checkpoint import read_index  # noqa: E402
from paddletrainer.checkpoint.read import PieceReader  # noqa: E402
from paddletrainer.checkpoint.reshard import read_placement  # noqa: E402

WORKER = "llama_layouts.py"
LAYOUT_FLAGS = {
    "single": [], "dp2": ["--dp", "2"], "pp2": ["--pp", "2"], "tp2": ["--tp", "2"],
    "tp2pp2": ["--tp", "2", "--pp", "2"], "sharding2_stage2": ["--sharding", "2", "--stage", "2"],
    "dp2_sharding2_stage1": ["--dp", "2", "--sharding", "2", "--stage", "1"],
    # segment 16: even the [32] norms are sliced, so rank 1 holds only alignment padding of them
    "sharding2_stage3": ["--sharding", "2", "--stage", "3", "--segment-size", "16"],
}
NPROC = {"single": 1, "dp2": 2, "pp2": 2, "tp2": 2, "tp2pp2": 4, "sharding2_stage2": 2, "dp2_sharding2_stage1": 4,
         "sharding2_stage3": 2}


def run(layout, mode, weights, out, extra=()):
    args = [mode, *LAYOUT_FLAGS[layout], "--weights", weights, "--out", out, *extra]
    os.makedirs(out, exist_ok=True)
    if NPROC[layout] == 1:
        subprocess.run([sys.executable, os.path.join(HERE, WORKER), *args], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=300)
    else:
        launch(WORKER, args, NPROC[layout], os.path.join(out, "log"))


def merged(ckpt):
    """Every tensor of a checkpoint (model and optimizer) as a full numpy array."""
    index = read_index(ckpt)
    for name, meta in index["files"].items():  # every file whole: its size and crc32 are the index's
        with open(os.path.join(ckpt, name), "rb") as f:
            raw = f.read()
        assert (len(raw), zlib.crc32(raw)) == (meta["size"], meta["crc32"]), name
    reader = PieceReader(ckpt)
    return {k: read_placement(index, k, L.replicated(t["shape"]), reader) for k, t in index["tensors"].items()}


def losses(out, mode):
    values = set()
    for f in os.listdir(out):
        if f.startswith(mode + ".rank"):
            values.add(json.load(open(os.path.join(out, f)))["loss3"])
    return values


@pytest.fixture(scope="module")
def weights(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("llama") / "weights")
    subprocess.run([sys.executable, os.path.join(HERE, WORKER), "weights", "--weights", path], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=300)
    return path


def check_loads(saved_layout, load_layouts, weights, root):
    src = os.path.join(root, saved_layout)
    run(saved_layout, "save", weights, src)
    ckpt = os.path.join(src, "checkpoint-2")
    reference = merged(ckpt)
    assert any(k.endswith("/moment1") for k in reference) and any(k.startswith("model/") for k in reference)
    (loss_saved,) = losses(src, "save")  # one value: every rank reports the global loss
    for layout in load_layouts:
        dst = os.path.join(root, f"{saved_layout}_to_{layout}")
        run(layout, "load", weights, dst, ["--from", ckpt])
        resaved = merged(os.path.join(dst, "checkpoint-resaved"))
        assert resaved.keys() == reference.keys(), layout
        for key in reference:
            np.testing.assert_array_equal(resaved[key], reference[key], err_msg=f"{saved_layout}->{layout} {key}")
        for loss in losses(dst, "load"):
            assert abs(loss - loss_saved) <= 1e-5 * abs(loss_saved), (layout, loss, loss_saved)
    return reference


def test_tp2_pp2_checkpoint_loads_in_one_process_in_dp2_and_in_pp2(weights, tmp_path):
    ref = check_loads("tp2pp2", ["single", "dp2", "pp2"], weights, str(tmp_path))
    assert ref["model/lm_head.weight"].shape == (32, 96)


def test_sharding_stage2_checkpoint_loads_in_one_process_in_tp2_and_in_stage3(weights, tmp_path):
    check_loads("sharding2_stage2", ["single", "tp2", "sharding2_stage3"], weights, str(tmp_path))
    index = read_index(os.path.join(str(tmp_path), "sharding2_stage2", "checkpoint-2"))
    # each sharding rank wrote only the optimizer states it owns
    owners = {p["file"] for k, t in index["tensors"].items() if k.startswith("optim/") for p in t["pieces"]}
    assert owners == {"optimizer.tp00_pp00_shard00.safetensors", "optimizer.tp00_pp00_shard01.safetensors"}


def test_sharding_stage3_flat_slices_load_in_one_process_and_in_dp2_sharding2_stage1(weights, tmp_path):
    check_loads("sharding2_stage3", ["single", "dp2_sharding2_stage1"], weights, str(tmp_path))
    index = read_index(os.path.join(str(tmp_path), "sharding2_stage3", "checkpoint-2"))
    pieces = index["tensors"]["optim/llama.norm.weight/moment1"]["pieces"]
    assert [p["flat"] for p in pieces] == [[0, 32], [32, 32]]  # the padded slice of rank 1 is empty
