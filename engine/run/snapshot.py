"""A run step's snapshot: the folders it changes (a local store, an output dir), copied into the run
dir before it runs, so that `engine run --from STEP` can put them back as the step found them.

Copies, never hardlinks: a leg may rewrite a file in place, and a link would carry the change into
the snapshot. The copies are bounded (`max_bytes`, beyond which the step fails before it runs) and
digested (engine/run/digests.py `tree_digest`): a snapshot is restored only while its bytes are the
ones it was taken with.

The run dir's secret filter sees the copies like any file there. Each copy is checked once, as it is
made: a clean file is vouched for (the filter does not search it again, and never rewrites its
bytes); a file holding a secret is masked there like any other, and the snapshot says so, since it
is no longer what the step found: `--from` refuses to restore it.
"""

from __future__ import annotations

import os
import shutil
import stat
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from engine import defaults
from engine.run.digests import tree_digest

FOLDER = "snapshots"


class SnapshotError(Exception):
    """A snapshot could not be taken (over its limit, a copy that failed) or cannot be restored
    (missing, changed, masked); the message names the path and why."""


def _bytes_under(path: Path) -> int:
    try:
        top = os.lstat(path)
    except FileNotFoundError:
        return 0
    if not stat.S_ISDIR(top.st_mode):
        return top.st_size if stat.S_ISREG(top.st_mode) else 0
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for name in files:
            st = os.lstat(os.path.join(dirpath, name))
            total += st.st_size if stat.S_ISREG(st.st_mode) else 0
    return total


def _size(n: int) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:,} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return str(n)


def remove_path(path: Path) -> None:
    """Remove a file, a symlink (never what it points at) or a folder tree; nothing there is fine."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(path)
    else:
        os.unlink(path)


def copy_path(source: Path, dest: Path) -> None:
    """A copy of a file or a folder tree, symlinks as symlinks, times kept."""
    if stat.S_ISDIR(os.lstat(source).st_mode):
        shutil.copytree(source, dest, symlinks=True)
    else:
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, dest, follow_symlinks=False)


def take(
    step: str,
    block: Mapping[str, Any],
    run_dir: Path,
    check_copy: Callable[[Path], bool] = lambda path: False,
) -> list[dict[str, Any]]:
    """Copy each of the block's paths into `<run_dir>/snapshots/<step>/<n>` (replacing an earlier
    snapshot of the step): one entry each, `{path, stored, absent, files, bytes, sha256, masked}`.
    `check_copy(file)` is the secret filter's look at each copied file: True when it masked one.
    SnapshotError, before anything is copied, when the paths hold more than `max_bytes`."""
    paths = [Path(os.path.abspath(os.path.expanduser(str(p)))) for p in block["paths"]]
    limit = int(block.get("max_bytes") or defaults.SNAPSHOT_MAX_BYTES)
    sizes = [_bytes_under(p) for p in paths]
    if sum(sizes) > limit:
        biggest = max(zip(sizes, map(str, paths)))
        raise SnapshotError(
            f"the snapshot before {step} would copy {_size(sum(sizes))}, over its limit of {_size(limit)} "
            f"(snapshot.max_bytes; the biggest: {biggest[1]}, {_size(biggest[0])})"
        )
    folder = run_dir / FOLDER
    if os.path.islink(folder) or (folder.exists() and not folder.is_dir()):
        raise SnapshotError(
            f"{folder} is not a folder the engine made (a link or a file): no snapshot is written through it"
        )
    home = folder / step
    remove_path(home)
    entries = []
    for n, source in enumerate(paths):
        rel = f"{FOLDER}/{step}/{n}"
        entry: dict[str, Any] = {"path": str(source), "stored": rel, "absent": not os.path.lexists(source)}
        if not entry["absent"]:
            try:
                copy_path(source, run_dir / rel)
            except (OSError, shutil.Error) as exc:
                raise SnapshotError(f"the snapshot before {step} could not copy {source}: {exc}") from None
            entry["masked"] = sorted(os.path.relpath(f, run_dir / rel) for f in _files(run_dir / rel) if check_copy(f))
            entry.update(tree_digest(run_dir / rel) or {})
        entries.append(entry)
    return entries


def _files(root: Path) -> list[Path]:
    if not root.is_dir() or root.is_symlink():
        return [root] if stat.S_ISREG(os.lstat(root).st_mode) else []
    return [
        Path(d, name)
        for d, _dirs, names in os.walk(root)
        for name in names
        if stat.S_ISREG(os.lstat(os.path.join(d, name)).st_mode)
    ]


def _stored(run_dir: Path, entry: Mapping[str, Any]) -> Path:
    """Where a recorded snapshot lies: under the run dir's snapshots folder, never elsewhere (the
    evidence that names it may have been edited)."""
    rel = entry.get("stored")
    path = Path(os.path.abspath(run_dir / str(rel))) if isinstance(rel, str) else None
    root = Path(os.path.abspath(run_dir / FOLDER))
    if path is None or root not in path.parents:
        raise SnapshotError(f"the snapshot of {entry.get('path')} is recorded at {rel!r}, not under {FOLDER}/")
    return path


def problem(step: str, entry: Mapping[str, Any], run_dir: Path) -> str | None:
    """Why a recorded snapshot cannot be restored (missing, changed since it was taken, masked),
    or None."""
    what = f"the snapshot of {entry.get('path')} taken before {step}"
    if entry.get("absent") is True:
        return None
    try:
        stored = _stored(run_dir, entry)
    except SnapshotError as exc:
        return str(exc)
    if entry.get("masked"):
        return (
            f"{what} holds files the secret filter masked ({', '.join(map(str, entry['masked'][:5]))}): "
            f"restored, they would not be what {step} found"
        )
    try:
        found = tree_digest(stored)
    except OSError as exc:
        return f"{what} cannot be read at {stored}: {exc.strerror or exc}"
    if found is None:
        return f"{what} is missing: {stored} is not there"
    if found.get("sha256") != entry.get("sha256"):
        return f"{what} changed since it was taken ({stored}: sha256 {entry.get('sha256')} -> {found['sha256']})"
    return None


def restore(step: str, entries: Sequence[Mapping[str, Any]], run_dir: Path, say: Callable[[str], None]) -> None:
    """Put each snapshotted path back as it was before `step` ran (remove it when it was absent),
    saying so. SnapshotError when one cannot be (see `problem`); the paths before it are restored."""
    for entry in entries:
        why = problem(step, entry, run_dir)
        if why:
            raise SnapshotError(why)
        target = Path(str(entry["path"]))
        remove_path(target)
        if entry.get("absent") is True:
            say(f"restored {target} as absent, as it was before {step}")
            continue
        copy_path(_stored(run_dir, entry), target)
        say(
            f"restored {target} from the snapshot taken before {step} ({entry.get('files')} files, {_size(int(entry.get('bytes') or 0))})"
        )
