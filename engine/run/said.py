"""What a step's recorded output says of it, in one line each: the child's exit behind a launcher
(`output.child_exit`), a line that failed a leg that exited 0 (`output.fail_on`), the leg's warnings
(`output.warn_on`) and a crashed leg's last exception line. Every report says these the same way; each
reads a step record, whose fields are checked, as a saved evidence file may say anything."""

from __future__ import annotations

import json
import signal
from collections.abc import Mapping
from typing import Any


def child_exit_text(child: Mapping[str, Any]) -> str:
    """`the trainer exited 3: refused: ...` (or `died of SIGKILL (exit code -9)`) from a step's
    recorded `child_exit`; its fields are checked, as a saved evidence file may say anything."""
    who = child.get("name") if isinstance(child.get("name"), str) else "the child"
    code = child.get("code")
    if isinstance(code, int) and not isinstance(code, bool) and code < 0:
        try:
            how = f"died of {signal.Signals(-code).name} (exit code {code})"
        except ValueError:
            how = f"exited {code}"
    elif isinstance(code, int) and not isinstance(code, bool):
        how = f"exited {code}"
    else:
        how = "failed"
    message = child.get("message")
    return f"{who} {how}" + (f": {message}" if isinstance(message, str) and message else "")


def printed_failure(record: Mapping[str, Any]) -> dict[str, Any] | None:
    """A step record's `fail_on` (the lines of its output that a `fail_on` rule matched), {count,
    lines}, when it names at least one line, else None; its fields are checked, as a saved evidence
    file may say anything."""
    found = record.get("fail_on")
    if not isinstance(found, Mapping):
        return None
    listed = found.get("lines")
    lines = [hit for hit in listed if isinstance(hit, Mapping)] if isinstance(listed, list) else []
    count = found.get("count")
    count = max(count if isinstance(count, int) and not isinstance(count, bool) else 0, len(lines))
    return {"count": count, "lines": lines} if count > 0 else None


def fail_on_text(record: Mapping[str, Any]) -> str | None:
    """`exited 0 but printed a failure line: "CKPT FAILED: push of step 20" (line 412)` for a step
    record whose output matched a `fail_on` rule (`exited 1 and ...` for another code), else None."""
    found = printed_failure(record)
    if found is None:
        return None
    rc = record.get("rc")
    how = f"exited {rc} {'but' if rc == 0 else 'and'}" if isinstance(rc, int) and not isinstance(rc, bool) else "ended"
    first = found["lines"][0] if found["lines"] else {}
    text, line = first.get("text"), first.get("line")
    quoted = json.dumps(text if isinstance(text, str) else "", ensure_ascii=False)
    where = f" (line {line})" if isinstance(line, int) and not isinstance(line, bool) else ""
    more = found["count"] - 1
    rest = f", and {more} more failure line{'s' if more > 1 else ''}" if more > 0 else ""
    return f"{how} printed a failure line: {quoted}{where}{rest}"


def _quoted(hit: Any, width: int = 200) -> str:
    """`"text" (line 40)` of a kept line {line, text}; its fields are checked, as a saved evidence file may say anything."""
    hit = hit if isinstance(hit, Mapping) else {}
    text, line = hit.get("text"), hit.get("line")
    text = text if isinstance(text, str) else ""
    quoted = json.dumps(text if len(text) <= width else text[: width - 3] + "...", ensure_ascii=False)
    return quoted + (f" (line {line})" if isinstance(line, int) and not isinstance(line, bool) else "")


def warned_text(record: Mapping[str, Any]) -> str | None:
    """`warned: "... not resumable ..." (line 40), and 2 more warning lines` for a step record whose
    output matched a `warn_on` rule, else None."""
    found = record.get("warn_on")
    listed = found.get("lines") if isinstance(found, Mapping) else None
    if not isinstance(listed, list) or not listed:
        return None
    count = found.get("count")
    more = (count if isinstance(count, int) and not isinstance(count, bool) else len(listed)) - 1
    return f"warned: {_quoted(listed[0])}" + (
        f", and {more} more warning line{'s' if more > 1 else ''}" if more > 0 else ""
    )


def exception_text(record: Mapping[str, Any]) -> str | None:
    """`last exception: "FileExistsError: ..." (line 88)` for a step record that kept one (a failed leg), else None."""
    found = record.get("exception")
    return f"last exception: {_quoted(found)}" if isinstance(found, Mapping) and found.get("text") else None


def exit_text(record: Mapping[str, Any]) -> str | None:
    """What a failed step's own output says of why: a line a `fail_on` rule matched in a leg that
    exited 0 (`fail_on_text`, then the child's exit when the launcher's report gave its code: a wrapper
    swallowed it), else the child's exit (`child_exit_text`), else the `fail_on` line; None when it
    says nothing."""
    child = record.get("child_exit")
    child = child if isinstance(child, Mapping) else None
    printed, rc = fail_on_text(record), record.get("rc")
    if printed is not None and ((rc == 0 and not isinstance(rc, bool)) or child is None):
        coded = child is not None and child.get("code") is not None
        return printed + (f"; {child_exit_text(child)}" if coded else "")
    return child_exit_text(child) if child is not None else None
