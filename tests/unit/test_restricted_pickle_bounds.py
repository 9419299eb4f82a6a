"""The allowlist unpickler's cost is bounded by its input: the pickle's memo shares one object among its
references and the conversion to tensors keeps it shared (one tensor, not one copy a reference); a graph of shared
references is walked once per object, not as a tree; refusal messages quote a cut-short rendering; and whatever a
crafted file makes the post-processing raise is one error naming the file (nothing outside its ``try``)."""
import os
import pickle
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from paddletrainer.checkpoint import CheckpointError
from paddletrainer.checkpoint.read import UnsafeCheckpointFileError
from paddletrainer.checkpoint.restricted_pickle import load_pickle
from deadline import within

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def write(tmp_path, data: bytes, name="x.pdparams") -> str:
    path = tmp_path / name
    path.write_bytes(data)
    return str(path)


def test_memo_references_to_one_array_become_one_shared_tensor(tmp_path):
    array = np.arange(8192, dtype="float64")  # 64 KiB: 200 copies would be 12.8 MiB from a 66 KiB file
    out = load_pickle(write(tmp_path, pickle.dumps({"refs": [array] * 200}, protocol=2)))
    assert len(out["refs"]) == 200 and all(t is out["refs"][0] for t in out["refs"])
    np.testing.assert_array_equal(out["refs"][0].numpy(), array)
    named = load_pickle(write(tmp_path, pickle.dumps([("w", array)] * 50, protocol=2), "named.pdparams"))
    assert named[0].name == "w" and all(t is named[0] for t in named)


def test_a_graph_of_shared_references_is_walked_once_per_object_not_as_a_tree(tmp_path):
    graph = [np.zeros(1, "float32")]
    for _ in range(48):  # 49 lists; walked as a tree, 2**48 visits
        graph = [graph, graph]
    path = write(tmp_path, pickle.dumps(graph, protocol=2))
    code = textwrap.dedent(f"""
        from paddletrainer.checkpoint.restricted_pickle import load_pickle
        out = load_pickle({path!r})
        for _ in range(48):
            assert out[0] is out[1]
            out = out[0]
        print("loaded", list(out[0].shape))
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": REPO})
    assert proc.returncode == 0 and "loaded [1]" in proc.stdout, proc.stderr[-2000:]


def test_a_refusal_quotes_a_cut_short_rendering_of_what_the_file_holds(tmp_path):
    block = [[[0] * 100] * 100] * 100  # shared references: a 2 KiB pickle whose repr is 3 MB
    body = pickle.dumps(block, protocol=2)[:-1]  # without STOP
    path = write(tmp_path, body + pickle.EMPTY_TUPLE + pickle.REDUCE + pickle.STOP)  # "call" the list
    with pytest.raises(UnsafeCheckpointFileError) as info:
        load_pickle(path)
    message = str(info.value)
    assert message.startswith(f"{path}: refused to unpickle a call of [[[0, 0,") and len(message) < 1000, len(message)


def _deep_list(depth: int) -> bytes:
    return pickle.PROTO + b"\x02" + pickle.EMPTY_LIST * depth + pickle.APPEND * (depth - 1) + pickle.STOP


def _self_referencing() -> bytes:
    loop = []
    loop.append(loop)
    return pickle.dumps(loop, protocol=2)


CRAFTED = {  # a file the unpickler accepts but whose post-processing fails: what the one-line error says
    "self_referencing_list": (_self_referencing(), r"refused to unpickle a list that contains itself"),
    "nested_5000_deep": (_deep_list(5000), r"refused to unpickle containers nested more than 100 deep"),
    "name_table_a_list": (pickle.dumps({"StructuredToParameterName@@": [1], "w": np.zeros(2)}, protocol=2),
                          r"refused to unpickle a name table StructuredToParameterName@@ that is a list"),
    "split_info_names_no_part": (pickle.dumps({"UnpackBigParamInfor@@": {"w": {"slices": ["w@@.0"]}}}, protocol=2),
                                 r"is not a pickle paddle.save wrote \(KeyError: w@@.0\)"),
    "split_info_a_list": (pickle.dumps({"UnpackBigParamInfor@@": [1]}, protocol=2),
                          r"is not a pickle paddle.save wrote \(AttributeError: "),
}


@pytest.mark.parametrize("case", sorted(CRAFTED))
def test_post_processing_failures_of_a_crafted_pickle_are_one_error_naming_the_file(tmp_path, case):
    data, expected = CRAFTED[case]
    path = write(tmp_path, data)
    with pytest.raises(CheckpointError, match=expected) as info:
        load_pickle(path)
    assert str(info.value).startswith(path)


def test_a_fifo_in_place_of_a_pickle_is_refused_at_once(tmp_path):
    os.mkfifo(tmp_path / "rng_state.pth")  # opening it to read would wait for a writer
    with pytest.raises(CheckpointError, match=r"rng_state.pth: is a FIFO, not a regular file"):
        with within(5):
            load_pickle(str(tmp_path / "rng_state.pth"))
