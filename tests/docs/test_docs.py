"""The documentation: the site builds in strict mode, every public name is in the API reference, every block
marked runnable runs, each Chinese page keeps its English twin's headings and, section by section, its code
blocks, option names, figures and links, the Chinese pages keep to the glossary, and the README stays a front
door (docs/contributing.md describes the conventions these tests hold the pages to)."""
from __future__ import annotations

import html
import importlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
RUNNABLE = "<!-- runnable -->"
FENCE = re.compile(r"^(?P<fence>`{3,})(?P<info>[^`]*)$")
HEADING = re.compile(r"^(?P<hashes>#{1,6})\s")
LAUNCH_LOCK = "/tmp/paddletrainer-mp.lock"  # the machine-wide lock tests/distributed/launcher.py takes
README_MAX_LINES = 150
# The pages that must have a Chinese twin (docs/zh/<name>), besides README.md <-> README_cn.md: the user guide.
ZH_REQUIRED = ("index.md", "getting-started.md", "layouts.md", "migration.md", "checkpoints.md", "mixed-precision.md",
               "fault-tolerance.md", "logging.md", "troubleshooting.md")
INLINE_CODE = re.compile(r"(`+)(.+?)\1", re.S)
# An option name inside inline code: a command-line flag or a snake_case name (`--sharding`, `save_steps`).
OPTION = re.compile(r"--[a-z][\w-]*|\b[a-z][a-z0-9]*(?:_[a-z0-9]+)+\b")
FIGURE = re.compile(r"\d+(?:\.\d+)*")
LINK = re.compile(r"\]\(([^)\s]+)\)")
HEADING_ID = re.compile(r"\{#[^}]*\}\s*$")
# Modules PaddleNLP scripts import by path; with no __all__, the public names are listed here (the test below
# checks the module defines no other public class or function).
PUBLIC_MODULES = ("trainer", "training_args", "trainer_callback", "trainer_utils", "argparser", "integrations",
                  "trl")
PUBLIC_WITHOUT_ALL = {"trainer": ("Trainer", "DEFAULT_CALLBACKS")}


# ------------------------------------------------------------------------------------------------ parsing
def parse_markdown(text: str):
    """``(headings, blocks)`` of a markdown text: heading levels outside code, and each fenced block as
    ``(language, code, runnable, line)``; a fence closes only on a fence of at least its own length, so a
    ````-block may show ```-blocks."""
    headings, blocks = [], []
    lines = text.split("\n")
    open_fence = None
    for number, line in enumerate(lines, 1):
        fence = FENCE.match(line.strip())
        if open_fence is not None:
            if fence and not fence["info"].strip() and len(fence["fence"]) >= len(open_fence[0]):
                marks, info, start, runnable = open_fence
                blocks.append((info, "\n".join(lines[start:number - 1]), runnable, start))
                open_fence = None
            continue
        if fence:
            runnable = number >= 2 and lines[number - 2].strip() == RUNNABLE
            open_fence = (fence["fence"], fence["info"].strip().split(" ")[0], number, runnable)
        elif HEADING.match(line):
            headings.append(len(HEADING.match(line)["hashes"]))
    assert open_fence is None, f"an unclosed code fence opened at line {open_fence[2]}"
    return headings, blocks


def test_parse_markdown_reads_headings_blocks_and_markers():
    text = "# A\n\n<!-- runnable -->\n```bash\necho hi\n```\n````md\n```py\n# not a heading\n```\n````\n## B\n"
    headings, blocks = parse_markdown(text)
    assert headings == [1, 2]
    assert [(lang, code, run) for lang, code, run, _ in blocks] == [
        ("bash", "echo hi", True), ("md", "```py\n# not a heading\n```", False)]


# ------------------------------------------------------------------------------------------------ README
def test_readme_is_a_front_door_of_at_most_150_lines():
    for name in ("README.md", "README_cn.md"):
        count = len((REPO / name).read_text(encoding="utf-8").splitlines())
        assert count <= README_MAX_LINES, f"{name} has {count} lines; move detail into a guide page"


GPU_INSTALL = re.compile(r"pip install\b.*\bpaddlepaddle-gpu==\S+")
PADDLE_GPU_INDEX = re.compile(r" -i https://www\.paddlepaddle\.org\.cn/packages/stable/cu\d+/")
FIRST_SCREEN = 12  # lines of a README a reader sees before scrolling


