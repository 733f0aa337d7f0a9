"""The verdict of a run: its outcome and exit code, from the evidence and the check results.

`Exit` is the one list of `engine`'s exit codes (`engine diff` adds its own 0/1/2, like
`git diff --exit-code`). `judge` is the whole evidence -> verdict step, used by `engine run` at the
end of a run and by `engine check`/`replay` on a saved one, so both judge alike.
"""
from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

from engine.checks import FAILING, evaluate
from engine.functions import OPTIONS
from engine.types import Check, CheckResult, Step, Verdict


class Exit(enum.IntEnum):
    """Process exit codes of `engine`."""
    PASS = 0
    USAGE = 2  # invalid spec, bad arguments, refused re-check
    PRECONDITION = 3
    FAILED = 5  # a failed check or a failed leg
    INTERRUPTED = 130  # 128 + SIGINT, as a shell reports Ctrl-C


class JudgedPlan(Protocol):
    steps: Sequence[Step]
    checks: Sequence[Check]


def preconditions(steps: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """Step name -> its precondition message, for the run steps that have one."""
    return {s["name"]: s["run"]["precondition"] for s in steps
            if s.get("kind") == "run" and s["run"].get("precondition")}


def _precondition_failure(evidence: Mapping[str, Any],
                          preconditions: Mapping[str, str]) -> tuple[str, str] | None:
    for name, step in (evidence.get("steps") or {}).items():
        if step.get("status") != "failed":
            continue
        message = preconditions.get(name) or step.get("precondition")
        if message:
            return name, message
    return None


def verdict(evidence: Mapping[str, Any], results: Sequence[CheckResult],
            preconditions: Mapping[str, str] | None = None) -> Verdict:
    """The run's verdict: outcome PASS|FAIL|PRECONDITION|INTERRUPTED, failed names (gate checks
    that FAIL/NO_DATA/ERROR and ``step:<name>`` for failed run steps), warnings, exit code, seconds.

    ``preconditions`` maps a step name to its precondition message (from the plan); a step's own
    ``precondition`` field in the evidence is used when the plan is not at hand.
    """
    steps = evidence.get("steps") or {}
    failed_steps = [f"step:{name}" for name, step in steps.items()
                    if step.get("kind", "run") == "run" and step.get("status") == "failed"]
    failed_checks = [r["name"] for r in results
                     if r["outcome"] in FAILING and r.get("severity", "gate") != "warn"]
    warnings = [r["name"] for r in results
                if r["outcome"] in FAILING and r.get("severity", "gate") == "warn"]
    disabled = [r["name"] for r in results if r["outcome"] == "DISABLED"]
    seconds = evidence.get("seconds")
    if seconds is None:
        seconds = 0.0
    out: Verdict = {"outcome": "PASS", "failed": failed_steps + failed_checks,
                    "warnings": warnings, "exit_code": int(Exit.PASS),
                    "seconds": round(float(seconds), 1)}
    if disabled:
        out["disabled"] = disabled
    precondition = _precondition_failure(evidence, preconditions or {})
    if evidence.get("interrupted") or any(s.get("status") == "interrupted" for s in steps.values()):
        out.update(outcome="INTERRUPTED", exit_code=int(Exit.INTERRUPTED))
    elif precondition:
        out.update(outcome="PRECONDITION", exit_code=int(Exit.PRECONDITION),
                   failed=[f"step:{precondition[0]}"], message=precondition[1])
    elif out["failed"]:
        out.update(outcome="FAIL", exit_code=int(Exit.FAILED))
    return out


def _result_head(check: Mapping[str, Any]) -> dict[str, Any]:
    """The fields of a check a result repeats, for a result made without evaluating it."""
    return {k: check.get(k) for k in ("name", "why", "expr", "severity", "file", "line")}


def judge(plan: JudgedPlan, evidence: Mapping[str, Any]) -> tuple[list[CheckResult], Verdict]:
    """Every check of `plan` evaluated over `evidence`, and the verdict."""
    blocked = (evidence.get("precondition_failed") or {}).get("step")
    if blocked:
        # Nothing after the precondition ran: every check would read missing data, and twenty
        # NO_DATA traces would bury the one line that matters (what could not be prepared).
        results: list[CheckResult] = [
            {**_result_head(check), "outcome": "SKIPPED", "value": None, "missing": [],  # type: ignore[typeddict-item]
             "explain": [], "reason": f"not evaluated: precondition step {blocked} failed"}
            if not check.get("disabled") else evaluate([check], {})[0]
            for check in plan.checks]
    else:
        results = evaluate(list(plan.checks), evidence, OPTIONS)
    return results, verdict(evidence, results, preconditions(plan.steps))
