"""The README and the reference site under docs/: every relative link and anchor resolves, every repository
path they name exists, the site builds with `mkdocs build --strict`, the module map is the tree's, the
custom-functions table is the engine's, and the README's commands are the ones CI runs."""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from engine.expr.functions import functions_markdown

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = sorted((ROOT / "docs").glob("*.md"))
DOCUMENTS = [README, *PAGES]

_spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "docs" / "hooks.py")
assert _spec is not None and _spec.loader is not None
hooks = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(hooks)

FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.S | re.M)
CODE_SPAN = re.compile(r"(`+)(.+?)\1", re.S)
LINK = re.compile(r"!?\[(?:[^\]\n]|\][^(\n])*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.M)


def rel(path: Path) -> str:
    """A path as the repository names it (a path elsewhere, a test's tmp_path, as it is)."""
    try:
        return path.relative_to(ROOT).as_posix()
    except ValueError:
        return path.as_posix()


def prose(text: str) -> str:
    """The text outside fenced code blocks, line numbers kept (a block becomes as many empty lines)."""
    return FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)


def github_anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation but `-` and `_` dropped, each space a `-`."""
    text = CODE_SPAN.sub(lambda m: m.group(2), heading)
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors_of(path: Path) -> set[str]:
    found: set[str] = set()
    seen: dict[str, int] = {}
    for heading in HEADING.findall(prose(path.read_text(encoding="utf-8"))):
        slug = github_anchor(heading)
        found.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
        seen[slug] = seen.get(slug, 0) + 1
    return found


def links_of(path: Path) -> list[tuple[int, str]]:
    """(line, target) of every Markdown link and image outside code."""
    text = prose(path.read_text(encoding="utf-8"))
    text = CODE_SPAN.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), text)
    return [(text.count("\n", 0, m.start()) + 1, m.group(1)) for m in LINK.finditer(text)]


def broken_links(path: Path) -> list[str]:
    problems = []
    for line, target in links_of(path):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto: ... are not the repository's
            continue
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        where = f"{rel(path)}:{line}: {target}"
        if not dest.exists():
            problems.append(f"{where}: no file {file_part}")
        elif anchor and dest.suffix == ".md" and anchor not in anchors_of(dest):
            problems.append(f"{where}: {rel(dest)} has no heading with the anchor #{anchor}")
    return problems


@pytest.mark.parametrize("path", DOCUMENTS, ids=rel)
def test_every_relative_link_and_anchor_resolves(path: Path) -> None:
    assert broken_links(path) == []


def test_a_broken_link_and_a_missing_anchor_are_both_found(tmp_path: Path) -> None:
    (tmp_path / "b.md").write_text("# Title\n\n## Exit codes\n", encoding="utf-8")
    page = tmp_path / "a.md"
    page.write_text(
        "[ok](b.md#exit-codes) [gone](c.md) [anchor](b.md#exit-code) [self](#here)\n\n## Here\n\n"
        "`[not a link](nowhere.md)`\n\n```\n[nor this](nowhere.md)\n```\n",
        encoding="utf-8",
    )
    assert [p.replace(f"{tmp_path}/", "") for p in broken_links(page)] == [
        "a.md:1: c.md: no file c.md",
        "a.md:1: b.md#exit-code: b.md has no heading with the anchor #exit-code",
    ]


def test_github_anchors_drop_punctuation_and_code_marks() -> None:
    assert github_anchor("Adding a check (and trying it on yesterday's run)") == (
        "adding-a-check-and-trying-it-on-yesterdays-run"
    )
    assert github_anchor("`engine review`: every spec of a change") == "engine-review-every-spec-of-a-change"
    assert github_anchor("Write your own probe: two stops") == "write-your-own-probe-two-stops"


REPO_PATH = re.compile(r"^(?:engine|trainer|specs|tests|bench|evidence|docs|constraints|\.ci|\.github)/[\w./-]*$")


def named_paths(path: Path) -> list[tuple[int, str]]:
    """(line, path) of every code span in the prose that is a path in the repository, as `engine/limits.py`."""
    text = prose(path.read_text(encoding="utf-8"))
    found = []
    for m in CODE_SPAN.finditer(text):
        for word in m.group(2).split():
            word = word.strip("(),;:")
            if REPO_PATH.match(word) and not word.endswith("..."):
                found.append((text.count("\n", 0, m.start()) + 1, word))
    return found


def missing_paths(path: Path) -> list[str]:
    return [f"{rel(path)}:{line}: {name}" for line, name in named_paths(path) if not (ROOT / name).exists()]


@pytest.mark.parametrize("path", DOCUMENTS, ids=rel)
def test_every_repository_path_the_docs_name_exists(path: Path) -> None:
    assert missing_paths(path) == []


def test_a_named_module_that_is_gone_is_found(tmp_path: Path) -> None:
    page = tmp_path / "p.md"
    page.write_text(
        "The tracer is `engine/expr/trace.py`; the phrases were in `engine/diff/text.py`.\n\n"
        "`ckpt/checkpoint-<step>` and `evidence/<spec stem>/` are patterns, `engine run` a command.\n",
        encoding="utf-8",
    )
    assert [m.replace(f"{tmp_path}/", "") for m in missing_paths(page)] == ["p.md:1: engine/diff/text.py"]


def test_the_site_builds_strict_with_the_readme_as_its_home(tmp_path: Path) -> None:
    site = tmp_path / "site"
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    ran = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert ran.returncode == 0, ran.stdout + ran.stderr
    home = (site / "index.html").read_text(encoding="utf-8")
    assert 'href="running/#exit-codes"' in home  # README's docs/running.md#exit-codes, as the site's link
    design = (site / "DESIGN" / "index.html").read_text(encoding="utf-8")
    assert "<code>engine/expr/</code>" in design and "<code>trace.py</code>" in design
    assert hooks.MODULE_MAP_MARKER not in design
    for page in PAGES:
        built = site / ("" if page.stem == "index" else page.stem) / "index.html"
        assert built.exists(), f"{rel(page)} has no page in the site"


def modules_in_tree() -> set[str]:
    return {rel(p) for package in hooks.PACKAGES for p in (ROOT / package).rglob("*.py") if p.name != "__init__.py"}


def modules_in_map(markdown: str) -> set[str]:
    """`engine/expr/trace.py` for a row `trace.py` under the heading `engine/expr/`."""
    found, folder = set(), ""
    for line in markdown.splitlines():
        if heading := re.match(r"^### `([^`]+)/`$", line):
            folder = heading.group(1)
        elif row := re.match(r"^\| `([^`/]+\.py)` \|", line):
            found.add(f"{folder}/{row.group(1)}")
    return found


def test_module_map_has_a_row_for_every_module_and_no_other() -> None:
    assert modules_in_map(hooks.module_map(ROOT)) == modules_in_tree()
    assert hooks.MODULE_MAP_MARKER in (ROOT / "docs" / "DESIGN.md").read_text(encoding="utf-8")


def test_module_map_rows_are_the_docstrings_first_sentence(tmp_path: Path) -> None:
    pkg = tmp_path / "engine"
    pkg.mkdir()
    (pkg / "__init__.py").write_text('"""The package. More about it."""\n', encoding="utf-8")
    (pkg / "a.py").write_text('"""Does a | b: one thing. Then the details.\n\nAnd more."""\n', encoding="utf-8")
    assert hooks.module_map(tmp_path).splitlines()[:6] == [
        "### `engine/`",
        "",
        "The package.",
        "",
        "| module | what it is |",
        "|---|---|",
    ]
    assert "| `a.py` | Does a \\| b: one thing. |" in hooks.module_map(tmp_path)


def test_module_map_refuses_a_module_without_a_docstring(tmp_path: Path) -> None:
    (tmp_path / "engine").mkdir()
    (tmp_path / "engine" / "quiet.py").write_text("X = 1\n", encoding="utf-8")
    with pytest.raises(hooks.MissingDocstring, match=r"engine/quiet\.py has no docstring"):
        hooks.module_map(tmp_path)


def test_module_map_puts_each_folder_after_the_folders_it_imports(tmp_path: Path) -> None:
    for folder, source in {
        "engine": "",
        "engine/a_top": "from engine.m_mid import x\n",  # first by name, last by the flow
        "engine/m_mid": "from ..z_base import y\n",  # a relative import counts too
        "engine/z_base": "",
    }.items():
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "mod.py").write_text(f'"""A module."""\n{source}', encoding="utf-8")
    assert hooks.flow_order(tmp_path, "engine") == ["engine", "engine/z_base", "engine/m_mid", "engine/a_top"]


def test_the_engines_folders_come_in_stage_order() -> None:
    order = hooks.flow_order(ROOT, "engine")
    assert order[:4] == ["engine", "engine/expr", "engine/spec", "engine/run"]
    assert order.index("engine/judge") < order.index("engine/diff")


def test_the_site_shows_a_pipe_in_a_table_code_span_without_its_escape() -> None:
    text = "| `a\\|b` | x \\| y |\n`c\\|d` outside a table\n"
    assert hooks.unescape_table_pipes(text) == "| `a|b` | x \\| y |\n`c\\|d` outside a table\n"
    assert hooks.readme_for_site("[Limits](docs/limits.md#x)") == "[Limits](limits.md#x)"
    assert hooks.page_for_site("[the README](../README.md#y)") == "[the README](index.md#y)"


FUNCTIONS = re.compile(r"(<!-- functions: [^>]*-->\n\n)(.*?)(\n<!-- end of functions -->)", re.S)


def test_the_spec_reference_lists_the_engines_custom_functions() -> None:
    """docs/specs.md's table is functions_markdown()'s output (SPECPROBE_UPDATE_GOLDEN=1 writes it there)."""
    page = ROOT / "docs" / "specs.md"
    text = page.read_text(encoding="utf-8")
    found = FUNCTIONS.search(text)
    assert found is not None, "docs/specs.md lost its functions markers"
    if os.environ.get("SPECPROBE_UPDATE_GOLDEN"):
        text = text[: found.start(2)] + functions_markdown() + text[found.end(2) :]
        page.write_text(text, encoding="utf-8")
        found = FUNCTIONS.search(text)
        assert found is not None
    assert found.group(2) == functions_markdown()


def bash_blocks(text: str) -> list[str]:
    return re.findall(r"^```bash\n(.*?)^```", text, re.S | re.M)


def test_the_readme_is_a_front_door_whose_second_command_is_what_ci_runs() -> None:
    readme = README.read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 300
    first, second = (block.strip() for block in bash_blocks(readme)[:2])
    assert shlex.split(first)[-3:] == ["engine", "run", "specs/p4_smoke.yaml"]
    assert "'.[trainer]'" in first
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    assert second in ci, "the README's second command is not a line of .ci/run"
    assert ".ci/wheel" in ci
