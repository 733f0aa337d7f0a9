"""`engine diff`'s command: load both sides as asked, compare, review a saved run, print."""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import TextIO

from engine import evidence as evmod
from engine.diff.compare import compare
from engine.diff.model import DiffError, Report, Side
from engine.diff.render import render
from engine.diff.review import review_evidence
from engine.diff.sides import load_side, materialise, repo_root
from engine.report import write_file
from engine.spec import display_path

# As `git diff --exit-code`; 2 is also `engine`'s usage code (verdict.Exit.USAGE).
EXIT_SAME, EXIT_CHANGED, EXIT_INVALID = 0, 1, 2


def diff_main(args: argparse.Namespace, stdout: TextIO | None = None, stderr: TextIO | None = None
              ) -> int:
    """`engine diff` (the arguments of cli.py's `diff` command): print the diff; 0 no semantic
    change, 1 changed, 2 invalid spec or usage. `--markdown FILE` also writes it as Markdown to
    FILE; `--markdown -` prints the Markdown instead of the text."""
    stdout = stdout or sys.stdout
    stderr = stderr or sys.stderr
    try:
        report = build_report(args.old, args.new, args.base, args.evidence, args.mode)
    except DiffError as exc:
        print(str(exc), file=stderr, flush=True)
        return EXIT_INVALID
    stdout.write(render(report, markdown=args.markdown == "-"))
    stdout.flush()
    if args.markdown and args.markdown != "-":
        write_file(args.markdown, render(report, markdown=True))
    return EXIT_CHANGED if report.changed else EXIT_SAME


def build_report(old: str, new: str | None, base: str | None, evidence: str | None = None,
                 mode: str | None = None) -> Report:
    """Load both sides as asked, compare, and (with `evidence`) review the saved run."""
    if base is not None and new is not None:
        raise DiffError("engine diff: give either OLD NEW or SPEC --base REV, not both")
    if base is None and new is None:
        raise DiffError("engine diff: give OLD NEW, or SPEC --base REV")
    with tempfile.TemporaryDirectory(prefix="specprobe-diff-") as tmp:
        if base is not None:
            spec = Path(old)
            where = materialise(spec, base, Path(tmp))
            shown = _shown(spec)
            rel = _repo_rel(spec)
            left = Side(f"{base}:{rel}", None) if where is None else \
                load_side(where, f"{base}:{rel}", Path(tmp), f"{base}:")
            right = load_side(spec, shown) if spec.exists() else Side(f"{shown} (deleted)", None)
            if left.spec is None and right.spec is None:
                raise DiffError(f"{old}: exists neither at {base} nor in the working tree")
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


def _shown(path: Path) -> str:
    return display_path(path)


def _repo_rel(spec: Path) -> str:
    try:
        root = repo_root(spec.parent if spec.parent.is_dir() else Path.cwd())
        return spec.resolve().relative_to(root).as_posix()
    except (DiffError, ValueError):
        return spec.as_posix()
