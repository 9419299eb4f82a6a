"""Tensor-parallel column shards saved by 2 real processes reload as full tensors (1 process) and as
row shards (2 processes), for weights and AdamW state; replicas are written once; async publishes."""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ckpt_workers.launcher import launch  # noqa: E402
from ckpt_workers import manual_tp  # noqa: E402

from paddletrainer.checkpoint import load_checkpoint  # noqa: E402


def test_tp_column_shards_reshard_to_single_process_and_to_row_shards(tmp_path):
    launch("manual_tp.py", ["save", tmp_path], 2, tmp_path / "log_save")
    assert {f for f in os.listdir(tmp_path) if f.endswith(".ok")} == {"save.rank0.ok", "save.rank1.ok"}
    expected = dict(np.load(tmp_path / "expected.npz"))

    # one process, full tensors, no topology at all
    net, opt = manual_tp.make({}, None, 1)
    res = load_checkpoint(str(tmp_path / "checkpoint-3"), model=net, optimizer=opt)
    manual_tp.check(net, opt, expected)
    assert res.trainer_state == {"global_step": 3}
    assert not res.rng_restored and "RNG state skipped" in res.warnings[0]  # layout changed 2 -> 1

    # the async copy holds the same tensors
    net2, opt2 = manual_tp.make({}, None, 1)
    load_checkpoint(str(tmp_path / "checkpoint-4"), model=net2, optimizer=opt2)
    manual_tp.check(net2, opt2, expected)

    launch("manual_tp.py", ["load_rows", tmp_path], 2, tmp_path / "log_load")
    assert {"load_rows.rank0.ok", "load_rows.rank1.ok"} <= set(os.listdir(tmp_path))


def test_flat_sliced_params_and_moments_from_2_ranks_load_as_full_tensors(tmp_path):
    launch("manual_tp.py", ["save_flat", tmp_path], 2, tmp_path / "log_flat")
    expected = manual_tp.expected_arrays()
    net, opt = manual_tp.make({}, None, 1)
    load_checkpoint(str(tmp_path / "checkpoint-flat"), model=net, optimizer=opt)
    manual_tp.check(net, opt, expected)
