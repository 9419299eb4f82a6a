"""tests/conftest.py's markers: the smoke set names tests that exist, and the subject markers follow file names
and layout ids."""
import ast
import importlib.util
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[2]


def _conftest():
    spec = importlib.util.spec_from_file_location("suite_conftest", ROOT / "tests" / "conftest.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_smoke_test_exists_so_the_set_cannot_shrink_silently():
    conftest = _conftest()
    missing = []
    for node_id in conftest.SMOKE:
        path, name = node_id.split("::")
        functions = {f.name for f in ast.parse((ROOT / path).read_text()).body if isinstance(f, ast.FunctionDef)}
        if name not in functions:
            missing.append(node_id)
    assert len(conftest.SMOKE) == 3 and missing == []


def test_subject_markers_come_from_the_file_name_and_the_layout_id():
    conftest = _conftest()

    def item(path, callspec_id=None):
        return SimpleNamespace(fspath=ROOT / path, callspec=SimpleNamespace(id=callspec_id) if callspec_id else None)

    assert conftest.axes_of(item("tests/unit/test_checkpoint_reshard.py")) == {"checkpoint"}
    assert conftest.axes_of(item("tests/unit/test_moe_layer.py")) == {"moe", "ep"}
    assert conftest.axes_of(item("tests/unit/test_ring_attention.py")) == {"cp"}
    assert conftest.axes_of(item("tests/distributed/test_trainer_matrix.py", "llama-dp2_sep2")) == {"dp", "sep"}
    assert conftest.axes_of(item("tests/distributed/test_trainer_matrix.py", "llama-ep2_cp2")) == {"ep", "cp"}
