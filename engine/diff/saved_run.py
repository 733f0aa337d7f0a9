"""A saved run against the diff: every check the change touches evaluated on it, old (with the old
spec's values) and new (with the new spec's) side by side, how each moved, and plainly where a
changed leg means the run cannot answer."""

from __future__ import annotations

import re
from dataclasses import dataclass
from dataclasses import field as dc_field
from typing import Any, Mapping

from engine.diff.compare import field_diffs
from engine.diff.coverage import narrowed
from engine.diff.model import ABSENT, EXPR_FIELDS, Change, CheckReview, EvidenceReview, Report, Side
from engine.diff.phrases import display_field, fmt
from engine.diff.strictness import LOOSENED, UNCHANGED, UNKNOWN, reads, shift
from engine.expr import functions
from engine.judge.checks import evaluate
from engine.spec.plan import replan, step_definition
from engine.spec.values import PER_RUN_BUILTINS, refs
from engine.text import argv_delta

# Fields of a step that only bound how long it may take: a run that finished within both the old and
# the new limit did exactly what it would have done under the new one.
_TIME_FIELDS = ("run.timeout_s", "run.grace_s")
# Parts of a step's evidence produced by its output rules (what `engine replay` re-derives).
_HARVESTED = ("harvest", "harvest_errors", "failure_lines", "progress", "lines", "tail")


def run_label(ev: Mapping[str, Any]) -> str:
    started = str(ev.get("started_at") or "")
    stamp = started[:16] if re.match(r"\d{4}-\d\d-\d\dT\d\d:\d\d", started) else (started or "?")
    return f"run {stamp} ({ev.get('mode', '?')})"


def replan_quietly(spec: Any, ev: Mapping[str, Any], memo: dict | None = None) -> Any | None:
    """The plan the saved run would have had under `spec` (its mode, overrides and builtins), or None
    when it has none there. `memo` keeps the plans of one review: both sides of an unchanged spec, and
    its re-check, are one plan."""
    if spec is None:
        return None
    key = (id(spec), id(ev))
    if memo is not None and key in memo:
        return memo[key]
    try:
        # No environment: a secret the reviewer's shell holds must not reach a diff or a PR comment.
        plan = replan(spec, ev, environ={})
    except Exception:  # mode missing on this side, an override it lacks: no plan
        plan = None
    if memo is not None:
        memo[key] = plan
    return plan


def _step_delta(fname: str, old: Any, new: Any) -> str:
    """One changed step field, as a phrase."""
    shown = display_field(fname)
    if fname.endswith("argv") and isinstance(old, list) and isinstance(new, list):
        return f"argv {argv_delta(old, new)}"
    if fname == "enabled":
        return "now runs in this mode" if new else "now skipped in this mode"
    return f"{shown} {fmt(old)} -> {fmt(new)}"


@dataclass
class StepStates:
    """What the saved run can still say about each step of the new plan."""

    blocking: dict[str, str]  # step -> why the run no longer describes it
    harvest: dict[str, str]  # step -> its output rules changed (its harvest is stale)
    notes: list[str]  # changes that do not matter to what ran (time limits it stayed within)
    removed: dict[str, list[str]] = dc_field(default_factory=dict)  # ran, now gone -> steps after it