def test_every_gpu_install_command_takes_paddles_own_index():
    """Paddle 3.x GPU wheels are only on Paddle's index: a bare `pip install paddlepaddle-gpu==3.x` fails."""
    from paddletrainer.runtime.paddle_requirement import install_hint

    commands = [("install_hint()", install_hint())]
    for page in [REPO / "README.md", REPO / "README_cn.md", *sorted(DOCS.rglob("*.md"))]:
        for _, code, _, line in parse_markdown(page.read_text(encoding="utf-8"))[1]:
            commands += [(f"{page.relative_to(REPO)}:{line}", c) for c in code.splitlines() if GPU_INSTALL.search(c)]
    assert len(commands) > 1
    bare = [f"{where}: {command}" for where, command in commands if not PADDLE_GPU_INDEX.search(command)]
    assert not bare, "GPU installs without Paddle's index (-i .../packages/stable/cuXXX/):\n" + "\n".join(bare)


def test_the_python_requirement_is_on_the_readmes_first_screen_and_in_the_setup_script():
    declared = re.search(r'requires-python = ">=(\d+\.\d+)"', (REPO / "pyproject.toml").read_text())[1]
    for name in ("README.md", "README_cn.md"):
        first_screen = "\n".join((REPO / name).read_text(encoding="utf-8").splitlines()[:FIRST_SCREEN])
        assert f"Python {declared}" in first_screen, f"{name} does not state Python {declared} on its first screen"
    major, minor = declared.split(".")
    assert f"sys.version_info < ({major}, {minor})" in (REPO / "scripts" / "setup_env.sh").read_text()


# ------------------------------------------------------------------------------------------------ twins
def twin_pairs():
    pairs = [(REPO / "README.md", REPO / "README_cn.md")]
    pairs += [(DOCS / zh.name, zh) for zh in sorted((DOCS / "zh").glob("*.md"))]
    return pairs


def sections(text: str):
    """The page cut at its headings (outside code): one list of prose lines and one of code blocks per section,
    the part before the first heading included."""
    out = [{"heading": "(top)", "prose": [], "blocks": []}]
    lines = text.split("\n")
    open_fence = None
    for number, line in enumerate(lines, 1):
        fence = FENCE.match(line.strip())
        if open_fence is not None:
            if fence and not fence["info"].strip() and len(fence["fence"]) >= len(open_fence[0]):
                out[-1]["blocks"].append((open_fence[1], "\n".join(lines[open_fence[2]:number - 1]), open_fence[3]))
                open_fence = None
            continue
        if fence:
            runnable = number >= 2 and lines[number - 2].strip() == RUNNABLE
            open_fence = (fence["fence"], fence["info"].strip().split(" ")[0], number, runnable)
        elif HEADING.match(line):
            out.append({"heading": line.strip(), "prose": [], "blocks": []})
        else:
            out[-1]["prose"].append(line)
    return out


def page_key(page: Path, target: str) -> str:
    """A link target as the page and anchor it names, the same for both languages: a link to a Chinese twin
    counts as one to its English page (``docs/zh/x.md`` is ``docs/x.md``, ``README_cn.md`` is ``README.md``)."""
    if re.match(r"[a-z]+://", target):
        return target
    path, _, anchor = target.partition("#")
    resolved = Path(os.path.normpath(page.parent / path)) if path else page
    name = str(resolved.relative_to(REPO)) if resolved.is_relative_to(REPO) else str(resolved)
    name = re.sub(r"(^|/)zh/", r"\1", name).replace("README_cn.md", "README.md")
    return f"{name}#{anchor}" if anchor else name


def section_facts(page: Path, section) -> dict:
    """What a twin must keep in a section: option names (in inline code), figures and link targets."""
    prose = "\n".join(HEADING_ID.sub("", line) for line in section["prose"] + [section["heading"]])
    own = page_key(page, "")
    links = {page_key(page, t) for t in LINK.findall(prose)} - {own}
    text = re.sub(r"(?<=\d),(?=\d{3}\b)", "", LINK.sub("]", prose))  # 13,810 is 13810; no digits of link targets
    options = {name for _, span in INLINE_CODE.findall(text) for name in OPTION.findall(span)}
    return {"option names": options, "figures": set(FIGURE.findall(text)), "links": links}


