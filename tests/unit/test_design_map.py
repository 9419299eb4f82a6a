"""docs/design.md is the map of the package: its module table names every module file, and only those."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "paddletrainer"


def modules_in_the_table():
    """The ``.py`` paths (relative to paddletrainer/) in the first column of design.md's "Modules" table."""
    text = (ROOT / "docs" / "design.md").read_text()
    section = text.split("\n## Modules\n", 1)[1].split("\n## ", 1)[0]
    named = set()
    for line in section.splitlines():
        if not line.startswith("| `"):
            continue
        first_cell = line.split("|")[1]
        named.update(re.findall(r"`([\w/]+\.py)`", first_cell))
    return named


def modules_in_the_package():
    return {str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py")}


def test_the_design_module_table_names_every_module_of_the_package_and_no_other():
    table, package = modules_in_the_table(), modules_in_the_package()
    assert not package - table, f"modules missing from docs/design.md's table: {sorted(package - table)}"
    assert not table - package, f"docs/design.md's table names files that do not exist: {sorted(table - package)}"
