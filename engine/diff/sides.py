"""Loading both sides of a diff: a spec file, or a spec as it was at a git revision (with every
file it extends or includes, at that same revision), validated and planned for every mode."""
from __future__ import annotations

import posixpath
import subprocess
from pathlib import Path
from typing import Sequence

import yaml

from engine.diff.model import FIXED_BUILTINS, DiffError, Side
from engine.plan import build_plan, mode_names
from engine.spec import SpecErrors, load_spec
from engine.validate import validate
from engine.values import UsageError


def _git(args: Sequence[str], cwd: Path) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(["git", *args], cwd=cwd, capture_output=True)
    except FileNotFoundError:
        raise DiffError("--base needs git, and no `git` is on PATH") from None


def repo_root(start: Path) -> Path:
    """Top of the git work tree containing `start` (a directory)."""
    proc = _git(["rev-parse", "--show-toplevel"], start)
    if proc.returncode != 0:
        raise DiffError(f"{start}: not inside a git work tree (--base needs one): "
                        f"{proc.stderr.decode(errors='replace').strip()}")
    return Path(proc.stdout.decode().strip()).resolve()


_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml when the wheel has it


def references(text: bytes) -> list[str]:
    """The paths a spec file extends/includes, as written; [] when it does not parse (load_spec says why)."""
    try:
        doc = yaml.load(text, Loader=_LOADER)  # noqa: S506 - a safe loader
    except yaml.YAMLError:
        return []
    if not isinstance(doc, dict):
        return []
    refs = [doc["extends"]] if isinstance(doc.get("extends"), str) else []
    refs += [i for i in doc.get("include") or [] if isinstance(i, str)] \
        if isinstance(doc.get("include"), list) else []
    return refs


def materialise(spec: Path, rev: str, dest: Path) -> Path | None:
    """Write the spec as it was at `rev`, with every file it extends/includes AT THAT REVISION, under
    `dest` mirroring repo-relative paths; return the spec's path there, or None if it did not exist."""
    start = spec.parent if spec.parent.is_dir() else Path.cwd()
    root = repo_root(start)
    try:
        rel = spec.resolve().relative_to(root).as_posix()
    except ValueError:
        raise DiffError(f"{spec}: not inside the git work tree {root}") from None
    proc = _git(["rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"], root)
    if proc.returncode != 0:
        raise DiffError(f"--base {rev}: not a revision of the repository at {root}")
    commit = proc.stdout.decode().strip()
    queue, seen = [rel], set()
    while queue:
        path = queue.pop(0)
        if path in seen:
            continue
        seen.add(path)
        blob = _git(["cat-file", "blob", f"{commit}:{path}"], root)
        if blob.returncode != 0:
            if path == rel:
                return None
            continue  # load_spec reports the missing parent at the line that names it
        target = dest / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(blob.stdout)
        for ref in references(blob.stdout):
            joined = posixpath.normpath(posixpath.join(posixpath.dirname(path), ref))
            if not joined.startswith("../") and joined != "..":
                queue.append(joined)
    return dest / rel


def load_side(path: Path, label: str, tmp: Path | None = None, rev_prefix: str = "") -> Side:
    """Load + validate + plan every mode; DiffError (exit 2) listing every problem when invalid. A
    side written out from a git revision under `tmp` names its files `rev_prefix` + path."""
    side = Side(label, None, tmp=None if tmp is None else str(tmp), rev_prefix=rev_prefix)
    try:
        spec = load_spec(path)
        errors = [str(e) for e in validate(spec, environ={})]
        if errors:
            raise DiffError("\n".join(errors))
        side.spec = spec
        for mode in mode_names(spec.data) or ["default"]:
            side.plans[mode] = build_plan(spec, mode=mode, environ={}, builtins=FIXED_BUILTINS)
        return side
    except SpecErrors as exc:
        raise DiffError(side.shown(f"{label}: invalid spec\n{exc}")) from None
    except UsageError as exc:
        raise DiffError(side.shown(f"{label}: {exc}")) from None
    except DiffError as exc:
        raise DiffError(side.shown(f"{label}: invalid spec\n{exc}")) from None
