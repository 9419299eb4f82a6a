"""One implementation of ParallelOptimizer per mode, each in its axis module, and no mode compared by name."""
import ast
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
