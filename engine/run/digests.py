"""Digests of what a step's outcome depends on beyond its definition, and of the folders it leaves:
a folder's code (its git tree plus its uncommitted changes), package versions, files, and a
folder tree's bytes.

A reference run (engine/run/reference.py) is reused while these are unchanged, and a snapshot
(engine/run/snapshot.py) is restored only while its bytes are those it was taken with; `changes`
words the difference between two sets of digests, one line per input, for the console.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import stat
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

GIT_TIMEOUT_S = 30.0
# What a folder of code holds that is not its code: bytecode caches change with the interpreter.
CODE_NOISE = ("__pycache__", ".git", ".pytest_cache", ".mypy_cache", ".ruff_cache")
CODE_NOISE_BYTES = {os.fsencode(name) for name in CODE_NOISE}
_CHUNK = 1 << 20


def run_git(args: Sequence[str], cwd: str | os.PathLike[str]) -> str | None:
    """`git ARGS` in `cwd`: its output, or None when git is missing, fails or takes too long."""
    try:
        # No fsmonitor hook and no external diff or textconv: a repository's config must not run a
        # program because a spec was re-checked or a reference looked up.
        proc = subprocess.run(
            ["git", "-c", "core.fsmonitor=false", *args],
            cwd=cwd,
            capture_output=True,
            timeout=GIT_TIMEOUT_S,
        )
    except (OSError, subprocess.SubprocessError, ValueError):
        return None
    return proc.stdout.decode("utf-8", errors="replace") if proc.returncode == 0 else None


def _git_bytes(args: Sequence[str], cwd: str | os.PathLike[str]) -> bytes | None:
    try:
        proc = subprocess.run(
            ["git", "-c", "core.fsmonitor=false", *args], cwd=cwd, capture_output=True, timeout=GIT_TIMEOUT_S
        )
    except (OSError, subprocess.SubprocessError, ValueError):
        return None
    return proc.stdout if proc.returncode == 0 else None


def file_sha256(path: str | os.PathLike[str]) -> str:
    """sha256 of a regular file's bytes (a symlink is not followed); OSError when it cannot be read."""
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(os.fspath(path), flags)
    digest = hashlib.sha256()
    try:
        while chunk := os.read(fd, _CHUNK):
            digest.update(chunk)
    finally:
        os.close(fd)
    return digest.hexdigest()


def _entries(root: Path, skip: Iterable[str]) -> list[tuple[str, os.stat_result]]:
    """(path relative to root, lstat) of everything under `root`, sorted, never following a symlink;
    a directory named in `skip` is left out with what it holds."""
    skipped = set(skip)
    found: list[tuple[str, os.stat_result]] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in skipped)
        for name in dirnames + sorted(filenames):
            path = os.path.join(dirpath, name)
            found.append((os.path.relpath(path, root), os.lstat(path)))
    return sorted(found)


def tree_digest(path: str | os.PathLike[str], skip: Iterable[str] = ()) -> dict[str, Any] | None:
    """`{sha256, files, bytes}` of a file or a folder tree (every name, kind and byte under it; a
    symlink by its target, never followed), or None when nothing is there. OSError when a file
    cannot be read."""
    root = Path(path)
    try:
        top = os.lstat(root)
    except FileNotFoundError:
        return None
    digest = hashlib.sha256()
    files = size = 0
    entries = [(".", top)] if not stat.S_ISDIR(top.st_mode) else _entries(root, skip)
    for rel, st in entries:
        full = root if rel == "." else root / rel
        if stat.S_ISREG(st.st_mode):
            files += 1
            size += st.st_size
            line = f"f {rel} {st.st_size} {file_sha256(full)}"
        elif stat.S_ISLNK(st.st_mode):
            line = f"l {rel} {os.readlink(full)}"
        elif stat.S_ISDIR(st.st_mode):
            line = f"d {rel}"
        else:
            line = f"o {rel} {stat.S_IFMT(st.st_mode)}"
        digest.update(line.encode("utf-8", errors="surrogateescape") + b"\n")
    return {"sha256": digest.hexdigest(), "files": files, "bytes": size}


def code_revision(folder: str | os.PathLike[str]) -> dict[str, Any]:
    """What a folder of code is: in a git work tree, `{commit, tree, dirty}` (the folder's tree at
    HEAD, which only a change inside it moves, and the sha256 of its uncommitted changes: edits to
    tracked files and the files git neither tracks nor ignores, null when there are none); elsewhere `{sha256}` of its files, bytecode caches aside;
    `{missing: true}` when it is not there."""
    where = Path(os.path.abspath(folder))
    if not where.is_dir():
        return {"missing": True} if not where.exists() else {"sha256": (tree_digest(where) or {}).get("sha256")}
    top = run_git(["rev-parse", "--show-toplevel"], where)
    commit = run_git(["rev-parse", "--verify", "-q", "HEAD"], where) if top else None
    if top and commit:
        rel = os.path.relpath(os.path.realpath(where), os.path.realpath(top.strip()))
        spec = "HEAD^{tree}" if rel == "." else f"HEAD:{rel}"
        tree = run_git(["rev-parse", "--verify", "-q", spec], where)
        diff = _git_bytes(["diff", "HEAD", "--binary", "--no-ext-diff", "--no-textconv", "--", "."], where)
        untracked = _untracked(where)
        if tree is not None and diff is not None and untracked is not None:
            return {
                "commit": commit.strip(),
                "tree": tree.strip(),
                "dirty": hashlib.sha256(diff + untracked).hexdigest() if diff or untracked else None,
            }
    return {"sha256": (tree_digest(where, CODE_NOISE) or {}).get("sha256")}


