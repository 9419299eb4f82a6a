"""scripts/walk_trace.py's definitions (docs/design.md "One option, command line to action"): which functions are on
an option's walk, and what counts as entering a file."""
import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "walk_trace.py"
spec = importlib.util.spec_from_file_location("walk_trace", SCRIPT)
walk_trace = importlib.util.module_from_spec(spec)
spec.loader.exec_module(walk_trace)


def row(file, name, caller, lines, in_steps=False, first=1):
    return [file, first, name, caller, in_steps, lines]


def test_the_walk_is_what_the_option_adds_or_runs_differently_not_what_it_runs_alike():
    option = [row("a.py", "same", "", [2, 3]), row("a.py", "branch", "", [5, 7], first=4),
              row("b.py", "new", "a.py", [9], first=8)]
    baseline = [row("a.py", "same", "", [2, 3]), row("a.py", "branch", "", [5, 6], first=4),
                row("c.py", "only_without", "a.py", [1])]
    assert [r[2] for r in walk_trace.walk_of(option, baseline)] == ["branch", "new"]


def test_a_file_is_entered_once_per_calling_function_of_another_file_split_by_phase():
    walk = [row("a.py", "f", "", [1]),  # from the script: counted apart, not an entry
            row("b.py", "g", "a.py::f", [1]), row("b.py", "g.<locals>.<listcomp>", "b.py::g", [1]),
            row("b.py", "helper", "b.py::g", [1]),  # within the file: not an entry
            row("b.py", "h", "a.py::f", [1]),  # a.py's f again: the same entry
            row("b.py", "k", "a.py::other", [1]),  # another function of a.py: a second entry
            row("b.py", "step", "c.py::loop", [1], in_steps=True), row("b.py", "hook", "", [1], in_steps=True)]
    assert walk_trace.entries_of(walk, in_steps=False) == {"b.py": 2}
    assert walk_trace.entries_of(walk, in_steps=True) == {"b.py": 1}
    table = walk_trace.table("t", walk)
    assert "t: 2 files; most entries into one file 3" in table
    assert ("| 2 | `b.py` | 2 | 1 | 2 | 1 | g ← a.py, helper, h ← a.py, k ← a.py, step ← c.py, hook ← Paddle/script |"
            in table)


def test_the_caller_of_a_no_grad_decorated_library_function_is_the_library_function_that_called_it():
    import sys

    import paddle

    source = ("def callee():\n    return library_caller(sys._getframe())\n"
              "def caller():\n    return decorated()\n")
    scope = {"library_caller": walk_trace.library_caller, "sys": sys}
    exec(compile(source, walk_trace.PACKAGE + "fake_module.py", "exec"), scope)
    scope["decorated"] = paddle.no_grad()(scope["callee"])
    assert scope["caller"]() == "fake_module.py::caller"  # not "" (Paddle's wrapper is not a caller)
    assert scope["decorated"]() == ""  # called from this test: not library code
