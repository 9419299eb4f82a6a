"""The documentation: the site builds in strict mode, every public name is in the API reference, every block
marked runnable runs, each Chinese page keeps its English twin's headings and code blocks, and the README stays
a front door (docs/contributing.md describes the conventions these tests hold the pages to)."""
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
# The pages that must have a Chinese twin (docs/zh/<name>), besides README.md <-> README_cn.md.
ZH_REQUIRED = ("getting-started.md", "layouts.md", "migration.md")
# Modules PaddleNLP scripts import by path; with no __all__, the public names are listed here (the test below
# checks the module defines no other public class or function).
PUBLIC_MODULES = ("trainer", "training_args", "trainer_callback", "trainer_utils", "argparser", "integrations")
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


# ------------------------------------------------------------------------------------------------ twins
def twin_pairs():
    pairs = [(REPO / "README.md", REPO / "README_cn.md")]
    pairs += [(DOCS / zh.name, zh) for zh in sorted((DOCS / "zh").glob("*.md"))]
    return pairs


def test_the_required_chinese_pages_exist():
    assert (REPO / "README_cn.md").is_file()
    missing = [name for name in ZH_REQUIRED if not (DOCS / "zh" / name).is_file()]
    assert not missing, f"docs/zh/ lacks {missing}"


@pytest.mark.parametrize("english,chinese", twin_pairs(), ids=lambda p: str(Path(p).relative_to(REPO)))
def test_a_chinese_twin_has_the_english_headings_and_code_blocks(english, chinese):
    assert english.is_file(), f"{chinese.relative_to(REPO)} has no English page {english.relative_to(REPO)}"
    en_heads, en_blocks = parse_markdown(english.read_text(encoding="utf-8"))
    zh_heads, zh_blocks = parse_markdown(chinese.read_text(encoding="utf-8"))
    assert zh_heads == en_heads, f"heading levels differ: {english.name} {en_heads} vs {chinese.name} {zh_heads}"
    assert [b[:3] for b in zh_blocks] == [b[:3] for b in en_blocks], "code blocks differ (language, text, marker)"


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
        target = site / ("index.html" if str(page) == "index" else f"{page}/index.html")
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