def twin_differences(english: Path, chinese: Path):
    """One line per difference between the twins, section by section (empty when they agree)."""
    en_sections = sections(english.read_text(encoding="utf-8"))
    zh_sections = sections(chinese.read_text(encoding="utf-8"))
    en_levels = [len(HEADING.match(s["heading"])["hashes"]) for s in en_sections[1:]]
    zh_levels = [len(HEADING.match(s["heading"])["hashes"]) for s in zh_sections[1:]]
    if en_levels != zh_levels:
        return [f"heading levels differ: {english.name} {en_levels} vs {chinese.name} {zh_levels}"]
    problems = []
    for en, zh in zip(en_sections, zh_sections):
        where = f"section {en['heading']!r} / {zh['heading']!r}"
        if en["blocks"] != zh["blocks"]:
            problems.append(f"{where}: code blocks differ (language, text, runnable marker)")
        en_facts, zh_facts = section_facts(english, en), section_facts(chinese, zh)
        for kind in en_facts:
            only_en, only_zh = en_facts[kind] - zh_facts[kind], zh_facts[kind] - en_facts[kind]
            if only_en or only_zh:
                problems.append(f"{where}: {kind} only in English {sorted(only_en)}, only in Chinese {sorted(only_zh)}")
    return problems


def test_twin_differences_name_the_section_and_what_drifted(tmp_path):
    (tmp_path / "zh").mkdir()
    english, chinese = tmp_path / "a.md", tmp_path / "zh" / "a.md"
    english.write_text("# A\n\nSee [b](b.md#x).\n\n## Stage 3\n\n`--sharding stage3` cuts 2**20 elements.\n")
    chinese.write_text("# A\n\n[English](../a.md)，见 [b](b.md#x)。\n\n## stage 3\n\n`--sharding stage3` 切分。\n")
    assert twin_differences(english, chinese) == [
        "section '## Stage 3' / '## stage 3': figures only in English ['2', '20'], only in Chinese []"]
    chinese.write_text("# A\n\n见 [b](../c.md)。\n\n## stage 3\n\n`sharding_parallel_degree` 2**20。\n")
    assert [line.replace(f"{tmp_path}/", "") for line in twin_differences(english, chinese)] == [
        "section '# A' / '# A': links only in English ['b.md#x'], only in Chinese ['c.md']",
        "section '## Stage 3' / '## stage 3': option names only in English ['--sharding'], "
        "only in Chinese ['sharding_parallel_degree']"]


def test_the_required_chinese_pages_exist():
    assert (REPO / "README_cn.md").is_file()
    missing = [name for name in ZH_REQUIRED if not (DOCS / "zh" / name).is_file()]
    assert not missing, f"docs/zh/ lacks {missing}"


@pytest.mark.parametrize("english,chinese", twin_pairs(), ids=lambda p: str(Path(p).relative_to(REPO)))
def test_a_chinese_twin_keeps_each_sections_code_options_figures_and_links(english, chinese):
    assert english.is_file(), f"{chinese.relative_to(REPO)} has no English page {english.relative_to(REPO)}"
    problems = twin_differences(english, chinese)
    assert not problems, f"{chinese.relative_to(REPO)} drifted from {english.relative_to(REPO)}:\n" + "\n".join(problems)


def glossary():
    """``{Chinese term: [variants the pages must not use]}`` from the glossary table of docs/zh/index.md."""
    index = next(s for s in sections((DOCS / "zh" / "index.md").read_text(encoding="utf-8"))
                 if "{#chinese-terms}" in s["heading"])
    rows = [line.strip("|").split("|") for line in index["prose"] if line.startswith("|") and "---" not in line]
    terms = {cells[1].strip(): [v.strip() for v in cells[2].split("、") if v.strip()] for cells in rows[1:]}
    assert len(terms) >= 20, "the glossary table of docs/zh/index.md was not found"
    return terms


def test_the_chinese_pages_use_the_glossarys_terms_not_their_variants():
    terms = glossary()
    assert "通信组" in terms and "进程组" in terms["通信组"]
    found = []
    for page in [REPO / "README_cn.md", *sorted((DOCS / "zh").glob("*.md"))]:
        text = page.read_text(encoding="utf-8")
        if page.name == "index.md":  # the table itself names the variants
            text = text.split("{#chinese-terms}")[0]
        for term, variants in terms.items():
            found += [f"{page.relative_to(REPO)}: {variant!r} (write {term!r})" for variant in variants if variant in text]
    assert not found, "\n".join(found)