def _step_states(old_run: Any, new_run: Any, ev: Mapping[str, Any], old_plan: Any, new_plan: Any) -> StepStates:
    """Compare every step of the new plan with what ran.

    With the run's own context (`*_run`: plans rebuilt with its builtins and overrides) the saved
    fingerprints say exactly whether a step ran as the new spec defines it, and whether the old spec
    is what ran. Without it, the two spec sides (fixed builtins) are compared instead."""
    ev_steps = ev.get("steps") or {}
    in_context = new_run is not None
    ev_fp: Mapping[str, str] = (ev.get("fingerprints") or {}) if in_context else {}
    current, before_plan = (new_run, old_run) if in_context else (new_plan, old_plan)
    ran = {s["name"]: s for s in (before_plan.steps if before_plan else [])}
    old_side = {s["name"]: s for s in (old_plan.steps if old_plan else [])}
    new_side = {s["name"]: s for s in new_plan.steps}
    states = StepStates({}, {}, [])
    for step in current.steps:
        name = step["name"]
        fp_run = ev_fp.get(name)
        did_run = (ev_steps.get(name) or {}).get("status") not in (None, "skipped", "not_run")
        if not step.get("enabled", True) and not did_run:
            continue  # skipped in this mode by the new spec and not run then either: nothing differs
        if name not in ev_steps and fp_run is None:
            states.blocking[name] = f"leg `{name}` is new: the run has no record of it"
            continue
        before = ran.get(name)
        if before is not None and fp_run is not None and before_plan.fingerprints.get(name) != fp_run:
            before = None  # the old side's definition is not what ran either
        if fp_run is not None and fp_run == current.fingerprints.get(name):
            pass  # the run ran exactly the new definition
        elif before is None:
            states.blocking[name] = (
                f"leg `{name}` as it ran matches neither side of this diff "
                f"(the evidence was made with another version of the spec)"
            )
            continue
        else:
            deltas = field_diffs(step_definition(before), step_definition(step))
            if deltas:
                blocks, message = _leg_change(name, deltas, ev_steps.get(name) or {})
                if blocks:
                    states.blocking[name] = message
                else:
                    states.notes.append(message)
        # Output rules are not in the fingerprint: compare the spec sides for them.
        if name in old_side and name in new_side:
            a = (old_side[name].get("run") or {}).get("output")
            b = (new_side[name].get("run") or {}).get("output")
            if a != b:
                fields = ", ".join(
                    display_field("run." + f) for f, _, _ in field_diffs({"output": a or {}}, {"output": b or {}})
                )
                states.harvest[name] = (
                    f"leg `{name}`'s output rules changed ({fields}): the saved harvest was made with "
                    f"the old rules (`engine replay` re-harvests the raw log)"
                )
    # A leg that ran and is gone changes everything after it (a wipe that no longer happens).
    names = {s["name"] for s in current.steps}
    order = list(ev_steps)
    for name, rec in ev_steps.items():
        if (
            name not in names
            and rec.get("kind", "run") in ("run", "remove")
            and rec.get("status") not in (None, "skipped", "not_run")
        ):
            states.removed[name] = order[order.index(name) + 1 :]
    return states


def _leg_change(name: str, deltas: list[tuple[str, Any, Any]], ran: Mapping[str, Any]) -> tuple[bool, str]:
    """(blocks, message) for a leg that changed since the run. Only time limits changed and the leg
    finished inside the new ones: it did exactly what it would do under the new spec, so it does not
    block (a shorter timeout it would have hit does)."""
    phrase = "; ".join(_step_delta(f, a, b) for f, a, b in deltas)
    if all(f in _TIME_FIELDS for f, _, _ in deltas):
        new_timeout = {f: b for f, _, b in deltas}.get("run.timeout_s")
        seconds = ran.get("seconds")
        finished = ran.get("status") == "ok" and not ran.get("timed_out")
        if (
            finished
            and isinstance(seconds, (int, float))
            and (new_timeout is None or (isinstance(new_timeout, (int, float)) and seconds < new_timeout))
        ):
            return False, f"leg `{name}` changed only its time limits ({phrase}); it finished in {seconds:g} s"
    return True, f"leg `{name}` changed since the run ({phrase})"


def _ran_values(ev: Mapping[str, Any], plan: Any) -> dict[str, Any]:
    """A side's values as the run would have had them: the plan's (rebuilt with the run's overrides and
    builtins where it could be), the run's own builtins where it could not."""
    values = dict(plan.values)
    ran = ev.get("values") or {}
    for name in PER_RUN_BUILTINS:
        if name in ran:
            values[name] = ran[name]
    return values


# Said after a leg's change when the check reads what ran after that leg, not the leg itself.
UPSTREAM = ", and it ran before what this check reads"


def _touched(changes: list[Change]) -> dict[str, str]:
    """Check -> what happened to it in this mode, for every check whose outcome the change can move."""
    out: dict[str, str] = {}
    for c in changes:
        if c.section != "checks":
            continue
        if c.op in ("added", "removed", "disabled", "enabled"):
            out[c.subject] = c.op
        elif c.op == "changed" and (c.field in EXPR_FIELDS or c.field.startswith("let.")):
            out.setdefault(c.subject, "changed")
    return out


