"""The allowlist unpickler checks what a pickle's ``BUILD`` hands to ``__setstate__`` before it runs: names alone
are not enough, since numpy's ``dtype.__setstate__`` takes any flags (a dtype that "holds objects" makes its arrays
read the file's bytes as pointers) and ``ndarray.__setstate__`` any shape and bytes."""
import collections
import copyreg
import os
import pickle
import subprocess
import sys
import textwrap

import numpy as np
import paddle
import pytest

from paddletrainer.checkpoint.read import UnsafeCheckpointFileError
from paddletrainer.checkpoint.restricted_pickle import load_pickle

try:  # numpy >= 2 moved the module; both names are on the allowlist
    from numpy._core.multiarray import _reconstruct
except ImportError:
    from numpy.core.multiarray import _reconstruct

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GENERATOR_STATE = paddle.framework.core.GeneratorState


class _Reduces:
    """Pickles as ``func(*args)`` followed, when ``state`` is given, by ``BUILD(state)``: any state a file can hold."""

    def __init__(self, func, args, state=None):
        self.func, self.args, self.state = func, args, state

    def __reduce__(self):
        return (self.func, self.args) if self.state is None else (self.func, self.args, self.state)


class _New(_Reduces):
    """Pickles as ``NEWOBJ(cls)``, then ``BUILD(state)`` when given (the pickler checks ``__class__`` is ``cls``)."""

    def __init__(self, cls, state=None):
        super().__init__(copyreg.__newobj__, (cls,), state)

    __class__ = property(lambda self: self.args[0])


def _dtype(spec, flags, copy=True):
    """numpy's pickle of ``dtype(spec)``, with ``flags`` in its state (numpy's own: 0 for numbers)."""
    return _Reduces(np.dtype, (spec, False, copy), (3, "<", None, None, None, -1, -1, flags))


def _array(state):
    return _Reduces(_reconstruct, (np.ndarray, (0,), b"b"), state)


def test_the_control_numpy_s_and_paddle_s_own_states_load(tmp_path):
    """The control: with the states numpy and Paddle pickle, the crafted construction below loads (so its refusals
    are the checks), and so does whatever numpy pickles for numbers: a big-endian dtype is the native one plus a
    state with the other byte order, a Fortran array a flag, a scalar its bytes."""
    path = tmp_path / "ok.pdparams"
    path.write_bytes(pickle.dumps({"w": _array((1, (2,), _dtype("i8", 0), False, np.arange(2).tobytes())),
                                   "rng": _New(GENERATOR_STATE, (-1, 42, 0, [49, 50]))}))
    loaded = load_pickle(str(path), return_numpy=True)
    np.testing.assert_array_equal(loaded["w"], np.arange(2))
    assert loaded["rng"].__getstate__()[:3] == (-1, 42, 0)
    obj = {"be": np.arange(3, dtype=">f4"), "le": np.arange(3, dtype="<i2"), "s": np.float16(1.5), "b": np.bool_(1),
           "c": np.arange(2, dtype="c8").reshape(1, 2), "f": np.asfortranarray(np.arange(6.0).reshape(2, 3))}
    for protocol in (2, 3, 4):
        path.write_bytes(pickle.dumps(obj, protocol=protocol))
        loaded, expected = load_pickle(str(path), return_numpy=True), pickle.loads(path.read_bytes())
        for key in obj:
            assert loaded[key].dtype == expected[key].dtype and type(loaded[key]) is type(expected[key]), key
            np.testing.assert_array_equal(loaded[key], expected[key])


_PROBE = textwrap.dedent("""
    import sys
    import numpy as np
    from paddletrainer.checkpoint.read import UnsafeCheckpointFileError
    from paddletrainer.checkpoint.restricted_pickle import load_pickle
    try:
        load_pickle(sys.argv[1], return_numpy=True)
        print("LOADED")
    except UnsafeCheckpointFileError as e:
        print("REFUSED", e)
    print("INT64_HOLDS_OBJECTS", np.dtype("int64").hasobject, np.arange(3).sum())
""")


@pytest.mark.parametrize("flags,copy", [(1, True), (63, True), (1, False)])
def test_a_dtype_state_that_says_objects_is_refused_before_any_array_reads_the_file_bytes_as_pointers(
        tmp_path, flags, copy):
    # copy=False: numpy's dtype('int64') itself, whose state a BUILD would change for the whole process
    path = tmp_path / "model_state.pdparams"
    path.write_bytes(pickle.dumps({"w": _array((1, (2,), _dtype("i8", flags, copy), False, b"\x41" * 16))}))
    # in a child process: an array of "objects" at address 0x4141414141414141 may crash when freed
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-c", _PROBE, str(path)], capture_output=True, text=True, timeout=300,
                          env=env, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f"REFUSED {path}: refused to unpickle the numpy dtype state (BUILD)" in proc.stdout, proc.stdout
    assert "INT64_HOLDS_OBJECTS False 3" in proc.stdout
    assert "get_clear_loop" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-2000:]


_HOSTILE = {
    # an array state whose bytes do not fill its shape (numpy would allocate the shape first when byte-swapping)
    "short_data": (_array((1, (10 ** 9,), np.dtype("i8"), False, b"\0" * 16)), "needs 8000000000"),
    "long_data": (_array((1, (1,), np.dtype("i8"), False, b"\0" * 16)), "needs 8"),
    # numpy's pickle of an array of objects: a list where the bytes go
    "list_data": (_array((1, (2,), np.dtype("i8"), False, [1, 2])), "the numpy array state (BUILD)"),
    # an empty array of a trillion bytes, with no BUILD at all
    "huge_reconstruct": (_Reduces(_reconstruct, (np.ndarray, (2 ** 40,), b"b")), "_reconstruct"),
    # a record dtype (its fields could hold objects; paddle.save writes numbers only)
    "record_dtype": (_Reduces(np.dtype, ("f4,i4", False, True)), "only bool, integer, float and complex"),
    # a second BUILD of an array already built (numpy would free the memory its views still use)
    "rebuild": (_Reduces(eval, ("data", {"data": np.arange(4.0)}), (1, (1,), np.dtype("f8"), False, b"\0" * 8)),
                "a state (BUILD) for a ndarray"),
    # BUILD on anything else: attributes set on an OrderedDict
    "dict_state": (_Reduces(collections.OrderedDict, (), {"x": 1}), "a state (BUILD) for a OrderedDict"),
    # a Paddle generator state never given its state (any use of it crashes), or given a foreign one
    "unbuilt_generator": (_New(GENERATOR_STATE), "GeneratorState pickled without"),
    "generator_state": (_New(GENERATOR_STATE, ("x",)), "the GeneratorState state"),
    # NEWOBJ of anything but a GeneratorState
    "newobj_other": (_New(collections.OrderedDict), "NEWOBJ of collections.OrderedDict()"),
}


@pytest.mark.parametrize("case", sorted(_HOSTILE))
def test_a_state_or_construction_numpy_and_paddle_never_pickle_is_refused_naming_the_file(tmp_path, case):
    obj, named = _HOSTILE[case]
    path = tmp_path / "optimizer.pdopt"
    path.write_bytes(pickle.dumps({"w": obj}, protocol=2))
    with pytest.raises(UnsafeCheckpointFileError) as info:
        load_pickle(str(path), return_numpy=True)
    assert str(info.value).startswith(f"{path}: refused to unpickle ") and named in str(info.value), str(info.value)

