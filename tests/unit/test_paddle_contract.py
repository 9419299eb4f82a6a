"""paddle_contract: the one table of what paddletrainer relies on inside Paddle/PaddleNLP, its check, its accessors,
and a scan of the package (ast) that fails on a private reach or a patch the table does not list."""
import ast
import functools
import importlib
import linecache
import re
import sys
from pathlib import Path

import paddle
import pytest
from paddle.distributed import collective
from paddle.distributed.fleet.meta_parallel.sharding.group_sharded_stage3 import GroupShardedStage3

from paddletrainer import paddle_contract
from paddletrainer.runtime import paddle_requirement

PACKAGE = Path(__file__).resolve().parents[2] / "paddletrainer"
THIRD_PARTY = ("paddle", "paddlenlp")
# private names the scan finds that belong to neither Paddle nor PaddleNLP (a writer library's), by file
NOT_PADDLE = {("paddletrainer/metrics/writers.py", "_get_file_writer")}
# optional attributes of a user's argument dataclass, by PaddleNLP's (Hugging Face's) convention: not a Paddle object
CONVENTIONS = {("paddletrainer/argparser.py", "_argument_group_name")}


def test_the_contract_holds_on_the_pinned_paddle():
    assert paddle.__version__ == paddle_contract.DIGESTED_ON
    assert paddle_contract.check() == []


def test_a_broken_fill_predicate_is_a_line_starting_with_the_fills_file(monkeypatch):
    monkeypatch.delattr(collective, "_default_store")
    lines = paddle_contract.check()
    assert [line for line in lines if "_default_store" in line] == [
        "paddletrainer/parallel/cpu/group_stores.py: collective._default_store (the launcher's) is gone"]


def test_a_changed_digested_function_is_a_line_starting_with_sharding_py(monkeypatch):
    original = paddle_contract._paddle_source
    changed = GroupShardedStage3._get_allreduce_fn

    def source(func):
        text = original(func)
        return text + "        found_inf = None\n" if func is changed else text

    monkeypatch.setattr(paddle_contract, "_paddle_source", source)
    [line] = paddle_contract.check()
    assert line.startswith("paddletrainer/parallel/sharding.py: GroupShardedStage3._get_allreduce_fn differs from "
                           "Paddle 3.3.1's")


def test_an_attribute_paddle_no_longer_sets_is_a_line_starting_with_the_file_that_reads_it(monkeypatch):
    from paddle.distributed.fleet.meta_parallel import pipeline_parallel

    getlines = linecache.getlines

    def renamed(path, *args):
        lines = getlines(path, *args)
        return [line.replace("_delay_scale_loss", "_delay_loss") for line in lines] \
            if path == pipeline_parallel.__file__ else lines

    monkeypatch.setattr(linecache, "getlines", renamed)
    assert paddle_contract.check() == ["paddletrainer/optim/overflow.py: PipelineParallel no longer sets "
                                       "_delay_scale_loss (paddletrainer/paddle_contract.py reads it)"]


def test_an_accessor_raises_naming_the_paddle_version_instead_of_a_default():
    optimizer = paddle.optimizer.SGD(parameters=paddle.nn.Linear(2, 2).parameters())
    assert paddle_contract.optimizer_grad_clip(optimizer, "paddletrainer/parallel/clipping.py") is None
    del optimizer._grad_clip  # what a Paddle that renamed it looks like
    with pytest.raises(paddle_contract.PaddleContractError,
                       match=rf"^paddletrainer/parallel/clipping.py: SGD._grad_clip is gone in Paddle "
                             rf"{re.escape(paddle.__version__)} \(paddletrainer was checked against Paddle 3.3.1"):
        paddle_contract.optimizer_grad_clip(optimizer, "paddletrainer/parallel/clipping.py")
    assert paddle_contract.optimizer_grad_clip(object(), "x") is None  # not a Paddle optimizer: nothing to read


def test_the_version_gate_admits_exactly_the_version_the_digests_were_recorded_on():
    low, high = paddle_requirement.TESTED
    assert ".".join(map(str, low)) == paddle_contract.DIGESTED_ON == paddle_requirement.PADDLE_PIN
    assert high == (low[0], low[1], low[2] + 1)