@dataclass
class _Legs:
    """The new plan's legs against the saved run: which of them stand between a check and an answer."""

    order: list[str]  # the new plan's steps, in order
    changing: set[str]  # steps that change what runs after them (run, remove)
    moved: set[str]  # legs the two spec sides define differently in this mode
    states: StepStates

    @classmethod
    def of(cls, old_plan: Any, new_plan: Any, states: StepStates) -> _Legs:
        order = [s["name"] for s in new_plan.steps]
        old_fp = old_plan.fingerprints if old_plan else {}
        return cls(
            order,
            {s["name"] for s in new_plan.steps if s["kind"] in ("run", "remove")},
            {n for n in order if old_fp.get(n) != new_plan.fingerprints.get(n)},
            states,
        )

    def _last_read(self, read_steps: list[str]) -> int:
        return max((self.order.index(s) for s in read_steps if s in self.order), default=-1)

    def blockers(self, check: Mapping[str, Any]) -> list[str]:
        """Why the run cannot answer for `check`: a changed leg it reads or reads after, stale harvest."""
        harvest, blocking = self.states.harvest, self.states.blocking
        paths = reads(check)
        read_steps = [p[1] for p in paths if p[0] in ("steps", "state") and len(p) > 1]
        out = [
            harvest[p[1]]
            for p in paths
            if p[0] == "steps" and len(p) > 1 and p[1] in harvest and (len(p) < 3 or p[2] in _HARVESTED)
        ]
        # A leg's results depend on every run/remove step before it (leg 2 resumes from leg 1's store).
        # Said once: a changed leg the check reads makes an upstream change beside the point.
        before = self.order[: self._last_read(read_steps) + 1]
        direct = [blocking[s] for s in before if s in blocking and s in read_steps]
        upstream = [
            f"{blocking[s]}{UPSTREAM}" for s in before if s in blocking and s not in read_steps and s in self.changing
        ]
        gone = [
            f"leg `{r}` ran before what this check reads and is gone from the new spec"
            for r, after in self.states.removed.items()
            if any(s in after for s in read_steps)
        ]
        return list(dict.fromkeys(out + (direct or upstream) + gone))

    def reads_moved(self, check: Mapping[str, Any]) -> bool:
        """The check reads (or reads after) a leg the two sides define differently: the spec on both sides
        judges it, not how the old check fares on a run of the new legs."""
        read_steps = [p[1] for p in reads(check) if p[0] in ("steps", "state") and len(p) > 1]
        before = self.order[: self._last_read(read_steps) + 1]
        return any(s in self.moved and (s in read_steps or s in self.changing) for s in before)


def review_evidence(
    report: Report, old: Side, new: Side, run_dir: str, ev: Mapping[str, Any], memo: dict | None = None
) -> EvidenceReview:
    """Evaluate on a saved run every check the change touches, the OLD definition with the old spec's
    values and the NEW one with the new spec's, and say how each moved (tightened, loosened, unchanged
    on this run, cannot tell); say plainly where a changed leg means the run cannot answer."""
    mode = str(ev.get("mode"))
    notes: list[str] = []
    spec_name = (ev.get("spec") or {}).get("name")
    if spec_name and spec_name != report.name:
        notes.append(f"the run is of spec `{spec_name}`, not `{report.name}`")
    if mode not in new.plans:
        notes.append(f"the run's mode `{mode}` is not in the new spec: nothing to compare")
        return EvidenceReview(run_dir, run_label(ev), mode, notes, [])
    old_plan, new_plan = old.plans.get(mode), new.plans[mode]
    memo = {} if memo is None else memo
    old_run, new_run = replan_quietly(old.spec, ev, memo), replan_quietly(new.spec, ev, memo)
    if new_run is None:
        notes.append(
            "could not rebuild the new spec's plan with the run's overrides; "
            "legs and values are compared between the two spec sides instead"
        )
    states = _step_states(old_run, new_run, ev, old_plan, new_plan)
    notes += states.notes
    legs = _Legs.of(old_plan, new_plan, states)
    # Each side judged with its own values: a threshold that lives in `values:` moves the bound, not
    # the run, so the run answers for both.
    values = (
        _ran_values(ev, old_run or old_plan) if (old_run or old_plan) else {},
        _ran_values(ev, new_run or new_plan),
    )
    by_old = {c["name"]: c for c in (old_plan.checks if old_plan else [])}
    by_new = {c["name"]: c for c in new_plan.checks}
    touched = _touched(report.raw_modes.get(mode, []))
    touched.update(_moved_by_values(by_old, by_new, values, touched))
    reviews: list[CheckReview] = []
    for name, status in touched.items():
        before, now = by_old.get(name), by_new.get(name)
        shown, side = (before, old) if status in ("removed", "disabled") else (now, new)
        reviews.append(
            CheckReview(
                name,
                status,
                legs.blockers(now or before),
                where=side.shown(_where(shown)),
                why=" ".join(str(shown.get("why") or "").split()),
            )
        )
    static = next((md.shifts for md in report.modes if md.mode == mode), {})
    _judge(reviews, ev, (by_old, by_new), values, legs, static)
    # Unchanged checks whose legs this change touches: the run cannot vouch for them either.
    for name, check in by_new.items():
        if name in touched:
            continue
        reasons = legs.blockers(check)
        if reasons:
            reviews.append(CheckReview(name, "affected", reasons, where=new.shown(_where(check))))
    return EvidenceReview(run_dir, run_label(ev), mode, notes, reviews)


