"""Defaults of every optional spec field, in one place: the plan fills them in (so `engine plan`
shows what will run) and the runtime falls back to the same numbers. The schema's descriptions
document them for editors.
"""

from __future__ import annotations

from typing import Any

GRACE_S = 30
# Any of these in a leg's line marks it for the failure report (the leg's own traceback, torchrun's
# "exitcode", the kernel's "Killed").
FAILURE_PATTERNS = (
    "Traceback",
    "Error",
    "error",
    "Exception",
    "exitcode",
    "Signal",
    "Killed",
    "out of memory",
    "refusing",
    'File "',
)
FAILURE_LINES = 45
TAIL_LINES = 40
PROGRESS_EVERY_S = 30.0
# In a log the first progress line comes this soon (if `every_s` is longer): early word that the leg
# is watched and how long it may still run, even for a leg shorter than `every_s`.
PROGRESS_FIRST_S = 10.0
HARVEST_PICK = "last"
# Marker lines that disagree, or whose JSON does not parse, fail the verdict unless a rule opts in.
HARVEST_ON_CONFLICT = "fail"
HARVEST_ON_MALFORMED = "fail"
DIAGNOSTICS_TAIL_LINES = 70
DIAGNOSTICS_MAX_FILES = 8
DIAGNOSTICS_LIST_MAX = 40
# The built-in `command` collector; its worst case (timeout + grace) counts in the budget.
COMMAND_COLLECT_TIMEOUT_S = 300.0
COMMAND_COLLECT_GRACE_S = 5.0
# The most a step's snapshot may copy into the run dir (`snapshot.max_bytes` sets another bound).
SNAPSHOT_MAX_BYTES = 4 << 30
# A plugin collector's bound when its step gives no `collect.timeout_s`: long enough for the hub collector to
# read back a checkpoint of gigabytes (hash_stored_bytes) over the Hub. Only a given timeout_s counts in the
# budget: a bound against a hang, not a planned duration (counted, it would put the shipped multi-stop specs,
# with a hub collector after every leg, over their budget_s).
PLUGIN_COLLECT_TIMEOUT_S = 600.0

RUN: dict[str, Any] = {
    "grace_s": GRACE_S,
    "ok_exit_codes": [0],
    "env": {},
    "cwd": None,
    "precondition": None,
    "stop_on_failure": False,
    "signals": [],
    "progress": None,
    "on_failure": None,
}
OUTPUT: dict[str, Any] = {
    "strip_prefix": None,
    "echo_prefixes": [],
    "harvest": {},
    "failure_patterns": list(FAILURE_PATTERNS),
    "failure_lines": FAILURE_LINES,
    "tail_lines": TAIL_LINES,
}
HARVEST: dict[str, Any] = {
    "pick": HARVEST_PICK,
    "on_conflict": HARVEST_ON_CONFLICT,
    "on_malformed": HARVEST_ON_MALFORMED,
}
SIGNAL: dict[str, Any] = {"after_s": 0}
PROGRESS: dict[str, Any] = {"every_s": PROGRESS_EVERY_S}
DIAGNOSTICS: dict[str, Any] = {
    "tail_lines": DIAGNOSTICS_TAIL_LINES,
    "max_files": DIAGNOSTICS_MAX_FILES,
    "list_max": DIAGNOSTICS_LIST_MAX,
}
