"""The site's build hooks (mkdocs.yml `hooks:`), and the module map they put in docs/DESIGN.md.

The module map is read from the tree when the site builds: one row per module of engine/ and trainer/, its
docstring's first sentence, the folders in the order the data flows (a folder after every folder it imports).
So it cannot name a module that is gone or miss one that came. `python docs/hooks.py` prints it.

README.md is the site's home page: its links into docs/ are rewritten to the site's, so one front door
serves GitHub and the site alike."""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mkdocs.config.defaults import MkDocsConfig
    from mkdocs.structure.files import Files
    from mkdocs.structure.pages import Page

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("engine", "trainer", "probes")
MODULE_MAP_MARKER = "<!-- module map: generated from the tree by docs/hooks.py -->"


class MissingDocstring(ValueError):
    """A module the map would show with nothing to say: its first line is what the map reads."""


def summary(path: Path, root: Path = ROOT) -> str:
    """The first sentence of a module's docstring, on one line, as a Markdown table cell."""
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"), str(path)))
    if not doc or not doc.strip():
        raise MissingDocstring(f"{path.relative_to(root)} has no docstring: the module map shows its first sentence")
    paragraph = " ".join(doc.strip().split("\n\n")[0].split())
    sentence = re.split(r"(?<=[.!?])\s+(?=[A-Z`(])", paragraph, maxsplit=1)[0]
    sentence = re.sub(r":(?:class|func|meth|mod|attr):`([^`]+)`", r"`\1`", sentence)
    return sentence.replace("|", "\\|")


def folders(root: Path, package: str) -> dict[str, list[Path]]:
    """Each folder of a package (`engine`, `engine/run`, ...) -> its modules, `__init__.py` first."""
    found: dict[str, list[Path]] = {}
    for path in sorted((root / package).rglob("*.py"), key=lambda p: (p.name != "__init__.py", p.name)):
        found.setdefault(path.parent.relative_to(root).as_posix(), []).append(path)
    return dict(sorted(found.items()))


def imported_modules(path: Path, root: Path) -> set[str]:
    """Every module name `path` imports, at any depth of its code (a lazy import counts), relative ones resolved."""
    package = path.parent.relative_to(root).parts
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            anchor = package[: len(package) - node.level + 1] if node.level else ()
            base = ".".join([*anchor, *([node.module] if node.module else [])])
            names |= {base} | {f"{base}.{alias.name}" for alias in node.names}
    return names


def flow_order(root: Path, package: str) -> list[str]:
    """The package's folders, the package's own first, then each after every folder it imports (ties by
    name; a cycle, which the layering tests refuse, is broken by name rather than by hiding a folder)."""
    tree = folders(root, package)
    subs = [f for f in tree if f != package]
    deps: dict[str, set[str]] = {}
    for folder in subs:
        dotted = {imp.replace(".", "/") for path in tree[folder] for imp in imported_modules(path, root)}
        deps[folder] = {
            other for other in subs if other != folder and any(d == other or d.startswith(other + "/") for d in dotted)
        }
    ordered: list[str] = []
    while len(ordered) < len(subs):
        left = [f for f in subs if f not in ordered]
        ready = [f for f in left if deps[f] <= set(ordered)] or left
        ordered.append(min(ready))
    return [package, *ordered]


def module_map(root: Path = ROOT) -> str:
    """Markdown: per folder, a heading, its package's docstring and one row per module."""
    out: list[str] = []
    for package in (p for p in PACKAGES if (root / p).is_dir()):
        tree = folders(root, package)
        for folder in flow_order(root, package):
            paths = tree[folder]
            init = next((p for p in paths if p.name == "__init__.py"), None)
            out += [f"### `{folder}/`", ""]
            if init is not None and ast.get_docstring(ast.parse(init.read_text(encoding="utf-8"))):
                out += [summary(init, root), ""]
            out += ["| module | what it is |", "|---|---|"]
            out += [f"| `{p.name}` | {summary(p, root)} |" for p in paths if p != init]
            out.append("")
    return "\n".join(out)


CODE_SPAN = re.compile(r"(`+)(.+?)\1")


def unescape_table_pipes(markdown: str) -> str:
    """GitHub needs `\\|` for a pipe inside a code span in a table cell; Python-Markdown never splits a cell
    inside a code span and would show the backslash, so the site drops it there."""

    def row(line: str) -> str:
        if not line.lstrip().startswith("|"):
            return line
        return CODE_SPAN.sub(lambda m: m.group(0).replace("\\|", "|"), line)

    return "\n".join(row(line) for line in markdown.split("\n"))


def readme_for_site(markdown: str) -> str:
    """README.md's links into docs/ as the site's links (the README is the site's index, beside the pages)."""
    return markdown.replace("](docs/", "](")


def page_for_site(markdown: str) -> str:
    """A page's links to ../README.md as links to the site's index, which is the README."""
    return markdown.replace("](../README.md", "](index.md")


def on_files(files: Files, config: MkDocsConfig) -> Files:
    from mkdocs.structure.files import File

    readme = Path(config.config_file_path).parent / "README.md"
    files.append(File.generated(config, "index.md", content=readme.read_text(encoding="utf-8")))
    return files


def on_page_markdown(markdown: str, page: Page, config: MkDocsConfig, files: Files) -> str:
    markdown = readme_for_site(markdown) if page.file.src_uri == "index.md" else page_for_site(markdown)
    if MODULE_MAP_MARKER in markdown:
        markdown = markdown.replace(MODULE_MAP_MARKER, module_map(Path(config.config_file_path).parent))
    return unescape_table_pipes(markdown)


if __name__ == "__main__":
    sys.stdout.write(module_map())