def _moved_by_values(by_old: dict, by_new: dict, values: tuple[dict, dict], touched: dict[str, str]) -> dict[str, str]:
    """Unchanged checks that read a value the change moved: their bound moved though they did not."""
    values_old, values_new = values
    moved_values = {
        k
        for k in set(values_old) | set(values_new)
        if k not in PER_RUN_BUILTINS and values_old.get(k, ABSENT) != values_new.get(k, ABSENT)
    }
    return {
        name: "moved"
        for name, check in by_new.items()
        if name in by_old
        and name not in touched
        and any(p[0] == "values" and len(p) > 1 and p[1] in moved_values for p in reads(check))
    }


def _judge(
    reviews: list[CheckReview],
    ev: Mapping[str, Any],
    checks: tuple[dict, dict],
    values: tuple[dict, dict],
    legs: _Legs,
    static: Mapping[str, Any],
) -> None:
    """Evaluate each side's checks on the run with that side's values, and say how each moved.

    One evaluation per side (the document is indexed once). A check the run cannot answer for is
    evaluated too: its outcome means nothing, but the run's numbers place its bounds
    (`mul(final_loss, 0.25)` -> `mul(final_loss, 0.5)` is a loosening only given a loss)."""
    (by_old, by_new), (values_old, values_new) = checks, values
    bounds_only = {r.name for r in reviews if r.blockers and r.status in ("changed", "moved")}
    olds = [r.name for r in reviews if r.status != "added" and (not r.blockers or r.name in bounds_only)]
    news = [r.name for r in reviews if r.status != "removed" and (not r.blockers or r.name in bounds_only)]
    old_results, new_results = _evaluated(olds, by_old, ev, values_old), _evaluated(news, by_new, ev, values_new)
    for r in reviews:
        if not r.blockers:
            r.old, r.new = old_results.get(r.name), new_results.get(r.name)
        if r.status in ("changed", "moved") and r.name in old_results and r.name in new_results:
            settle = not r.blockers and not legs.reads_moved(by_new[r.name])
            r.shift = shift(
                by_old[r.name],
                by_new[r.name],
                values_old,
                values_new,
                old_results[r.name],
                new_results[r.name],
                settle=settle,
            )
            fewer = narrowed(by_old[r.name], by_new[r.name], {**ev, "values": values_old}, {**ev, "values": values_new})
            if fewer is not None:
                _say_fewer(r.shift, fewer)
        elif r.blockers and r.name in static:
            r.shift = static[r.name]  # what the spec's own values say, with no run to confirm it


def _say_fewer(s: Any, fewer: str) -> None:
    """A check that reads less of the run says so first; unchanged bounds do not make it the same check."""
    if s.verdict == UNCHANGED:
        s.verdict, s.why = UNKNOWN, f"{fewer}; {s.why}"
    elif s.verdict == UNKNOWN:
        s.why = f"{fewer}; {s.why}"
    elif s.verdict == LOOSENED:
        s.why = f"{s.why}; {fewer}"
    s.retarget = False


