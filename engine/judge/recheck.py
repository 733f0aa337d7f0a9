"""Re-checking a saved run against the CURRENT spec (`engine check`, `engine replay`, `engine diff
--evidence`): rebuild the plan the run would have had (engine/spec/plan.py `replan`), say which steps
changed since, and re-derive a step's harvest from its raw log.

A saved run can vouch for a check only while every step is defined as it was when it ran; the
fingerprints (and, for a readable message, the definitions, compared as the evidence stores them)
in the evidence say whether it is. What a re-check says, stores and returns leaves through a Record
on the saved run (engine/run/record.py), masked with the environment it runs in.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from engine.judge.verdict import derive_statuses, judge
from engine.run import evidence
from engine.run.digests import run_git
from engine.run.output import reharvest
from engine.run.record import Record, RecordError
from engine.secrets import redact
from engine.spec.load import Spec
from engine.spec.located import display_path
from engine.spec.plan import Plan, replan, run_stamp, stored_definitions, stored_output_rules
from engine.text import changed_keys, compact_pair, describe_change, flatten
from engine.types import CheckResult, Verdict

_ABSENT = "<absent>"


class Refused(Exception):
    """The saved run no longer describes the spec's steps; the message lists what changed."""


@dataclass
class Recheck:
    evidence: dict[str, Any]  # the saved document as judged (re-harvested by a replay)
    results: list[CheckResult]
    verdict: Verdict


def _change(key: str, old: Mapping[str, Any], new: Mapping[str, Any]) -> str:
    a, b = flatten(old), flatten(new)
    return describe_change(key, a.get(key, _ABSENT), b.get(key, _ABSENT))


def value_changes(saved: Mapping[str, Any], plan: Plan) -> list[tuple[str, Any, Any]]:
    """(name, the run's value, the spec's value) for every value that differs between the saved
    run and the plan rebuilt for it (secrets compared redacted, as the evidence stores them)."""
    run_values: Mapping[str, Any] = saved.get("values") or {}
    spec_values = redact(plan.values, plan.secret_names)
    out = []
    for name in list(run_values) + [n for n in spec_values if n not in run_values]:
        old, new = run_values.get(name, _ABSENT), spec_values.get(name, _ABSENT)
        if not _same(old, new):
            out.append((name, old, new))
    return out


def _same(a: Any, b: Any) -> bool:
    """Equal as JSON values: 1 and 1.0 are, true and 1 are not, NaN equals NaN."""
    if isinstance(a, bool) != isinstance(b, bool):
        return False
    return a == b or evidence.dumps(a, indent=None) == evidence.dumps(b, indent=None)


def value_change_lines(changes: list[tuple[str, Any, Any]]) -> list[str]:
    """`loss_ceiling: run had 6.0, spec has 0.01`, one per changed value."""
    lines = []
    for name, old, new in changes:
        a, b = compact_pair(old, new, 80)
        a = "no such value" if old is _ABSENT else a
        b = "no such value" if new is _ABSENT else b
        lines.append(f"{name}: run had {a}, spec has {b}")
    return lines


def spec_mismatch(
    spec: Spec, saved: Mapping[str, Any], spec_label: str, run_dir: Path, action: str = "re-check"
) -> str | None:
    """Why the saved run is not evidence of `spec` (another spec's run), or None. The spec's name
    is its identity: a file can move, but p4_smoke's run never vouches for p4_soak. `action` is
    what is refused (`re-check`, `resume`)."""
    ran = saved.get("spec") if isinstance(saved.get("spec"), Mapping) else {}
    ran_name, name = ran.get("name"), spec.data.get("name")
    if ran_name == name and isinstance(name, str):
        return None
    ran_text = (
        f"spec {ran_name!r} ({ran.get('path') or 'path not recorded'})"
        if ran_name
        else "no spec name (not an engine run's evidence?)"
    )
    return f"refusing to {action} {run_dir}: it is evidence of {ran_text}, not of spec {name!r} ({spec_label})"