# ---------------------------------------------------------------- the scan of the package

def _third_party_names(tree) -> set:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update((a.asname or a.name).split(".")[0] for a in node.names if a.name.split(".")[0] in THIRD_PARTY)
        elif isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").split(".")[0] in THIRD_PARTY:
            names.update(a.asname or a.name for a in node.names)
    return names


def _other_imports(tree) -> set:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level:
            names.update(a.asname or a.name for a in node.names)
    return names - _third_party_names(tree)


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__") and not name.startswith("_paddletrainer")


def _root(node):
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else None


def _is_paddle_class(node: ast.ClassDef, third: set) -> bool:
    return any(_root(base) in third for base in node.bases)


def _package_names(trees) -> set:
    """Names the package defines itself: functions, classes, module-level names, and the attributes and class
    attributes of its classes that do not subclass Paddle."""
    own = set()
    for tree in trees.values():
        third = _third_party_names(tree)
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                own.add(node.name)
            if isinstance(node, ast.ClassDef) and not _is_paddle_class(node, third):
                own.update(t.id for stmt in node.body if isinstance(stmt, ast.Assign) for t in stmt.targets
                           if isinstance(t, ast.Name))
                own.update(n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)
                           and isinstance(n.ctx, ast.Store) and _root(n.value) in ("self", "cls"))
        for stmt in tree.body:
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [getattr(stmt, "target", None)]
            own.update(t.id for t in targets if isinstance(t, ast.Name))
    return own


def _overrides(module_name: str, node: ast.ClassDef) -> set:
    """The private methods of our Paddle subclass ``node`` that a Paddle base class defines too (its bases
    evaluated in the module's namespace, so a class defined inside a function counts as well)."""
    namespace = {"paddle": paddle, **vars(importlib.import_module(module_name))}  # paddle: imported in a function
    bases = [eval(compile(ast.Expression(base), module_name, "eval"), namespace) for base in node.bases]  # noqa: S307
    paddle_bases = [b for base in bases for b in base.__mro__
                    if str(vars(b).get("__module__", "paddle")).split(".")[0] in THIRD_PARTY]
    return {f.name for f in node.body if isinstance(f, ast.FunctionDef) and _private(f.name)
            and any(f.name in vars(b) for b in paddle_bases)}


def third_party_reaches(tree, own: set, module_name: str) -> set:
    """The private names a module reads, writes, calls or overrides on Paddle/PaddleNLP objects, and every
    attribute it assigns onto a Paddle/PaddleNLP module or class (public ones too)."""
    third, other = _third_party_names(tree), _other_imports(tree)
    found, inside = set(), {}
    for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and _is_paddle_class(n, third)):
        mine = {f.name for f in cls.body if isinstance(f, ast.FunctionDef)}
        mine |= {n.attr for n in ast.walk(cls) if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store)
                 and _root(n.value) == "self"}
        inside.update((id(n), mine) for n in ast.walk(cls))
        found |= _overrides(module_name, cls)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            if isinstance(node.ctx, ast.Store) and _root(node.value) in third:
                found.add(node.attr)
                continue
            if not _private(node.attr) or _root(node.value) in other:
                continue
            if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                if id(node) in inside and node.attr not in inside[id(node)]:
                    found.add(node.attr)
            elif node.attr not in own:
                found.add(node.attr)
        elif isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("getattr", "hasattr", "setattr") \
                and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) \
                and isinstance(node.args[1].value, str) and _private(node.args[1].value) \
                and node.args[1].value not in own:
            found.add(node.args[1].value)
    return found


@functools.lru_cache(maxsize=1)
def _scan():
    """``([(file, module name, tree)], the package's own names)`` over every file but the contract itself."""
    trees = {p: ast.parse(p.read_text()) for p in sorted(PACKAGE.rglob("*.py"))}
    modules = []
    for path, tree in trees.items():
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        file = str(path.relative_to(PACKAGE.parent))
        if file != "paddletrainer/paddle_contract.py":
            modules.append((file, ".".join(parts[:-1] if parts[-1] == "__init__" else parts), tree))
    return modules, _package_names(trees)


