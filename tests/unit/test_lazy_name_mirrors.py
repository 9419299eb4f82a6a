"""Each lazy name table (PEP 562) has a ``TYPE_CHECKING`` mirror beside it that imports every name from the module
the table resolves it from, and nothing else, so a type checker or an editor's go-to-definition reaches the code."""
import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "paddletrainer"
# file -> (its table, the package its relative imports start from)
TABLES = {
    "__init__.py": ("_EXPORTS", ""),
    "parallel/__init__.py": ("_PADDLE_NAMES", "parallel."),
    "runtime/__init__.py": ("_NAMES", "runtime."),
    "checkpoint/__init__.py": ("_EXPORTS", "checkpoint."),
    "trainer_utils.py": ("_PADDLE_NAMES", ""),
}


def table_and_mirror(path: Path, table_name: str, package: str):
    """``({name: "module[:attribute path]"} of the table, the same of the mirror)``, modules relative to the
    package root (``optim.schedules``)."""
    tree = ast.parse(path.read_text())
    table = next(ast.literal_eval(n.value) for n in tree.body if isinstance(n, ast.Assign)
                 and any(getattr(t, "id", None) == table_name for t in n.targets))
    if isinstance(table, tuple):
        table = {}
    expected = {name: (f"{package}{value[0]}:{value[1]}" if isinstance(value, tuple) else f"{package}{value}:{name}")
                for name, value in table.items()}
    [block] = [n for n in tree.body if isinstance(n, ast.If) and getattr(n.test, "id", None) == "TYPE_CHECKING"]
    imported, mirror, owners = {}, {}, set()
    for stmt in block.body:
        if isinstance(stmt, ast.ImportFrom):
            base = package + (stmt.module or "")
            for alias in stmt.names:
                if stmt.module is None:  # "from . import pipeline": a submodule
                    continue
                imported[alias.asname or alias.name] = f"{base}:{alias.name}"
        elif isinstance(stmt, ast.Assign):  # name = Class.method
            target, value = stmt.targets[0].id, ast.unparse(stmt.value)
            owner, attribute = value.split(".", 1)
            owners.add(owner)  # imported only to name its method
            mirror[target] = f"{imported[owner].split(':')[0]}:{owner}.{attribute}"
    mirror.update({name: where for name, where in imported.items() if name not in owners})
    return expected, mirror


@pytest.mark.parametrize("file", sorted(TABLES))
def test_the_type_checking_mirror_names_what_the_lazy_table_resolves(file):
    expected, mirror = table_and_mirror(PACKAGE / file, *TABLES[file])
    assert mirror == expected


def test_a_mirror_that_drifts_from_its_table_fails(tmp_path):
    source = ('_NAMES = {"A": "one", "B": "two"}\n'
              "if TYPE_CHECKING:\n    from .one import A\n    from .one import B\n")
    (tmp_path / "m.py").write_text(source)
    expected, mirror = table_and_mirror(tmp_path / "m.py", "_NAMES", "")
    assert expected != mirror and mirror["B"] == "one:B" and expected["B"] == "two:B"
