"""The package's import graph, module-level and function-level imports alike (read with ast, nothing imported),
has no cycle; a function-level import of one of our own modules is one of the few documented ones."""
import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "paddletrainer"

# (importer, imported): the function-level imports of package modules, each with its reason.
LAZY_ALLOWED = {
    # rank properties build the process groups on first use; topology imports paddle, the arguments must not
    ("paddletrainer.config.arguments_base", "paddletrainer.parallel.topology"),
}
# What parallel/ must not import (a module or a package and everything under it): the arguments layer (PaddleNLP's
# option tables and their checks in config/paddlenlp_options; the builders; the arguments) and the layers that use
# parallel/ (the Trainer, checkpoint, metrics, runtime: its rollback and replica check sit above parallel/, so the
# device facts parallel/ needs live in paddletrainer/device.py). parallel/ takes a ParallelConfig instead.
FORBIDDEN_FROM_PARALLEL = ("paddletrainer.config", "paddletrainer.training_args", "paddletrainer.trainer",
                           "paddletrainer.checkpoint", "paddletrainer.metrics", "paddletrainer.runtime")
# parallel/__init__.py imports its paddle modules with importlib on first attribute access (PEP 562): edges the
# import statements do not show, read from its tables and allowed as function-level imports
LAZY_TABLES = ("_PADDLE_NAMES", "_SUBMODULES")
# trainer_utils is both a leaf (every layer imports its paddle-free types) and PaddleNLP's module path for names
# that need paddle, which it resolves from their implementations on first attribute access (its _PADDLE_NAMES,
# name -> (module, attribute)). Those "alias" edges are followed only once trainer_utils has finished loading, so
# they cannot make an import order fail; they are kept out of the cycle check (which guards the layering of
# import statements) but must name modules that exist.
ALIAS_MODULE = "paddletrainer.trainer_utils"


def alias_table_edges() -> set:
    """The modules ``trainer_utils._PADDLE_NAMES`` resolves its PaddleNLP names from."""
    for node in ast.parse((PACKAGE / "trainer_utils.py").read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "_PADDLE_NAMES" for t in node.targets):
            return {f"paddletrainer.{module}" for module, _ in ast.literal_eval(node.value).values()}
    raise AssertionError("trainer_utils has no _PADDLE_NAMES table")


def lazy_table_edges(path: Path, package: str) -> set:
    """The modules a package ``__init__`` names in its ``LAZY_TABLES`` (literal tuples of submodule names, or
    dicts of public name -> submodule name)."""
    modules = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) in LAZY_TABLES for t in node.targets):
            table = ast.literal_eval(node.value)
            modules.update(f"{package}.{m}" for m in (table.values() if isinstance(table, dict) else table))
    return modules


def type_checking_nodes(tree) -> set:
    """The ids of the nodes inside ``if TYPE_CHECKING:`` blocks (imports for type checkers only)."""
    return {id(n) for block in ast.walk(tree) if isinstance(block, ast.If)
            and getattr(block.test, "id", None) == "TYPE_CHECKING" for stmt in block.body for n in ast.walk(stmt)}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph():
    """``{module: {imported package module: "module"|"function"}}`` over every file of the package."""
    files = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph = {}
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        edges = {}
        tree = ast.parse(path.read_text())
        function_nodes = {id(n) for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                          for n in ast.walk(f)}
        mirrors = type_checking_nodes(tree)
        for node in ast.walk(tree):
            if id(node) in mirrors:
                continue  # the lazy tables' mirrors for type checkers: never executed
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(anchor + ([node.module] if node.module else []))
                # "from pkg import sub" imports the module pkg.sub; "from mod import name" imports mod
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in files else base for a in node.names]
            else:
                continue
            where = "function" if id(node) in function_nodes else "module"
            for target in targets:
                if target in files and target != name and edges.get(target) != "module":
                    edges[target] = where
        if path.name == "__init__.py":
            for target in lazy_table_edges(path, name):
                assert target in files, f"{name} names a lazy module {target} that does not exist"
                edges.setdefault(target, "function")
        if name == ALIAS_MODULE:
            for target in alias_table_edges():
                assert target in files, f"{name} resolves a name from {target}, which does not exist"
                edges.setdefault(target, "alias")
        graph[name] = edges
    return graph


