"""The `remove:` step: rm -rf of the paths a step names, refused where it would destroy what the run
(or the user) cannot lose.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from engine import limits


def remove_step(
    spec: str | Sequence[str],
    record: dict[str, Any],
    run_dir: Path,
    also_under: Sequence[str] = (),
    say: Callable[[str], None] = lambda text: None,
) -> int:
    """Remove every path of a `remove` step, recording what was removed and what was already absent
    in the step's `record` and saying each; 0, or 1 when one is refused or cannot be removed (the
    paths after it stay)."""
    paths = [spec] if isinstance(spec, (str, os.PathLike)) else list(spec)
    removed: list[str] = []
    absent: list[str] = []
    record.update({"paths": [str(p) for p in paths], "error": None})
    try:
        targets = [check_removable(p, run_dir, also_under) for p in paths]
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


def check_removable(
    path: str | os.PathLike[str], run_dir: Path, also_under: Sequence[str | os.PathLike[str]] = ()
) -> Path:
    """The absolute path to remove, or ValueError when removing it would destroy something the
    run (or the user) cannot lose: /, the home directory, the working directory or one of its
    parents, the run's evidence directory or one of its parents; and anything that is not inside
    the working directory, the run directory or one of the directories the step names in
    `also_under` (the engine may run as root: `runs/../../etc` must not be one typo away)."""
    if not str(path).strip():
        raise ValueError("refusing to remove an empty path")
    target = Path(os.path.abspath(os.path.expanduser(str(path))))
    protected = {
        "/": Path("/"),
        "the home directory": Path(os.path.abspath(os.path.expanduser("~"))),
    }
    if target in protected.values():
        label = next(k for k, v in protected.items() if v == target)
        raise ValueError(f"refusing to remove {target}: it is {label}")
    cwd = Path(os.getcwd()).resolve()
    # A symlink is unlinked, not followed, so judge the link itself, not what it points at.
    real = target.parent.resolve() / target.name if target.is_symlink() else target.resolve()
    if real == cwd or real in cwd.parents:
        raise ValueError(f"refusing to remove {target}: it is (or contains) the working directory {cwd}")
    run = run_dir.resolve()
    if real == run or real in run.parents:
        raise ValueError(f"refusing to remove {target}: it is (or contains) the run directory {run}")
    roots = [cwd, run] + [Path(os.path.abspath(os.path.expanduser(str(r)))).resolve() for r in also_under]
    if not any(limits.under(real, root) for root in roots):
        extra = "".join(f", {r}" for r in roots[2:])
        raise ValueError(
            f"refusing to remove {target}: it is outside the working directory {cwd}"
            f", the run directory {run}{extra}; a step that must remove it says so with "
            f"`remove: {{paths: [...], also_under: [<a directory above it>]}}`"
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