def step_changes(
    evidence: Mapping[str, Any], plan: Plan, environ: Mapping[str, str] | None = None
) -> tuple[list[str], list[str]]:
    """(changes, notes): one line per step whose definition differs between the saved run and
    `plan`, and notes on differences that do not count (only a secret's text)."""
    old_fp: Mapping[str, str] = evidence.get("fingerprints") or {}
    new_fp: Mapping[str, str] = plan.fingerprints
    old_defs: Mapping[str, Any] = evidence.get("definitions") or {}
    new_defs = stored_definitions(plan, os.environ if environ is None else environ)
    changes: list[str] = []
    notes: list[str] = []
    for name in old_fp:
        if name not in new_fp:
            changes.append(f"step {name}: removed from the spec since the run")
    for name in new_fp:
        if name not in old_fp:
            changes.append(f"step {name}: added to the spec since the run")
        elif new_fp[name] != old_fp[name]:
            if name in old_defs:
                new_def = new_defs[name]
                keys = changed_keys(old_defs[name], new_def)
                if not keys:
                    # Equal once secrets are redacted: only a secret differs (or could not be
                    # re-supplied), and the evidence holds no secret to compare with.
                    notes.append(f"note: step {name} differs only in a secret value; re-checking anyway")
                    continue
                how = "; ".join(_change(k, old_defs[name], new_def) for k in keys)
                if _only_longer_timeouts(keys, old_defs[name], new_def, (evidence.get("steps") or {}).get(name)):
                    notes.append(
                        f"note: step {name}'s timeout grew ({how}) and its saved leg ended within it; re-checking"
                    )
                    continue
                changes.append(f"step {name}: definition changed ({how})")
            else:
                changes.append(
                    f"step {name}: definition changed (fingerprint {old_fp[name][:12]} -> {new_fp[name][:12]})"
                )
    return changes, notes


def _only_longer_timeouts(keys: list[str], old: Mapping[str, Any], new: Mapping[str, Any], record: Any) -> bool:
    """Every change is a timeout that grew, and the saved leg did not time out: it would have ended the same
    under the longer limit, so its evidence still answers the new definition. A shorter one could have cut it."""
    if not isinstance(record, Mapping) or record.get("timed_out") or record.get("status") not in ("ok", "failed"):
        return False
    a, b = flatten(old), flatten(new)

    def longer(key: str) -> bool:
        was, now = a.get(key), b.get(key)
        numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (was, now))
        return key.rsplit(".", 1)[-1] == "timeout_s" and numbers and now > was

    return bool(keys) and all(longer(k) for k in keys)


# Harvest options the verdict applies when judging, not when harvesting: `engine check` honours them.
_JUDGED = ("on_conflict", "on_malformed")
# Output rules that only report (what a failed leg's child said), never change what checks read.
_REPORTING = ("child_exit",)


def _harvesting(output: Any) -> Any:
    """A step's output rules without the options that only judge the harvest or report."""
    if not isinstance(output, Mapping):
        return output
    output = {k: v for k, v in output.items() if k not in _REPORTING}
    rules = output.get("harvest")
    if not isinstance(rules, Mapping):
        return output
    return {
        **output,
        "harvest": {
            n: {k: v for k, v in r.items() if k not in _JUDGED} if isinstance(r, Mapping) else r
            for n, r in rules.items()
        },
    }


def output_changes(evidence: Mapping[str, Any], plan: Plan, environ: Mapping[str, str] | None = None) -> list[str]:
    """One line per run step whose output rules (what made its harvest) changed since the run;
    empty for evidence that did not record them."""
    old_rules = evidence.get("output_rules")
    if not isinstance(old_rules, Mapping):
        return []
    new_rules = stored_output_rules(plan, os.environ if environ is None else environ)
    lines = []
    for step in plan.steps:
        name = step["name"]
        if step.get("kind") != "run" or name not in old_rules:
            continue
        old = {"output": _harvesting(old_rules[name])}
        new = {"output": _harvesting(new_rules[name])}
        keys = changed_keys(old, new)
        if keys:
            lines.append(f"step {name}: output rules changed (" + "; ".join(_change(k, old, new) for k in keys) + ")")
    return lines