def find_cycle(graph):
    """One cycle as a list of modules (first == last), or None."""
    state, stack = {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        state[node] = "done"
        stack.pop()
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def without_alias_edges(graph):
    return {src: {dst: kind for dst, kind in edges.items() if kind != "alias"} for src, edges in graph.items()}


def test_the_import_graph_with_function_level_imports_has_no_cycle():
    graph = import_graph()
    assert len(graph) > 40 and graph["paddletrainer.trainer"]  # the walk found the package and its imports
    cycle = find_cycle(without_alias_edges(graph))
    assert cycle is None, " -> ".join(cycle)


def test_trainer_utils_alias_edges_are_read_from_its_table_and_only_they_are_left_out():
    graph = import_graph()
    aliases = {dst for dst, kind in graph[ALIAS_MODULE].items() if kind == "alias"}
    assert {"paddletrainer.runtime.seeding", "paddletrainer.optim.schedules", "paddletrainer.data.loader"} <= aliases
    assert all(kind != "alias" for src, edges in graph.items() if src != ALIAS_MODULE for kind in edges.values())
    assert find_cycle(graph) is not None  # e.g. trainer_utils -> optim.schedules -> trainer_utils, through an alias


def test_the_cycle_finder_finds_a_function_level_cycle():
    graph = {"a": {"b": "module"}, "b": {"c": "function"}, "c": {"a": "module"}, "d": {}}
    assert find_cycle(graph) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b": "module"}, "b": {}}) is None


def test_function_level_imports_of_package_modules_are_only_the_documented_ones():
    graph = import_graph()
    pep562 = {("paddletrainer.parallel", dst) for dst in lazy_table_edges(PACKAGE / "parallel" / "__init__.py",
                                                                          "paddletrainer.parallel")}
    lazy = {(src, dst) for src, edges in graph.items() for dst, where in edges.items() if where == "function"}
    assert lazy <= LAZY_ALLOWED | pep562, sorted(lazy - LAZY_ALLOWED - pep562)


def test_the_graph_has_the_edges_of_the_parallel_packages_lazy_table():
    # importlib.import_module edges: paddletrainer.parallel reaches each module of its PEP 562 table
    edges = import_graph()["paddletrainer.parallel"]
    for module in ("topology", "apply", "optimizer", "data_parallel", "collectives", "clipping", "pipeline"):
        assert edges.get(f"paddletrainer.parallel.{module}") == "function", module


def test_a_module_importing_the_parallel_package_closes_a_cycle_through_the_lazy_table():
    # the cycle the lazy table can hide: collectives -> parallel (package) -> (lazy) collectives
    graph = import_graph()
    graph["paddletrainer.parallel.collectives"] = {**graph["paddletrainer.parallel.collectives"],
                                                  "paddletrainer.parallel": "module"}
    assert find_cycle(graph) is not None


def upward_edges_of_parallel(graph):
    """``(importer, imported)`` for every edge from ``paddletrainer.parallel`` (or below) into
    ``FORBIDDEN_FROM_PARALLEL``, sorted."""
    def inside(module, package):
        return module == package or module.startswith(package + ".")

    return sorted((src, dst) for src, edges in graph.items() if inside(src, "paddletrainer.parallel")
                  for dst in edges if any(inside(dst, p) for p in FORBIDDEN_FROM_PARALLEL))


def test_parallel_imports_neither_the_arguments_layer_nor_the_layers_above_it():
    assert upward_edges_of_parallel(import_graph()) == []


def test_the_upward_edge_check_sees_module_and_function_level_edges_and_spares_lookalikes():
    graph = {
        "paddletrainer.parallel.config": {"paddletrainer.config.paddlenlp_options": "module",
                                          "paddletrainer.parallel.layout": "module"},
        "paddletrainer.parallel.apply": {"paddletrainer.checkpoint.save": "function",
                                         "paddletrainer.trainer_utils": "module"},  # not paddletrainer.trainer
        "paddletrainer.parallel": {"paddletrainer.config.builders": "module"},
        "paddletrainer.checks": {"paddletrainer.config.builders": "module"},  # not parallel/
    }
    assert upward_edges_of_parallel(graph) == [
        ("paddletrainer.parallel", "paddletrainer.config.builders"),
        ("paddletrainer.parallel.apply", "paddletrainer.checkpoint.save"),
        ("paddletrainer.parallel.config", "paddletrainer.config.paddlenlp_options"),
    ]
