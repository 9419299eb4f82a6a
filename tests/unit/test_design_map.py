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


# names in backticks that are variables, third-party roots or file kinds, not paddletrainer modules
NOT_MODULES = {"args", "param", "obj", "self", "paddle", "paddlenlp", "fleet", "dist", "np", "os", "sys",
               "segment_parallel_utils", "group_sharded_stage3"}
FILE_SUFFIXES = ("json", "pdparams", "pdopt", "pth", "safetensors", "py", "md", "txt", "lock", "yaml", "toml")


def folder_path_is_stale(token: str) -> bool:
    """``token`` is a path into one of the package's folders without ``.py`` (``parallel/cpu/``,
    ``checkpoint/files``, ``config/builders.parallel_config_of``) that is neither a folder nor a module there."""
    match = re.fullmatch(r"([a-z_]+(?:/[a-z_0-9]+)*)/?(?:\.[A-Za-z_]\w*)*(?:\(\))?", token)
    if not match or "/" not in token or not (PACKAGE / match.group(1).split("/")[0]).is_dir():
        return False
    path = PACKAGE / match.group(1)
    return not (path.is_dir() or path.with_suffix(".py").is_file())


def stale_module_names(text: str) -> list:
    """Backticked names in ``text`` that look like a paddletrainer module (``pkg/mod.py``, ``pkg.mod.name``,
    ``mod.name``) and name none: a renamed or removed module."""
    files = modules_in_the_package()
    modules = {f[:-3].replace("/", ".").removesuffix(".__init__") for f in files}
    bases = {m.rsplit(".", 1)[-1] for m in modules} | {m.split(".", 1)[0] for m in modules}
    stale = []
    for token in re.findall(r"`([^`\s]+)`", text):
        token = token.removeprefix("paddletrainer.").removeprefix("paddletrainer/")
        if re.fullmatch(r"\w+\.py", token):
            continue
        if folder_path_is_stale(token):
            stale.append(token)
            continue  # a bare file name: ours in the module tables (checked above), or a PaddleNLP script's
        if re.fullmatch(r"[\w/]+\.py", token):
            if token.startswith(("scripts/", "tests/", "llm_examples/")):
                if not (ROOT / token).is_file():
                    stale.append(token)
            elif not any(f == token or f.endswith("/" + token) for f in files):
                stale.append(token)
            continue
        match = re.match(r"([a-z_][a-z0-9_]*)\.([A-Za-z_]\w*)", token)
        if not match or match.group(1) in NOT_MODULES or match.group(2) in FILE_SUFFIXES:
            continue
        if match.group(1) not in bases:
            stale.append(token)
    return sorted(set(stale))


def test_design_md_names_no_module_that_no_longer_exists():
    assert stale_module_names((ROOT / "docs" / "design.md").read_text()) == []


def test_the_stale_name_check_flags_a_removed_module_and_spares_variables_and_files():
    text = ("`configs.parallel_inputs()` `parallel/topology.py` `runtime/device.py` `config.builders` "
            "`args.sharding` `trainer_state.json` `topology.init_topology`")
    assert stale_module_names(text) == ["configs.parallel_inputs()", "runtime/device.py"]


def test_the_stale_name_check_flags_a_folder_path_without_py_that_names_no_module():
    # the walk tables name modules as `checkpoint/files` or `parallel/layout.option_axes`
    text = ("`parallel/cpu/` `parallel/layout.option_axes` `config/paddlenlp_options` `checkpoint/verified_reads` "
            "`parallel/optimizers.ParallelOptimizer` `docs/zh/` `tests/unit`")
    assert stale_module_names(text) == ["checkpoint/verified_reads", "parallel/optimizers.ParallelOptimizer"]
