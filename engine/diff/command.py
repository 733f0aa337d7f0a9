"""`engine diff`'s command: load both sides as asked, compare, review a saved run, print."""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import TextIO

from engine.diff.compare import compare
from engine.diff.model import DiffError, Report, Side
from engine.diff.render import render
from engine.diff.saved_run import review_evidence
from engine.diff.sides import Revision, load_side, materialise, repo_root
from engine.run import evidence as evmod
from engine.show.report import write_file
from engine.spec.located import display_path
from engine.text import printable

# As `git diff --exit-code`; 2 is also `engine`'s usage code (verdict.Exit.USAGE).
EXIT_SAME, EXIT_CHANGED, EXIT_INVALID = 0, 1, 2


def diff_main(args: argparse.Namespace, stdout: TextIO | None = None, stderr: TextIO | None = None) -> int:
    """`engine diff` (the arguments of cli.py's `diff` command): print the diff; 0 no semantic
    change, 1 changed, 2 invalid spec or usage. `--markdown FILE` also writes it as Markdown to
    FILE; `--markdown -` prints the Markdown instead of the text."""
    stdout = stdout or sys.stdout
    stderr = stderr or sys.stderr
    try:
        report = build_report(args.old, args.new, args.base, args.evidence, args.mode)
    except DiffError as exc:
        print(printable(str(exc)), file=stderr, flush=True)
        return EXIT_INVALID
    stdout.write(render(report, markdown=args.markdown == "-"))
    stdout.flush()
    if args.markdown and args.markdown != "-":
        write_file(args.markdown, render(report, markdown=True))
    return EXIT_CHANGED if report.changed else EXIT_SAME


def build_report(
    old: str, new: str | None, base: str | None, evidence: str | None = None, mode: str | None = None
) -> Report:
    """Load both sides as asked, compare, and (with `evidence`) review the saved run."""
    if base is not None and new is not None:
        raise DiffError("engine diff: give either OLD NEW or SPEC --base REV, not both")
    if base is None and new is None:
        raise DiffError("engine diff: give OLD NEW, or SPEC --base REV")
    with tempfile.TemporaryDirectory(prefix="specprobe-diff-") as tmp:
        if base is not None:
            left, right = load_at_base(Path(old), base, Path(tmp))
        else:
            left = load_side(Path(old), _shown(Path(old)))
            right = load_side(Path(new), _shown(Path(new)))
        report = compare(left, right, mode)
        if evidence is not None:
            try:
                doc = evmod.load(evidence)
            except evmod.EvidenceError as exc:
                raise DiffError(str(exc)) from None
            report.evidence = review_evidence(report, left, right, _shown(Path(evidence)), doc)
    return report


def load_at_base(spec: Path, base: str, tmp: Path, revision: Revision | None = None) -> tuple[Side, Side]:
    """The spec at git revision `base` (written out under `tmp`) and in the working tree; a side
    where the file does not exist has no spec. DiffError when it exists on neither."""
    if revision is None:
        revision = Revision(repo_root(spec.parent if spec.parent.is_dir() else Path.cwd()), base)
    where = materialise(spec, base, tmp, revision)
    shown = _shown(spec)
    rel = _repo_rel(spec)
    # The working tree's side is a PR's files: it reads nothing outside the repository.
    right = load_side(spec, shown, root=revision.root) if spec.exists() else Side(f"{shown} (deleted)", None)
    if where is not None and right.spec is not None and _same_files(tmp, right, revision.root):
        # Every file the spec reads is byte for byte the base's: one load serves both sides.
        left = Side(f"{base}:{rel}", right.spec, right.plans, str(tmp), f"{base}:")
    else:
        left = Side(f"{base}:{rel}", None) if where is None else load_side(where, f"{base}:{rel}", tmp, f"{base}:")
    if left.spec is None and right.spec is None:
        raise DiffError(f"{spec}: exists neither at {base} nor in the working tree")
    return left, right


def _same_files(tmp: Path, right: Side, root: Path) -> bool:
    """Whether the files written out from the base (under `tmp`) are exactly those the working-tree
    spec was loaded from, same paths and same bytes."""
    written = sorted(p.relative_to(tmp).as_posix() for p in tmp.rglob("*") if p.is_file())
    read = sorted(
        Path(f).resolve().relative_to(root).as_posix()
        for f in right.spec.files
        if Path(f).resolve().is_relative_to(root)
    )
    if written != read or len(read) != len(right.spec.files):
        return False
    return all((tmp / p).read_bytes() == (root / p).read_bytes() for p in written)


def _shown(path: Path) -> str:
    return display_path(path)


def _repo_rel(spec: Path) -> str:
    try:
        root = repo_root(spec.parent if spec.parent.is_dir() else Path.cwd())
        return spec.resolve().relative_to(root).as_posix()
    except (DiffError, ValueError):
        return spec.as_posix()
