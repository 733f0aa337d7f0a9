"""The verdict of a run: its outcome and exit code, from the evidence and the check results.

`Exit` is the one list of `engine`'s exit codes (`engine diff` adds its own 0/1/2, like
`git diff --exit-code`). `judge` is the whole evidence -> verdict step, used by `engine run` at the
end of a run (`store_verdict`, through the run's record) and by `engine check`/`replay` on a saved
one, so both judge alike.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

from engine.expr.functions import OPTIONS
from engine.judge.checks import FAILING, evaluate
from engine.run.output import harvest_problems
from engine.run.record import Record, RecordError
from engine.run.said import fail_on_text, printed_failure
from engine.types import Check, CheckResult, Step, Verdict


class Exit(enum.IntEnum):
    """Process exit codes of `engine`."""

    PASS = 0
    USAGE = 2  # invalid spec, bad arguments, refused re-check
    PRECONDITION = 3
    ERROR = 4  # the run's record could not be written (a full disk): it stopped, unjudged
    FAILED = 5  # a failed check or step, or a harvest problem
    INTERRUPTED = 130  # 128 + SIGINT, as a shell reports Ctrl-C


class JudgedPlan(Protocol):
    steps: Sequence[Step]
    checks: Sequence[Check]


# What a run step's record may say without an exit code: it never started, or Ctrl-C stopped it.
_NO_EXIT_CODE = ("not_run", "skipped", "failed", "interrupted")


def run_status(record: Mapping[str, Any], ok_exit_codes: Sequence[Any]) -> str:
    """A run step's status from what it recorded, not from its stored status string: `ok` only for
    an exit code in `ok_exit_codes`, no timeout, no start error and no line a `fail_on` rule matched,
    so a hand-edited "status": "ok" cannot turn a failed leg into a pass. `interrupted` stays (the verdict is
    INTERRUPTED); a record without an exit code keeps a status that needs none, else is failed."""
    stored = record.get("status")
    if stored == "interrupted":
        return stored
    if "rc" not in record:
        return stored if stored in _NO_EXIT_CODE else "failed"
    ok = (
        record["rc"] in ok_exit_codes
        and not record.get("timed_out")
        and not record.get("error")
        and printed_failure(record) is None
    )
    return "ok" if ok else "failed"


def _ok_exit_codes(
    name: str, plan_steps: Mapping[str, Mapping[str, Any]], evidence: Mapping[str, Any]
) -> Sequence[Any]:
    """The plan's ok_exit_codes for a step; the run's own definition when the plan lacks it."""
    step = plan_steps.get(name) or (evidence.get("definitions") or {}).get(name) or {}
    codes = (step.get("run") or {}).get("ok_exit_codes") if isinstance(step, Mapping) else None
    return codes if isinstance(codes, list) else [0]


def derive_statuses(
    steps: Iterable[Mapping[str, Any]], evidence: Mapping[str, Any]
) -> tuple[dict[str, Any], list[str]]:
    """The evidence with every run step's status derived by `run_status`, and every remove or
    collect step that recorded an error failed (a copy; the input is left as it is), plus one
    note per step whose stored status said otherwise."""
    plan_steps = {s["name"]: s for s in steps}
    doc = dict(evidence)
    doc["steps"] = dict(evidence.get("steps") or {})
    notes = []
    for name, record in doc["steps"].items():
        if not isinstance(record, Mapping):
            continue
        if record.get("kind", "run") != "run":
            # A remove or collect step has no exit code; its recorded error is what failed it.
            if record.get("status") == "ok" and record.get("error"):
                notes.append(
                    f"step {name}: the evidence says status 'ok', but it recorded the error "
                    f"{str(record['error'])[:200]!r}: counted as failed"
                )
                doc["steps"][name] = {**record, "status": "failed"}
            continue
        codes = _ok_exit_codes(name, plan_steps, evidence)
        status = run_status(record, codes)
        if status != record.get("status"):
            rc = f"rc {record['rc']}" if "rc" in record else "no exit code"
            # Failed only by a line its output printed: that line is the reason.
            exited_ok = run_status({k: v for k, v in record.items() if k != "fail_on"}, codes) == "ok"
            printed = fail_on_text(record) if status == "failed" and exited_ok else None
            how = (
                printed
                or f"recorded {rc} (ok_exit_codes {list(codes)}{', timed out' if record.get('timed_out') else ''})"
            )
            notes.append(
                f"step {name}: the evidence says status {record.get('status')!r}, but it {how}: counted as {status}"
            )
            doc["steps"][name] = {**record, "status": status}
    return doc, notes


def harvest_rules(steps: Iterable[Mapping[str, Any]]) -> dict[str, Mapping[str, Any]]:
    """Step name -> its harvest rules (name -> rule), for the run steps of a plan."""
    return {
        s["name"]: ((s.get("run") or {}).get("output") or {}).get("harvest") or {}
        for s in steps
        if s.get("kind") == "run"
    }


def all_harvest_problems(evidence: Mapping[str, Any], rules: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Every run step's harvest problems (engine/run/output.py), judged by the plan's CURRENT rules:
    a spec that opts in later (on_conflict: pick) is honoured by `engine check`."""
    problems = []
    for name, record in (evidence.get("steps") or {}).items():
        if isinstance(record, Mapping) and record.get("kind", "run") == "run":
            problems += harvest_problems(name, record, rules.get(name) or {})
    return problems


