"""The `remove:` step: rm -rf of the paths a step names, only inside the run dir or a directory the
step declares (`also_under`), and never what the run (or the user) cannot lose: a git repository or
working tree, the spec's files or a folder holding one, the working directory, the run dir itself,
home, `/`.

A refusal names the value that made the path (`--set train_out=.git` makes `${train_out}` the
checkout's `.git`): the step fails, and with it the verdict.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from engine import limits
from engine.spec.values import refs
from engine.text import compact


def remove_step(
    step: Mapping[str, Any],
    record: dict[str, Any],
    run_dir: Path,
    say: Callable[[str], None] = lambda text: None,
    plan: Any = None,
) -> int:
    """Remove every path of a `remove` step, recording what was removed and what was already absent
    in the step's `record` and saying each; 0, or 1 when one is refused or cannot be removed (the
    paths after it stay). `plan` (the run's) names, in a refusal, the value each path came from."""
    spec = step["remove"]
    paths = [spec] if isinstance(spec, (str, os.PathLike)) else list(spec)
    origins = path_origins(plan, step, len(paths))
    spec = getattr(plan, "spec", None)
    spec_files = [
        Path(os.path.abspath(str(f))) for f in [getattr(spec, "path", None), *getattr(spec, "files", ())] if f
    ]
    removed: list[str] = []
    absent: list[str] = []
    record.update({"paths": [str(p) for p in paths], "error": None})
    try:
        targets = [
            check_removable(p, run_dir, step.get("remove_also_under") or (), spec_files, origin)
            for p, origin in zip(paths, origins)
        ]
        for target in targets:
            if remove_path(target):
                removed.append(str(target))
            else:
                absent.append(str(target))
    except (ValueError, OSError) as exc:
        record.update({"status": "failed", "error": str(exc), "removed": removed, "absent": absent})
        say(f"   REMOVE FAILED: {exc}")
        return 1
    record.update({"status": "ok", "removed": removed, "absent": absent})
    for path in removed:
        say(f"   removed {path}")
    for path in absent:
        say(f"   already absent {path}")
    return 0


# Where a value came from (engine/spec/values.py), as a refusal says it.
_SOURCE = {
    "--set": "given by --set",
    "env": "given by the environment",
    "default": "the spec's value",
    "mode": "the mode's value",
    "derived": "derived in the spec",
    "builtin": "the engine's",
}


def path_origins(plan: Any, step: Mapping[str, Any], count: int) -> list[str]:
    """For each path of the step, where it came from, as a refusal says it: ` (from `${train_out}`:
    train_out = ".git" (given by --set))`; empty where the plan or the spec's text is not at hand."""
    data = getattr(getattr(plan, "spec", None), "data", None)
    raw = next(
        (
            s.get("remove")
            for s in (data or {}).get("steps") or []
            if isinstance(s, Mapping) and s.get("name") == step["name"]
        ),
        None,
    )
    raw = raw.get("paths") if isinstance(raw, Mapping) else raw
    texts = [raw] if isinstance(raw, str) else list(raw) if isinstance(raw, list) else []
    if len(texts) != count:
        return [""] * count
    values: Mapping[str, Any] = getattr(plan, "values", {}) or {}
    sources: Mapping[str, str] = getattr(plan, "sources", {}) or {}
    out = []
    for text in texts:
        names = [n for n in dict.fromkeys(refs(str(text))) if n in values]
        told = "; ".join(
            f"{n} = {compact(values[n], 80)} ({_SOURCE.get(sources.get(n, ''), 'the spec')})" for n in names
        )
        out.append(f" (from `{text}`: {told})" if told else f" (`{text}` as the spec writes it)")
    return out


def _work_tree(start: Path) -> Path | None:
    """The root of the git working tree (or repository) holding `start`, if any."""
    for folder in [start, *start.parents]:
        if os.path.lexists(folder / ".git"):
            return folder
    return None


def check_removable(
    path: str | os.PathLike[str],
    run_dir: Path,
    also_under: Sequence[str | os.PathLike[str]] = (),
    spec_files: Sequence[Path] = (),
    origin: str = "",
) -> Path:
    """The absolute path to remove, or ValueError (naming the path and `origin`, the value it came
    from) when removing it would destroy what the run or the user cannot lose: /, the home directory,
    the working directory, the run directory, the spec's files (`spec_files`: the spec and what it
    extends or includes), the git working tree of any of these, each of them or a folder holding
    one; a `.git` or anything in one, or a folder holding one; and anything that is not inside the run directory or a directory the step
    names in `also_under` (the engine may run as root: `runs/../../etc` must not be one typo away)."""
    if not str(path).strip():
        raise ValueError(f"refusing to remove an empty path{origin}")
    target = Path(os.path.abspath(os.path.expanduser(str(path))))
    # A symlink is unlinked, not followed, so judge the link itself, not what it points at.
    real = target.parent.resolve() / target.name if target.is_symlink() else target.resolve()
    run = run_dir.resolve()
    cwd = Path(os.getcwd()).resolve()
    kept = [
        ("the home directory", Path(os.path.abspath(os.path.expanduser("~"))).resolve()),
        ("the working directory", cwd),
        ("the run directory", run),
    ] + [("a file of the spec", file.resolve()) for file in spec_files]
    kept += [(f"the git working tree of {label}", tree) for label, p in kept if (tree := _work_tree(p)) is not None]
    if real == Path("/"):
        raise ValueError(f"refusing to remove {target}{origin}: it is /")
    for label, folder in kept:
        if real == folder or real in folder.parents:
            raise ValueError(f"refusing to remove {target}{origin}: it is (or holds) {label}, {folder}")
    # Inside the run dir, a clone a leg made is the run's own to remove.
    if not limits.under(real, run) and (".git" in real.parts or os.path.lexists(real / ".git")):
        raise ValueError(f"refusing to remove {target}{origin}: it is (or is in, or holds) a git repository")
    roots = [run] + [Path(os.path.abspath(os.path.expanduser(str(r)))).resolve() for r in also_under]
    if not any(limits.under(real, root) for root in roots):
        extra = "".join(f", {r}" for r in roots[1:])
        raise ValueError(
            f"refusing to remove {target}{origin}: it is outside the run directory {run}{extra}; a step "
            f"that must remove it says so with `remove: {{paths: [...], also_under: [<a directory above it>]}}`"
        )
    return target


def remove_path(target: Path) -> bool:
    """rm -rf one path (a symlink is unlinked, never followed); False when it was not there."""
    if target.is_symlink() or target.is_file():
        target.unlink()
        return True
    if target.is_dir():
        shutil.rmtree(target)
        return True
    if os.path.lexists(target):
        target.unlink()
        return True
    return False