def reharvest_steps(evidence: dict[str, Any], plan: Plan, run_dir: Path) -> list[str]:
    """Re-derive every run step's harvest in `evidence` from its raw log with the plan's output
    rules (in place); one note per step whose log is missing."""
    notes = []
    by_name = {s["name"]: s for s in plan.steps}
    for name, step in (evidence.get("steps") or {}).items():
        if step.get("kind") != "run" or not step.get("log") or name not in by_name:
            continue
        log = run_dir / step["log"]
        if not os.path.lexists(log):
            notes.append(f"step {name}: raw log {log} is missing; kept the saved harvest")
            continue
        fresh = reharvest(by_name[name], log, run_dir)
        step["harvest"], step["harvest_errors"] = fresh["harvest"], fresh["harvest_errors"]
        step["lines"], step["progress"] = fresh["lines"], fresh["progress"]
        # The lines the current `fail_on` rules match fail the leg (derive_statuses), whatever it exited.
        step.pop("fail_on", None)
        if fresh["fail_on"] is not None:
            step["fail_on"] = fresh["fail_on"]
        step.pop("warn_on", None)
        if fresh["warn_on"] is not None:
            step["warn_on"] = fresh["warn_on"]
        if step.get("status") == "failed" or fresh["fail_on"] is not None:  # the runner keeps these for failed legs
            step["failure_lines"], step["tail"] = fresh["failure_lines"], fresh["tail"]
            step.pop("child_exit", None)
            if fresh["child_exit"] is not None:
                step["child_exit"] = fresh["child_exit"]
            step.pop("exception", None)
            if fresh["exception"] is not None:
                step["exception"] = fresh["exception"]
    return notes


def recheck(
    spec: Spec,
    saved: Mapping[str, Any],
    run_dir: Path,
    *,
    replay: bool,
    spec_label: str,
    note: Callable[[str], None] = lambda text: None,
    store: bool = True,
) -> Recheck:
    """Judge a saved run with the spec's CURRENT checks (and, for a replay, its current output
    rules), and store the results beside the evidence (`store=False`: only judge, as `engine
    review` does in a checkout). Refused when a step changed since the run; SpecErrors/UsageError
    when the spec cannot be planned as the run was. `note` hears what does not stop the re-check (a
    secret-only difference, a missing raw log, an unwritable run dir)."""
    mismatch = spec_mismatch(spec, saved, spec_label, run_dir)
    if mismatch:
        raise Refused(mismatch)
    plan = replan(spec, saved)
    # Whatever a saved run holds (a raw log may hold anything) is shown and stored through the
    # secret filter of this spec and this machine's environment, as a live run's output is.
    record = Record.open(run_dir, plan, os.environ, note)
    tell = record.say
    values = _values_if_unchanged(saved, plan, run_dir, replay, tell)
    doc = {k: v for k, v in saved.items() if k not in ("checks", "verdict")}
    if values:
        # No step reads them (the steps are unchanged), so only checks do: re-evaluate with the
        # spec's values, and say so, value by value.
        tell("checks read the spec's current values, not the run's:")
        for text in value_change_lines(values):
            tell("  " + text)
        doc["values"] = redact(plan.values, plan.secret_names)
        doc["sources"] = dict(plan.sources)
    if replay:
        for text in reharvest_steps(doc, plan, run_dir):
            tell(text)
    doc, corrected = derive_statuses(plan.steps, doc)
    for text in corrected:
        tell(text)
    results, verdict = judge(plan, doc)
    doc, results, verdict = record.mask(doc), record.mask(results), record.mask(verdict)
    kind = "replay" if replay else "check"
    # What every report says first: this is a re-check, when, of which spec, with which values moved
    # (set here whatever the saved document holds under that name).
    doc["rechecked"] = {
        "kind": kind,
        "at": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "spec": spec_label,
        "revision": spec_revision(spec),
        "values_changed": [
            {"name": n, **({"run": a} if a is not _ABSENT else {}), **({"spec": b} if b is not _ABSENT else {})}
            for n, a, b in values
        ],
    }
    if store:
        _store(record, kind, spec_label, results, verdict, doc, values, corrected)
    return Recheck(doc, results, verdict)