def harvest_name(problem: Mapping[str, Any]) -> str:
    """`harvest:leg1.run_json`: how a harvest problem is named in `failed`, the table and JUnit."""
    return f"harvest:{problem['step']}.{problem['harvest']}"


def preconditions(steps: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """Step name -> its precondition message, for the run steps that have one."""
    return {
        s["name"]: s["run"]["precondition"] for s in steps if s.get("kind") == "run" and s["run"].get("precondition")
    }


def _precondition_failure(evidence: Mapping[str, Any], preconditions: Mapping[str, str]) -> tuple[str, str] | None:
    for name, step in (evidence.get("steps") or {}).items():
        if step.get("status") != "failed":
            continue
        message = preconditions.get(name) or step.get("precondition")
        if message:
            return name, message
    return None


def verdict(
    evidence: Mapping[str, Any],
    results: Sequence[CheckResult],
    preconditions: Mapping[str, str] | None = None,
    harvest: Sequence[Mapping[str, Any]] = (),
) -> Verdict:
    """The run's verdict: outcome PASS|FAIL|PRECONDITION|INTERRUPTED|ERROR, failed names (gate checks
    that FAIL/NO_DATA/ERROR, ``step:<name>`` for failed steps of any kind, ``harvest:<step>.<rule>`` for
    harvest problems no rule opted into), warnings, exit code, seconds; `harvest` lists every
    harvest problem (failing or opted into) when there is one; `reused` the steps whose evidence
    an earlier run made (`engine run --from`), when there are some.

    ``preconditions`` maps a step name to its precondition message (from the plan); a step's own
    ``precondition`` field in the evidence is used when the plan is not at hand.
    """
    steps = evidence.get("steps") or {}
    # Every kind: a wipe that failed leaves leg 2 a warm resume, a collector that failed leaves
    # state that no check may happen to read; neither may pass quietly.
    failed_steps = [f"step:{name}" for name, step in steps.items() if step.get("status") == "failed"]
    # A harvest problem is not a check, but a gate all the same: the value the checks read may
    # not be what the leg meant.
    failed_steps += list(dict.fromkeys(harvest_name(p) for p in harvest if p.get("fails")))
    failed_checks = [r["name"] for r in results if r["outcome"] in FAILING and r.get("severity", "gate") != "warn"]
    warnings = [r["name"] for r in results if r["outcome"] in FAILING and r.get("severity", "gate") == "warn"]
    disabled = [r["name"] for r in results if r["outcome"] == "DISABLED"]
    seconds = evidence.get("seconds")
    if seconds is None:
        seconds = 0.0
    out: Verdict = {
        "outcome": "PASS",
        "failed": failed_steps + failed_checks,
        "warnings": warnings,
        "exit_code": int(Exit.PASS),
        "seconds": round(float(seconds), 1),
    }
    if disabled:
        out["disabled"] = disabled
    # `engine run --from`: the steps whose evidence an earlier run made, and when that run started.
    reused = [{"step": n, "from": s.get("reused_from")} for n, s in steps.items() if s.get("reused") is True]
    if reused:
        out["reused"] = reused
    if harvest:
        out["harvest"] = [dict(p) for p in harvest]
    precondition = _precondition_failure(evidence, preconditions or {})
    record_error = evidence.get("record_error")
    unscrubbed = evidence.get("unscrubbed")
    if isinstance(record_error, Mapping):
        out.update(outcome="ERROR", exit_code=int(Exit.ERROR), message=_record_message(record_error))
    elif unscrubbed:
        # A run dir that may still hold a secret is never a pass, whatever the checks say.
        out.update(outcome="ERROR", exit_code=int(Exit.ERROR), message=_unscrubbed_message(unscrubbed))
    elif evidence.get("interrupted") or any(s.get("status") == "interrupted" for s in steps.values()):
        out.update(outcome="INTERRUPTED", exit_code=int(Exit.INTERRUPTED))
    elif precondition:
        out.update(
            outcome="PRECONDITION",
            exit_code=int(Exit.PRECONDITION),
            failed=[f"step:{precondition[0]}"],
            message=precondition[1],
        )
    elif out["failed"]:
        out.update(outcome="FAIL", exit_code=int(Exit.FAILED))
    return out


def _unscrubbed_message(unscrubbed: Any) -> str:
    files = [str(u) for u in unscrubbed] if isinstance(unscrubbed, list) else [str(unscrubbed)]
    shown = "; ".join(files[:5]) + (f"; and {len(files) - 5} more" if len(files) > 5 else "")
    return (
        f"the run dir holds {len(files)} file{'s' if len(files) != 1 else ''} the engine could not check "
        f"for secrets (they may hold one; make them readable to it, or remove them): {shown}"
    )


def _record_message(record_error: Mapping[str, Any]) -> str:
    step = record_error.get("step")
    kept = (
        "no evidence.json of it could be written"
        if record_error.get("stored") is False
        else "evidence.json holds what was written before"
    )
    return (
        f"{record_error.get('error')}; the run stopped{f' at step {step}' if step else ''} and was not judged: {kept}"
    )


def _result_head(check: Mapping[str, Any]) -> dict[str, Any]:
    """The fields of a check a result repeats, for a result made without evaluating it."""
    return {k: check.get(k) for k in ("name", "why", "expr", "severity", "file", "line")}


def judge(plan: JudgedPlan, evidence: Mapping[str, Any]) -> tuple[list[CheckResult], Verdict]:
    """Every check of `plan` evaluated over `evidence`, and the verdict. Run steps' statuses are
    derived from their exit codes (`derive_statuses`), for the checks and the verdict alike."""
    evidence, _ = derive_statuses(plan.steps, evidence)
    blocked = (evidence.get("precondition_failed") or {}).get("step")
    unrecorded = evidence.get("record_error")
    if blocked or isinstance(unrecorded, Mapping):
        # Nothing after the precondition ran (or the run stopped on a write it could not make):
        # every check would read missing data, and twenty NO_DATA traces would bury the one line
        # that matters (what could not be prepared, what could not be written).
        reason = (
            f"not evaluated: the run's record could not be written ({unrecorded.get('path')})"
            if isinstance(unrecorded, Mapping)
            else f"not evaluated: precondition step {blocked} failed"
        )
        results: list[CheckResult] = [
            {
                **_result_head(check),
                "outcome": "SKIPPED",
                "value": None,
                "missing": [],  # type: ignore[typeddict-item]
                "explain": [],
                "reason": reason,
            }
            if not check.get("disabled")
            else evaluate([check], {})[0]
            for check in plan.checks
        ]
    else:
        results = evaluate(list(plan.checks), evidence, OPTIONS)
    problems = all_harvest_problems(evidence, harvest_rules(plan.steps))
    return results, verdict(evidence, results, preconditions(plan.steps), problems)


def store_verdict(plan: JudgedPlan, evidence: dict[str, Any], record: Record) -> dict[str, Any]:
    """Judge a run's `evidence` and store its checks and verdict in evidence.json through the run's
    `record`; the document as stored (masked), which is what the reports render. A write that fails
    makes the verdict ERROR: judged again with the failure, it is then only said."""
    while True:
        evidence["checks"], evidence["verdict"] = judge(plan, evidence)
        try:
            return record.save(evidence)
        except RecordError as exc:
            if "record_error" in evidence:  # judged with it: the verdict stands, unstored
                record.say(f"ERROR: the verdict could not be stored: {exc}")
                return record.mask(evidence)
            record.failed(evidence, exc, None)