def unlisted_reaches() -> list:
    """``(file, name)`` for every reach the scan finds that :data:`paddle_contract.SYMBOLS` does not list."""
    listed = {(s.owner, n) for s in paddle_contract.SYMBOLS for n in s.names}
    modules, own = _scan()
    return [(file, n) for file, module, tree in modules for n in sorted(third_party_reaches(tree, own, module))
            if (file, n) not in listed and (file, n) not in NOT_PADDLE | CONVENTIONS]


def test_every_private_reach_and_patch_of_paddle_in_the_package_is_in_the_table():
    assert unlisted_reaches() == []


def test_the_scan_finds_a_private_read_a_private_getattr_a_patch_and_an_override():
    source = (
        "import paddle\nfrom paddle.distributed import collective\nfrom paddle.optimizer import AdamW\n"
        "def f(optimizer, model):\n"
        "    model._brand_new_private\n"
        "    getattr(optimizer, '_another_private', None)\n"
        "    collective.new_group = None\n"
        "class Mine(AdamW):\n"
        "    def _create_accumulators(self, block, parameters):\n"
        "        return self._ours\n"
        "    def _helper(self):\n"
        "        self._ours = 1\n")
    module = type(paddle)("scan_probe")
    exec(compile(source, "scan_probe", "exec"), module.__dict__)
    sys.modules["scan_probe"] = module
    try:
        found = third_party_reaches(ast.parse(source), {"f", "Mine"}, "scan_probe")
    finally:
        del sys.modules["scan_probe"]
    assert found == {"_brand_new_private", "_another_private", "new_group", "_create_accumulators"}


def test_every_name_in_the_table_is_still_used_by_its_file_or_read_for_it_by_an_accessor():
    stale = [(s.owner, n) for s in paddle_contract.SYMBOLS for n in s.names if s.guard != paddle_contract.ACCESSOR
             and n not in (PACKAGE.parent / s.owner).read_text()]
    accessor_rows = {(s.owner, n) for s in paddle_contract.SYMBOLS if s.guard == paddle_contract.ACCESSOR
                     for n in s.names}
    accessor_files = {owner for owner, _ in accessor_rows}
    unlisted_facts = [(owner, name) for _cls, name, owner in paddle_contract._ACCESSOR_FACTS
                      if (owner, name) not in accessor_rows]
    fact_owners = {owner for _cls, _name, owner in paddle_contract._ACCESSOR_FACTS}
    not_importing = [owner for owner in accessor_files - fact_owners
                     if "paddle_contract import" not in (PACKAGE.parent / owner).read_text()]
    assert (stale, unlisted_facts, not_importing) == ([], [], [])


def test_no_silent_private_getattr_on_a_third_party_object_outside_the_contract():
    modules, own = _scan()
    calls = [f"{file}:{node.lineno} {ast.unparse(node)}" for file, _module, tree in modules for node in ast.walk(tree)
             if isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("getattr", "hasattr")
             and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant)
             and isinstance(node.args[1].value, str) and _private(node.args[1].value)
             and node.args[1].value not in own and not _inside_assumptions(tree, node)
             and (file, node.args[1].value) not in CONVENTIONS]
    assert calls == []


def _inside_assumptions(tree, target) -> bool:
    """True inside a fill's ``assumptions()``: a guard, whose predicates may look for an attribute."""
    return any(target in ast.walk(f) for f in ast.walk(tree)
               if isinstance(f, ast.FunctionDef) and f.name == "assumptions")


def test_design_md_lists_every_reliance_that_stays_on_every_device():
    design = (PACKAGE.parent / "docs" / "design.md").read_text()
    section = design.split("\n### What stays on every device\n", 1)[1].split("\n### ", 1)[0].split("\n## ", 1)[0]
    missing = [(s.owner, n) for s in paddle_contract.SYMBOLS if s.devices == paddle_contract.EVERY
               and s.kind in (paddle_contract.PATCH, paddle_contract.OVERRIDE) for n in s.names[:1]
               if n not in section]
    assert missing == []
