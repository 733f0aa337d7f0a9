"""A failed leg's diagnostics (`on_failure.diagnostics`): a directory listed and its files' tails,
stored in the step's evidence and said on the console.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

from engine import limits

DIAG_READ_BYTES = 1 << 18  # enough for 70 long lines; a multi-GB rank log is never read whole


def collect_diagnostics(
    root: Path, list_max: int, max_files: int, tail_lines: int, scrub: Callable[[str], str] = lambda line: line
) -> dict[str, Any]:
    """List a directory tree and tail its files, everything shown unfiltered: the failing rank's
    traceback may use words no failure pattern anticipated. Each tail line is scrubbed before it
    is cut to the evidence's line limit: cut first, a secret across the cut would leave a piece."""
    if not root.is_dir():
        what = "is not a directory" if root.exists() else "does not exist"
        return {
            "dir": str(root),
            "exists": False,
            "message": f"diagnostics dir {root} {what}",
            "listing": [],
            "listing_more": 0,
            "files": [],
        }
    entries: list[str] = []
    files: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        base = Path(dirpath)
        for d in dirnames:
            entries.append(str((base / d).relative_to(root)) + "/")
        for f in sorted(filenames):
            entries.append(str((base / f).relative_to(root)))
            files.append(base / f)
    tails = [
        {"path": str(f), "tail": [limits.cut_text(scrub(line)) for line in tail_file(f, tail_lines)]}
        for f in files[:max_files]
    ]
    return {
        "dir": str(root),
        "exists": True,
        "listing": entries[:list_max],
        "listing_more": max(len(entries) - list_max, 0),
        "files": tails,
    }


def tail_file(path: Path, n: int) -> list[str]:
    try:
        # O_NONBLOCK: a FIFO a leg left in the directory must not block the engine.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return ["<not a regular file: not read>"]
            size = os.lseek(fd, 0, os.SEEK_END)
            os.lseek(fd, max(size - DIAG_READ_BYTES, 0), os.SEEK_SET)
            data = os.read(fd, DIAG_READ_BYTES)
        finally:
            os.close(fd)
    except OSError as exc:
        return [f"<cannot read: {exc.strerror or exc}>"]
    lines = data.decode("utf-8", errors="replace").splitlines()
    return lines[-n:] if n > 0 else []


def report_lines(report: dict[str, Any]) -> list[str]:
    """The console lines of a diagnostics report."""
    lines = [f"   DIAGNOSTICS {report['dir']}:"]
    if not report["exists"]:
        return lines + [f"   {report['message']}"]
    lines += ["   " + entry for entry in report["listing"]]
    if report["listing_more"]:
        lines.append(f"   ... and {report['listing_more']} more entries")
    for item in report["files"]:
        lines.append(f"   ==== {item['path']} (last {len(item['tail'])} lines)")
        lines += ["   " + line for line in item["tail"]]
    return lines