def _values_if_unchanged(
    saved: Mapping[str, Any], plan: Plan, run_dir: Path, replay: bool, tell: Callable[[str], None]
) -> list[tuple[str, Any, Any]]:
    """The values that changed since the run (only checks read them); Refused when the steps changed, or
    their output rules for a check (a replay re-harvests with the new ones)."""
    changes, notes = step_changes(saved, plan)
    for text in notes:
        tell(text)
    values = value_changes(saved, plan)
    if not changes and not replay:
        outputs = output_changes(saved, plan)
        if outputs:
            raise Refused(
                f"refusing to re-check {run_dir}: the output rules changed since the run, "
                "so its harvest is not what they would give (`engine replay` re-harvests "
                "the saved logs with them).\n" + "\n".join(outputs)
            )
    if changes:
        hint = (
            " (`engine replay` accepts changed output rules and checks, nothing else)"
            if replay
            else " (`engine check` accepts changed checks; `engine replay` also changed output rules)"
        )
        why = ["values changed since the run:"] + ["  " + t for t in value_change_lines(values)] if values else []
        raise Refused(
            f"refusing to re-check {run_dir}: the spec's steps changed since the run"
            f"{hint}; run it again instead.\n" + "\n".join(changes + why)
        )
    return values


def _store(
    record: Record,
    kind: str,
    spec_label: str,
    results: list[CheckResult],
    verdict: Verdict,
    doc: Mapping[str, Any],
    values: list[tuple[str, Any, Any]],
    corrected: list[str],
) -> None:
    """The `<kind>-<stamp>.json` record of a re-check, beside the evidence, through the saved run's
    record; a run dir that cannot be written to costs a note, never the answer."""
    stored = {"kind": kind, "spec": spec_label, "at": run_stamp(), "checks": results, "verdict": verdict}
    stored["spec_revision"] = doc["rechecked"]["revision"]
    if values:
        stored["values_changed"] = [{"name": n, "run": a, "spec": b} for n, a, b in values]
    if corrected:
        stored["status_corrected"] = corrected
    if kind == "replay":
        stored["steps"] = doc.get("steps")
    try:
        record.write(kind, stored)
    except (OSError, RecordError) as exc:
        record.say(f"could not write the {kind} record in {record.run_dir}: {getattr(exc, 'strerror', None) or exc}")


def spec_revision(spec: Spec) -> dict[str, Any]:
    """Which spec judged: `{"git": commit, "dirty": bool, ...}` when the spec file is in a git work tree
    (`dirty`: it or a file it extends or includes differs from that commit), else the spec file's
    sha256 alone; both with `path` and `sha256` of the spec file, and `files` (each file's sha256)."""
    where = Path(spec.path).resolve().parent
    found = {"path": display_path(spec.path), "sha256": spec.sha256, "files": dict(spec.files)}
    head = run_git(["rev-parse", "--verify", "-q", "HEAD"], where)
    status = run_git(["status", "--porcelain", "--", *(str(Path(f).resolve()) for f in spec.files)], where)
    if not head or not head.strip() or status is None:
        return found
    return {"git": head.strip(), "dirty": bool(status.strip()), **found}
