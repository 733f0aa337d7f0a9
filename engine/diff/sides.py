"""Loading both sides of a diff: a spec file, or a spec as it was at a git revision (with every
file it extends or includes, at that same revision), validated and planned for every mode."""

from __future__ import annotations

import functools
import posixpath
import subprocess
from pathlib import Path
from typing import Sequence

import yaml

from engine.diff.model import FIXED_BUILTINS, DiffError, Side
from engine.spec.load import load_spec
from engine.spec.located import SpecErrors
from engine.spec.plan import build_plan, mode_names
from engine.spec.validate import validate
from engine.spec.values import UsageError


def _git(args: Sequence[str], cwd: Path, data: bytes | None = None) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(["git", *args], cwd=cwd, input=data, capture_output=True)
    except FileNotFoundError:
        raise DiffError("--base needs git, and no `git` is on PATH") from None


def repo_root(start: Path) -> Path:
    """Top of the git work tree containing `start` (a directory)."""
    proc = _git(["rev-parse", "--show-toplevel"], start)
    if proc.returncode != 0:
        raise DiffError(
            f"{start}: not inside a git work tree (--base needs one): {proc.stderr.decode(errors='replace').strip()}"
        )
    return Path(proc.stdout.decode().strip()).resolve()


_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml when the wheel has it


@functools.lru_cache(maxsize=256)
def references(text: bytes) -> tuple[str, ...]:
    """The paths a spec file extends/includes, as written; () when it does not parse (load_spec says
    why). Read from the composed nodes of its top mapping: nothing else of the file is built."""
    try:
        node = yaml.compose(text, Loader=_LOADER)
    except (yaml.YAMLError, ValueError, RecursionError):
        return ()
    if not isinstance(node, yaml.MappingNode):
        return ()
    refs: list[str] = []
    for key, value in node.value:
        if not _is_str(key):
            continue
        if key.value == "extends" and _is_str(value):
            refs.append(value.value)
        elif key.value == "include" and isinstance(value, yaml.SequenceNode):
            refs += [item.value for item in value.value if _is_str(item)]
    return tuple(refs)


def _is_str(node: yaml.Node) -> bool:
    return isinstance(node, yaml.ScalarNode) and node.tag == "tag:yaml.org,2002:str"


class Revision:
    """One git revision of one repository; its files are read with `git cat-file --batch`, each once."""

    def __init__(self, root: Path, rev: str):
        self.root, self.rev = root, rev
        proc = _git(["rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"], root)
        if proc.returncode != 0:
            raise DiffError(f"--base {rev}: not a revision of the repository at {root}")
        self.commit = proc.stdout.decode().strip()
        self._blobs: dict[str, bytes | None] = {}

    def read(self, paths: Sequence[str]) -> dict[str, bytes]:
        """path -> its bytes at this revision, for those of `paths` that exist there."""
        wanted = [p for p in dict.fromkeys(paths) if p not in self._blobs]
        if wanted:
            proc = _git(
                ["cat-file", "--batch"], self.root, data="".join(f"{self.commit}:{p}\n" for p in wanted).encode()
            )
            out, at = proc.stdout, 0
            for p in wanted:
                end = out.index(b"\n", at)
                header = out[at:end].split()
                at = end + 1
                self._blobs[p] = None  # "<object> missing": not at this revision
                if len(header) == 3 and header[1] == b"blob":
                    size = int(header[2])
                    self._blobs[p] = out[at : at + size]
                    at += size + 1
        return {p: b for p in paths if (b := self._blobs.get(p)) is not None}

    def blob(self, path: str) -> bytes | None:
        return self.read([path]).get(path)

    def listing(self, *dirs: str) -> list[str]:
        """Every file under `dirs` at this revision (repo-relative)."""
        proc = _git(["ls-tree", "-r", "--name-only", self.commit, "--", *dirs], self.root)
        return proc.stdout.decode().splitlines()


def materialise(spec: Path, rev: str, dest: Path, revision: Revision | None = None) -> Path | None:
    """Write the spec as it was at `rev`, with every file it extends/includes AT THAT REVISION, under
    `dest` mirroring repo-relative paths; return the spec's path there, or None if it did not exist."""
    if revision is None:
        revision = Revision(repo_root(spec.parent if spec.parent.is_dir() else Path.cwd()), rev)
    root = revision.root
    try:
        rel = spec.resolve().relative_to(root).as_posix()
    except ValueError:
        raise DiffError(f"{spec}: not inside the git work tree {root}") from None
    queue, seen = [rel], set()
    while queue:
        path = queue.pop(0)
        if path in seen:
            continue
        seen.add(path)
        blob = revision.blob(path)
        if blob is None:
            if path == rel:
                return None
            continue  # load_spec reports the missing parent at the line that names it
        target = dest / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(blob)
        for ref in references(blob):
            joined = posixpath.normpath(posixpath.join(posixpath.dirname(path), ref))
            if not joined.startswith("../") and joined != "..":
                queue.append(joined)
    return dest / rel


def load_side(path: Path, label: str, tmp: Path | None = None, rev_prefix: str = "", root: Path | None = None) -> Side:
    """Load + validate + plan every mode; DiffError (exit 2) listing every problem when invalid. A
    side written out from a git revision under `tmp` names its files `rev_prefix` + path and reads only
    files under `tmp`; a working-tree side reads only files under `root` (its repository), when given."""
    side = Side(label, None, tmp=None if tmp is None else str(tmp), rev_prefix=rev_prefix)
    try:
        spec = load_spec(path, root=tmp if tmp is not None else root)
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
