"""Evaluating a spec's checks over the evidence document (the verdict is engine/judge/verdict.py).

A check passes only when its JMESPath expression yields exactly ``true``. It is evaluated by the tracer
(engine/expr/trace.py), which records every lookup on a value that lacks the key; any such miss makes
the outcome NO_DATA, even when the result happens to be ``true``, because missing data must never pass.
The values the tracer remembers are the failure's explanation.

One absence is a fact rather than missing data: the evidence records it. A harvest rule that no line
of a leg's output matched is listed in that step's ``harvest_errors`` (kind ``missing``), so
``steps.leg1.harvest.run_json == `null``` asks whether leg 1 printed a RUN_JSON line and is answered
(true when it printed none). Any other absent path stays NO_DATA, also when compared with null: a key
the trainer did not write, or misspelled in the spec, is no answer.

A check may name sub-expressions (``let: {first2: "..."}``), read as ``let.first2``: pure JMESPath
over the same document, evaluated on first read (their misses count like any other) and shown first
in the explain trace. Its ``when`` decides whether it is evaluated: exactly ``false`` skips it,
absent data is NO_DATA, anything but a boolean is an ERROR; a check the spec disables is DISABLED
(reported with its reason, never evaluated, never failing the verdict).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from engine.expr.trace import check_document, index_paths, trace
from engine.run.output import KIND_MISSING, error_kind
from engine.text import compact
from engine.types import CheckResult

OUTCOMES = ("PASS", "FAIL", "NO_DATA", "SKIPPED", "ERROR", "DISABLED")
FAILING = ("FAIL", "NO_DATA", "ERROR")


def _no_data_reason(missing: list[str]) -> str:
    more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
    return f"no data: {missing[0]} is missing{more}"


def _error_text(exc: Exception) -> str:
    return f"{type(exc).__name__}: {' '.join(str(exc).split())}"


def recorded_absences(document: Any) -> frozenset[tuple]:
    """The paths whose absence the evidence records: ``("steps", S, "harvest", H)`` for each harvest
    rule H of step S that no output line matched (``harvest_errors`` kind missing, H not harvested)."""
    steps = document.get("steps") if isinstance(document, Mapping) else None
    found = set()
    for name, record in (steps or {}).items() if isinstance(steps, Mapping) else ():
        if not isinstance(record, Mapping) or not isinstance(record.get("harvest"), Mapping):
            continue
        errors = record.get("harvest_errors")
        for entry in errors if isinstance(errors, list) else ():
            rule = entry.get("name") if isinstance(entry, Mapping) else None
            if isinstance(rule, str) and error_kind(entry) == KIND_MISSING and rule not in record["harvest"]:
                found.add(("steps", name, "harvest", rule))
    return frozenset(found)


def evaluate_one(
    check: Mapping[str, Any],
    document: Any,
    options: Any = None,
    paths: dict[int, tuple] | None = None,
    absent: frozenset[tuple] | None = None,
) -> CheckResult:
    """One check's result (see ``evaluate``); ``document`` is already ``check_document``-ed, ``absent``
    is its ``recorded_absences``."""
    paths = index_paths(document) if paths is None else paths
    absent = recorded_absences(document) if absent is None else absent
    result: CheckResult = {
        "name": check["name"],
        "why": check.get("why", ""),
        "expr": check["expr"],
        "severity": check.get("severity") or "gate",
        "file": check.get("file"),
        "line": check.get("line"),
        "outcome": "PASS",
        "value": None,
        "missing": [],
        "explain": [],
        "reason": "",
    }
    lets = check.get("let") or None
    if lets:
        result["let"] = dict(lets)
    if check.get("disabled"):
        where = f" (disabled at {check['disabled_at']})" if check.get("disabled_at") else " (disabled)"
        return {**result, "outcome": "DISABLED", "reason": f"{' '.join(check['disabled'].split())}{where}"}
    when = check.get("when")
    if when:
        try:
            cond, missing, _ = trace(when, document, options, explain=False, paths=paths, lets=lets, absent=absent)
        except Exception as exc:  # any failure is the check's ERROR, not a crash
            missing = getattr(exc, "missing", [])
            if missing:
                return {
                    **result,
                    "outcome": "NO_DATA",
                    "missing": missing,
                    "reason": f"when `{when}`: {_no_data_reason(missing)}",
                }
            return {**result, "outcome": "ERROR", "reason": f"when `{when}`: {_error_text(exc)}"}
        # Only an exact false skips: a condition over absent data must not turn a gate into a pass.
        if missing:
            return {
                **result,
                "outcome": "NO_DATA",
                "missing": missing,
                "reason": f"when `{when}`: {_no_data_reason(missing)}",
            }
        if cond is False:
            return {**result, "outcome": "SKIPPED", "reason": f"when `{when}` was false"}
        if cond is not True:
            return {
                **result,
                "outcome": "ERROR",
                "reason": f"when `{when}` gave {compact(cond, 80)}, not true or false",
            }
    try:
        value, missing, pairs = trace(check["expr"], document, options, paths=paths, lets=lets, absent=absent)
    except Exception as exc:  # a plugin function may raise anything
        missing = getattr(exc, "missing", [])
        if missing:
            return {
                **result,
                "outcome": "NO_DATA",
                "reason": _no_data_reason(missing),
                "missing": missing,
                "explain": getattr(exc, "explain", []),
            }
        return {**result, "outcome": "ERROR", "reason": _error_text(exc), "explain": getattr(exc, "explain", [])}
    result.update(value=value, missing=missing, explain=pairs)
    if missing:
        result.update(outcome="NO_DATA", reason=_no_data_reason(missing))
    elif value is True:
        result.update(outcome="PASS", reason="true")
    elif value is False:
        result.update(outcome="FAIL", reason="got false")
    else:
        result.update(outcome="FAIL", reason=f"got {compact(value, 80)}, not true")
    return result


def evaluate(
    checks: Sequence[Mapping[str, Any]], evidence: Mapping[str, Any], options: Any = None
) -> list[CheckResult]:
    """Evaluate every check over the evidence. Each result: name, why, expr, severity, file, line,
    outcome (PASS|FAIL|NO_DATA|SKIPPED|ERROR|DISABLED), value, missing, explain, reason, and `let`
    (name -> expression) when the check names sub-expressions. A DISABLED check is not evaluated."""
    document = check_document(evidence)
    paths = index_paths(document)
    absent = recorded_absences(document)
    return [evaluate_one(check, document, options, paths, absent) for check in checks]