def _untracked(where: Path) -> bytes | None:
    """The files under `where` that git neither tracks nor ignores, each as its path and the sha256 of its bytes
    (a new module not yet added is code as much as an edited one); None when git or a file cannot be read."""
    listed = _git_bytes(["ls-files", "--others", "--exclude-standard", "-z", "--", "."], where)
    if listed is None:
        return None
    out = b""
    for rel in sorted(p for p in listed.split(b"\0") if p):
        if CODE_NOISE_BYTES.intersection(rel.split(b"/")):
            continue
        try:
            out += b"untracked " + rel + b" " + file_sha256(where / os.fsdecode(rel)).encode() + b"\n"
        except OSError:
            return None
    return out


def package_version(name: str) -> str | None:
    """The installed version of a distribution in the engine's environment, None when it is not installed."""
    try:
        return importlib.metadata.version(name)
    except (importlib.metadata.PackageNotFoundError, ValueError):
        return None


def input_digests(inputs: Mapping[str, Any]) -> dict[str, Any]:
    """The digests of a reference's declared inputs: `{git: {folder: code_revision},
    packages: {name: version|null}, files: {path: sha256|null}}` (only the kinds declared)."""
    out: dict[str, Any] = {}
    if inputs.get("git"):
        out["git"] = {str(f): code_revision(f) for f in inputs["git"]}
    if inputs.get("packages"):
        out["packages"] = {str(p): package_version(str(p)) for p in inputs["packages"]}
    if inputs.get("files"):
        files: dict[str, str | None] = {}
        for f in inputs["files"]:
            try:
                files[str(f)] = file_sha256(f)
            except OSError:
                files[str(f)] = None
        out["files"] = files
    return out


def keyed(digests: Mapping[str, Any]) -> dict[str, Any]:
    """The part of the digests a reuse key covers: a folder's tree and its uncommitted changes, not
    the commit (a commit that touches other folders leaves a reference of this one valid)."""
    out = dict(digests)
    if "git" in out:
        out["git"] = {f: {k: v for k, v in rev.items() if k != "commit"} for f, rev in out["git"].items()}
    return out


def _short(text: Any) -> str:
    return str(text)[:12] if text else "none"


def _git_change(folder: str, old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    if old.get("missing") or new.get("missing"):
        a = "missing" if old.get("missing") else "present"
        b = "missing" if new.get("missing") else "present"
        return [f"code {folder}: {a} -> {b}"]
    if "tree" not in old or "tree" not in new:
        a = f"tree {_short(old.get('tree'))}" if "tree" in old else f"files sha256 {_short(old.get('sha256'))}"
        b = f"tree {_short(new.get('tree'))}" if "tree" in new else f"files sha256 {_short(new.get('sha256'))}"
        return [] if a == b else [f"code {folder}: {a} -> {b}"]
    out = []
    if old.get("tree") != new.get("tree"):
        out.append(
            f"code {folder}: revision {_short(old.get('commit'))} -> {_short(new.get('commit'))} "
            f"(its tree {_short(old.get('tree'))} -> {_short(new.get('tree'))})"
        )
    if old.get("dirty") != new.get("dirty"):
        a = f"uncommitted changes {_short(old.get('dirty'))}" if old.get("dirty") else "no uncommitted changes"
        b = f"uncommitted changes {_short(new.get('dirty'))}" if new.get("dirty") else "no uncommitted changes"
        out.append(f"code {folder}: {a} -> {b}")
    return out


def changes(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """One line per input whose digest differs: `code trainer: revision 1a2b -> 3c4d (...)`,
    `package torch 2.13.0 -> 2.14.0`, `file data/manifest.json: sha256 ab12 -> cd34`."""
    out: list[str] = []
    old_git, new_git = old.get("git") or {}, new.get("git") or {}
    for folder in dict.fromkeys([*old_git, *new_git]):
        if folder not in old_git or folder not in new_git:
            out.append(
                f"code {folder}: {'not an input' if folder not in old_git else 'an input'} -> "
                f"{'an input' if folder in new_git else 'not an input'}"
            )
            continue
        out += _git_change(folder, old_git[folder], new_git[folder])
    for kind, label in (("packages", "package"), ("files", "file")):
        a, b = old.get(kind) or {}, new.get(kind) or {}
        for name in dict.fromkeys([*a, *b]):
            if a.get(name, "?") == b.get(name, "?"):
                continue
            shown = [_version(a, name, kind), _version(b, name, kind)]
            out.append(f"{label} {name}: {shown[0]} -> {shown[1]}")
    return out


def _version(table: Mapping[str, Any], name: str, kind: str) -> str:
    if name not in table:
        return "not an input"
    value = table[name]
    if value is None:
        return "not installed" if kind == "packages" else "missing"
    return str(value) if kind == "packages" else f"sha256 {_short(value)}"