def _evaluated(names: list[str], checks: dict, ev: Mapping[str, Any], values: dict) -> dict[str, Any]:
    return dict(zip(names, evaluate([checks[n] for n in names], {**ev, "values": values}, functions.OPTIONS)))


def _where(check: Mapping[str, Any] | None) -> str:
    return f"{check['file']}:{check['line']}" if check and check.get("file") else ""


# ---------------------------------------------------------------- time limits against what the run took

# A new limit under this many times what the saved run took is noted as tight (not risky): a run a
# little slower than the saved one (another machine, a busier Hub) would be stopped.
TIGHT = 1.5


@dataclass
class TimeCut:
    """A leg timeout this change set below (or close to) what the saved run's leg took."""

    subject: str  # the leg
    seconds: float  # what the saved run's leg took
    old: float | None  # the timeout the run had under the old spec (None: unknown)
    new: float  # under the new spec
    value: str | None  # the value the limit is written as (`${t_leg1}` -> `t_leg1`)
    where: str  # file:line of the change: the value's when it is templated from one
    mode: str

    @property
    def below(self) -> bool:
        """The saved run, as it ran, would have been stopped by the new limit."""
        return self.new < self.seconds


def _limit(plan: Any, leg: str) -> float | None:
    for step in plan.steps if plan is not None else []:
        if step["name"] == leg and step["kind"] == "run":
            return step["run"]["timeout_s"]
    return None


def _finished(rec: Mapping[str, Any]) -> float | None:
    """The seconds a leg of the saved run took, when it ran to its end (not stopped by its timeout)."""
    seconds = rec.get("seconds")
    if rec.get("kind", "run") != "run" or rec.get("rc") is None or rec.get("timed_out"):
        return None
    return float(seconds) if isinstance(seconds, (int, float)) and not isinstance(seconds, bool) else None


def _timeout_where(report: Report, new: Side, mode: str, leg: str) -> tuple[str | None, str]:
    """(the value a leg's timeout is written as, the file:line of the change): the value's line when the
    value moved, else the step field's."""
    changes = report.raw_modes.get(mode, [])
    index = next((i for i, s in enumerate(new.data.get("steps") or []) if s.get("name") == leg), None)
    raw = ((new.data.get("steps") or [])[index].get("run") or {}).get("timeout_s") if index is not None else None
    names = refs(raw) if isinstance(raw, str) else []
    value = names[0] if len(names) == 1 and raw.strip() == f"${{{names[0]}}}" else None
    for c in changes:
        if value is not None and c.section == "values" and c.subject == value and c.where:
            return value, c.where
    for c in changes:
        if c.section == "steps" and c.subject == leg and c.field == "run.timeout_s" and c.where:
            return value, c.where
    return value, new.place(("steps", index, "run", "timeout_s")) if index is not None else ""


def time_cuts(report: Report, old: Side, new: Side, ev: Mapping[str, Any], memo: dict | None = None) -> list[TimeCut]:
    """Every leg timeout this change moved below TIGHT times what the saved run's leg took, in the run's
    mode, each side planned as the run was (its overrides)."""
    mode = str(ev.get("mode"))
    if mode not in new.plans:
        return []
    old_plan = replan_quietly(old.spec, ev, memo) or old.plans.get(mode)
    new_plan = replan_quietly(new.spec, ev, memo) or new.plans[mode]
    out: list[TimeCut] = []
    for leg, rec in (ev.get("steps") or {}).items():
        seconds = _finished(rec) if isinstance(rec, Mapping) else None
        before, after = _limit(old_plan, leg), _limit(new_plan, leg)
        if seconds is None or after is None or after == before or after >= TIGHT * seconds:
            continue
        value, where = _timeout_where(report, new, mode, leg)
        out.append(TimeCut(leg, seconds, before, after, value, where, mode))
    # `budget_s` needs no rule of its own: `engine validate` holds it above every leg's timeout plus
    # grace, so a budget under what the run took comes with a timeout under it, said above.
    return out