# ------------------------------------------------------------------------------------------------ the site
@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The site built by ``mkdocs build --strict`` (the docs extra); its output must hold no warning."""
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(REPO / "mkdocs.yml"),
                           "-d", str(out)], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"mkdocs build --strict failed (pip install -e '.[docs]'):\n{log[-6000:]}"
    assert "WARNING" not in log, log[-6000:]
    return out


def test_the_site_builds_every_page_of_the_nav(site):
    pages = sorted(p.relative_to(DOCS).with_suffix("") for p in DOCS.rglob("*.md"))
    for page in pages:
        target = site / (page.parent / "index.html" if page.name == "index" else page / "index.html")
        assert target.is_file(), f"docs/{page}.md was not built"


def resolve(dotted: str):
    """The object a dotted path names: the longest importable module prefix, then attributes."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(dotted)


def public_names():
    """``(path, object)`` for every public name: ``paddletrainer.__all__`` and the public modules' names."""
    import paddletrainer

    names = [(f"paddletrainer.{n}", getattr(paddletrainer, n)) for n in paddletrainer.__all__]
    for module_name in PUBLIC_MODULES:
        module = importlib.import_module(f"paddletrainer.{module_name}")
        listed = getattr(module, "__all__", None) or PUBLIC_WITHOUT_ALL[module_name]
        names += [(f"{module.__name__}.{n}", getattr(module, n)) for n in listed if not n.startswith("_")]
    return names


def test_modules_without_all_define_no_unlisted_public_class_or_function():
    for module_name, listed in PUBLIC_WITHOUT_ALL.items():
        module = importlib.import_module(f"paddletrainer.{module_name}")
        defined = {n for n, v in vars(module).items() if not n.startswith("_") and callable(v)
                   and getattr(v, "__module__", None) == module.__name__}
        assert defined <= set(listed), f"add {sorted(defined - set(listed))} to PUBLIC_WITHOUT_ALL and the API page"


def test_every_public_name_is_in_the_api_reference(site):
    page = (site / "api" / "index.html").read_text(encoding="utf-8")
    anchors = {html.unescape(a) for a in re.findall(r'id="(paddletrainer[^"]*)"', page) if "--" not in a}
    by_name = {}
    for anchor in anchors:
        by_name.setdefault(anchor.rsplit(".", 1)[-1], []).append(anchor)
    missing = []
    for path, obj in public_names():
        if path in anchors:
            continue
        if not any(resolve(a) is obj for a in by_name.get(path.rsplit(".", 1)[-1], [])):
            missing.append(path)
    assert not missing, f"not in docs/api.md: {missing}"


# ------------------------------------------------------------------------------------------------ runnable
def runnable_blocks():
    """Each distinct runnable block of README.md and the English pages, once."""
    seen, params = set(), []
    for page in [REPO / "README.md", *sorted(DOCS.glob("*.md"))]:
        for lang, code, runnable, line in parse_markdown(page.read_text(encoding="utf-8"))[1]:
            if not runnable or (lang, code) in seen:
                continue
            seen.add((lang, code))
            marks = [pytest.mark.launch] if "paddle.distributed.launch" in code else []
            params.append(pytest.param(lang, code, id=f"{page.relative_to(REPO)}:{line}", marks=marks))
    return params


@pytest.mark.parametrize("lang,code", runnable_blocks())
def test_a_runnable_block_runs(lang, code, tmp_path):
    assert lang in ("python", "bash"), f"runnable blocks are python or bash, not {lang!r}"
    for name in ("llm_examples", "scripts"):
        (tmp_path / name).symlink_to(REPO / name)
    bin_dir = tmp_path / ".bin"
    bin_dir.mkdir()
    (bin_dir / "python").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    (bin_dir / "python").chmod(0o755)
    script = tmp_path / (".block.py" if lang == "python" else ".block.sh")
    script.write_text(code + "\n", encoding="utf-8")
    command = [sys.executable, str(script)] if lang == "python" else ["bash", "-e", str(script)]
    if "paddle.distributed.launch" in code:
        command = ["flock", LAUNCH_LOCK] + command
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
           "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
