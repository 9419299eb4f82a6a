"""One implementation of ParallelOptimizer per mode, each in its axis module, and no mode compared by name."""
import ast
import inspect
import textwrap
from pathlib import Path

from paddletrainer.parallel.data_parallel import LocalOptimizer
from paddletrainer.parallel.hybrid import HybridOptimizer
from paddletrainer.parallel.optimizer import ParallelOptimizer
from paddletrainer.parallel.sharding import Stage2Optimizer, Stage3Optimizer

PACKAGE = Path(__file__).resolve().parents[2] / "paddletrainer"
MODES = {"local", "hybrid", "stage2", "stage3"}


def mode_comparisons(tree) -> list:
    """Line numbers of comparisons with a mode's name, or with an optimizer's ``mode``/``_mode``."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            named = any(isinstance(o, ast.Constant) and o.value in MODES for o in operands)
            by_attribute = any(isinstance(o, ast.Attribute) and o.attr in ("mode", "_mode", "MODE") for o in operands)
            if named or by_attribute:
                lines.append(node.lineno)
    return lines


def test_every_mode_implements_the_interface_in_its_axis_module():
    modules = {cls.MODE: cls.__module__ for cls in (LocalOptimizer, HybridOptimizer, Stage2Optimizer, Stage3Optimizer)}
    assert modules == {"local": "paddletrainer.parallel.data_parallel", "hybrid": "paddletrainer.parallel.hybrid",
                       "stage2": "paddletrainer.parallel.sharding", "stage3": "paddletrainer.parallel.sharding"}
    for cls in (LocalOptimizer, HybridOptimizer, Stage2Optimizer, Stage3Optimizer):
        assert issubclass(cls, ParallelOptimizer)
        assert all(name in vars(cls) for name in ("sync_gradients", "step", "clear_grad", "named_counted_gradients"))


def test_no_module_compares_a_parallel_optimizer_mode():
    found = {str(p.relative_to(PACKAGE)): mode_comparisons(ast.parse(p.read_text())) for p in PACKAGE.rglob("*.py")}
    assert {f: lines for f, lines in found.items() if lines} == {}


def test_the_scan_finds_a_comparison_by_name_and_by_attribute():
    assert mode_comparisons(ast.parse("if opt.mode == 'x':\n    pass\nif m == 'stage2':\n    pass\n")) == [1, 3]


def once_per_step_breaches(class_source: str) -> list:
    """What a mode's class breaks of the once-per-step sync every mode keeps by convention: ``sync_gradients``
    begins ``if self._synced: return`` and ends with ``self._finish_sync()``; ``clear_grad`` begins
    ``self._synced = False`` (so a sync after it synchronises again)."""
    methods = {node.name: node for node in ast.walk(ast.parse(class_source)) if isinstance(node, ast.FunctionDef)}
    breaches = []
    sync, clear = methods.get("sync_gradients"), methods.get("clear_grad")
    if sync is None or ast.unparse(sync.body[0]) != "if self._synced:\n    return":
        breaches.append("sync_gradients does not return at once when synced")
    if sync is None or ast.unparse(sync.body[-1]) != "self._finish_sync()":
        breaches.append("sync_gradients does not end with self._finish_sync()")
    if clear is None or ast.unparse(clear.body[0]) != "self._synced = False":
        breaches.append("clear_grad does not begin by unsetting self._synced")
    return breaches


def test_every_mode_syncs_once_per_step_and_again_after_clear_grad():
    for cls in (LocalOptimizer, HybridOptimizer, Stage2Optimizer, Stage3Optimizer):
        assert once_per_step_breaches(textwrap.dedent(inspect.getsource(cls))) == [], cls.__name__


def test_the_once_per_step_check_sees_a_sync_that_runs_twice_and_a_clear_that_keeps_the_flag():
    broken = ("class M:\n    def sync_gradients(self):\n        self._model.sync()\n        self._finish_sync()\n"
              "    def clear_grad(self, set_to_zero=True):\n        self._optimizer.clear_grad()\n")
    assert once_per_step_breaches(broken) == ["sync_gradients does not return at once when synced",
                                              "clear_grad does not begin by unsetting self._synced"]
