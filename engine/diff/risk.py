"""Which changes of a spec can let a bad run pass: the risk classes `engine review` asks a human to
approve, each with why it is risky.

A change is risky when it can turn a failing run into a passing one without anyone looking: a gate
removed, disabled, demoted to a warning or given a new `when:` (or one false in every mode); a gate
whose bound moved the lenient way (or moved so that neither the spec nor the saved run can tell which
way), or that no longer reads the run (a `let:` pinned to a constant); legs changed with no real run
showing the new legs pass; a larger time budget; a leg timeout below what the saved run's leg took;
wider accepted exit codes; a saved run that now fails, that was removed, or that the re-check refuses.
Everything else (a check added, a bound tightened, a reworded `why`, reformatted YAML) is safe. The
classification is pure: the facts about the saved run come in as `SavedRun`.
"""

from __future__ import annotations

from dataclasses import dataclass
from dataclasses import field as dc_field
from typing import Any, Iterable, Mapping

from engine.diff.model import ABSENT, Change, ModeDiff, Report
from engine.diff.phrases import display_field, fmt
from engine.diff.strictness import LOOSENED, NUMBERS, RUN, SPEC, UNKNOWN, Shift
from engine.spec.plan import PROGRESS_DISPLAY
from engine.text import argv_delta, code, scalar_list

# kind -> why a change of that kind needs a human's approval.
WHY_RISKY: dict[str, str] = {
    "gate removed": "a gate that no longer exists can no longer fail a run",
    "gate disabled": "a DISABLED gate never fails a run, whatever the run does",
    "gate demoted": "a warning is reported but does not fail the run",
    "gate given a when": "runs where the `when` is false pass this gate unchecked",
    "gate loosened": "a looser gate passes runs the old one failed",
    "gate rewritten": "the gate may ask less, and neither the spec's values nor the saved run can tell",
    "legs changed": "no real run shows that the changed legs still pass the spec's checks",
    "budget raised": "a larger budget lets a slower (stuck, regressed) run finish inside it",
    "exit codes widened": "an exit code that used to fail the leg now passes it",
    "saved run fails": "the last real run fails the new spec: merged, the next run is expected to fail "
    "too, or the saved evidence no longer stands for the spec",
    "evidence removed": "without a saved run, nothing re-checks the spec's gates on real data",
    "saved run refused": "a saved run that `engine check` refuses re-checks nothing: the spec's gates are "
    "not seen on real data",
    "gate pinned to a constant": "a value pinned to a constant is the same on every run: the gate no longer "
    "looks at what the run did",
    "gate never runs": "a gate whose `when` is false in every mode is SKIPPED on every run: it can fail none",
    "time limit under the saved run": "the saved run could no longer pass as it ran: the new limit stops it "
    "before it ends, so no real run shows that the spec's legs fit in it",
}
# Step fields that only bound how long a leg may take (the budget answers for those).
_TIME_FIELDS = ("run.timeout_s", "run.grace_s")


@dataclass
class Risk:
    kind: str  # a key of WHY_RISKY
    spec: str  # the spec's path
    subject: str  # the check, leg, key or mode concerned ("" for the spec as a whole)
    what: str  # the change in a line, with its numbers
    where: str = ""  # file:line it comes from
    modes: list[str] = dc_field(default_factory=list)
    # How well `what` is known, when one change is seen in several modes: 0 on a saved run, 1 with a
    # saved run's numbers, 2 from the spec's values alone. The best-known one is said.
    rank: int = 2

    @property
    def why(self) -> str:
        return WHY_RISKY[self.kind]


@dataclass
class SavedRun:
    """What is known of a spec's saved run (`evidence/<spec>/`) on both sides of the change."""

    label: str  # `evidence/p4_soak`
    mode: str | None = None  # the run's mode (None: no saved run at the head)
    at_base: bool = False  # a saved run existed at the base
    renewed: bool = False  # the saved run changed in this change (a new run committed)
    refused: list[str] = dc_field(default_factory=list)  # why it does not describe the new spec's legs
    failing: list[str] | None = None  # gates/legs failing on it under the new spec (None: not judged)
    failing_at_base: list[str] | None = None  # ... under the base spec on the base's saved run
    # Time limits this change set below, or close to, what the saved run took (saved_run.TimeCut).
    cuts: list[Any] = dc_field(default_factory=list)
    run_label: str = ""  # `run <start, to the minute> (<mode>)`, as model.py labels a saved run


def _gate(check: Any) -> bool:
    return isinstance(check, Mapping) and (check.get("severity") or "gate") == "gate"


def _check_changes(mode: str, changes: Iterable[Change], spec: str, gates: set[str]) -> list[Risk]:
    out: list[Risk] = []
    for c in changes:
        if c.section != "checks":
            continue
        if c.op == "removed" and _gate(c.old):
            why = " ".join(str(c.old.get("why") or "").split())
            out.append(
                Risk(
                    "gate removed",
                    spec,
                    c.subject,
                    f"gate {code(c.subject)} removed" + (f" (it checked: {why})" if why else ""),
                    c.where,
                    [mode],
                )
            )
        elif c.op == "disabled" and _gate(c.old):
            out.append(
                Risk(
                    "gate disabled",
                    spec,
                    c.subject,
                    f"gate {code(c.subject)} DISABLED: {' '.join(str(c.new).split())}",
                    c.where,
                    [mode],
                )
            )
        elif c.op == "changed" and c.field == "severity" and (c.old or "gate") == "gate" and c.new != "gate":
            out.append(
                Risk("gate demoted", spec, c.subject, f"gate {code(c.subject)} demoted to {c.new}", c.where, [mode])
            )
        elif c.op == "changed" and c.field == "when" and c.new not in (None, ABSENT) and c.subject in gates:
            what = (
                f"gate {code(c.subject)} given `when: {c.new}`"
                if c.old in (None, ABSENT)
                else f"gate {code(c.subject)} `when` changed: {code(fmt(c.old))} -> {code(fmt(c.new))}"
            )
            out.append(Risk("gate given a when", spec, c.subject, what, c.where, [mode]))
    return out


def _shift_risks(
    mode: str,
    shifts: Mapping[str, Shift],
    gates: set[str],
    where: Mapping[str, str],
    flagged: set[str],
    spec: str,
    run_label: str | None,
    pinned_at: Mapping[str, str],
) -> list[Risk]:
    out: list[Risk] = []
    for name, s in shifts.items():
        if name not in gates or name in flagged:
            continue
        if s.pins:  # what it compares is a constant now: that, not which way a bound moved, is the news
            out.append(
                Risk(
                    "gate pinned to a constant",
                    spec,
                    name,
                    f"gate {code(name)}: {'; '.join(s.pins)}",
                    pinned_at.get(name) or where.get(name, ""),
                    [mode],
                    rank=[RUN, NUMBERS, SPEC].index(s.basis),
                )
            )
        elif s.verdict == LOOSENED:
            on = {
                RUN: f" on {run_label}",
                NUMBERS: f" (with the numbers of {run_label})",
                SPEC: " by the spec's values",
            }[s.basis]
            numbers = "; ".join(_move_text(m, s) for m in s.moves) or s.why
            out.append(
                Risk(
                    "gate loosened",
                    spec,
                    name,
                    f"gate {code(name)} loosened{on}: {numbers}",
                    where.get(name, ""),
                    [mode],
                    rank=[RUN, NUMBERS, SPEC].index(s.basis),
                )
            )
        elif s.verdict == UNKNOWN and not s.retarget:
            out.append(
                Risk(
                    "gate rewritten",
                    spec,
                    name,
                    f"gate {code(name)} changed and it cannot be told whether it asks less: {s.why}",
                    where.get(name, ""),
                    [mode],
                    rank=[RUN, NUMBERS, SPEC].index(s.basis),
                )
            )
    return out


def _pin_places(changes: Iterable[Change]) -> dict[str, str]:
    """Check -> where a pin is written: its changed `let:` line, else its changed expression's."""
    out: dict[str, str] = {}
    ordered = sorted(changes, key=lambda c: not c.field.startswith("let."))  # the lets first
    for c in ordered:
        if c.section == "checks" and c.where and (c.field.startswith("let.") or c.field == "expr"):
            out.setdefault(c.subject, c.where)
    return out


def _move_text(m: Any, s: Shift) -> str:
    def side(bound: Any, outcome: str | None) -> str:
        margin = bound.margin()
        shown = f" (margin {margin:.6g})" if margin is not None else ""
        return f"{bound.phrase()}{' ' + outcome if outcome else ''}{shown}"

    return f"{side(m.old, s.old_outcome)} -> {side(m.new, s.new_outcome)}"


def _step_risks(mode: str, changes: Iterable[Change], spec: str) -> tuple[list[Risk], list[Change]]:
    """(exit-code risks, the step changes that change what a leg does: not only its time limits)."""
    out: list[Risk] = []
    legs: list[Change] = []
    for c in changes:
        if c.section != "steps":
            continue
        if c.op == "changed" and c.field == "run.ok_exit_codes":
            old = set(c.old if isinstance(c.old, list) else [0])
            new = set(c.new if isinstance(c.new, list) else [0])
            if new - old:
                out.append(
                    Risk(
                        "exit codes widened",
                        spec,
                        c.subject,
                        f"leg {code(c.subject)} ok_exit_codes {fmt(sorted(old))} -> {fmt(sorted(new))}",
                        c.where,
                        [mode],
                    )
                )
        # What a leg does, not how long it may take (the budget's), which exits pass (said above)
        # or how its progress line reads (not in its fingerprint either).
        if not (c.op == "changed" and (c.field in (*_TIME_FIELDS, "run.ok_exit_codes") or _display(c.field))):
            legs.append(c)
    return out, legs


def _display(field: str) -> bool:
    return any(field == f"run.progress.{k}" or field.startswith(f"run.progress.{k}.") for k in PROGRESS_DISPLAY)


def _leg_phrase(c: Change) -> str:
    if c.op in ("added", "removed"):
        return f"{code(c.subject)} {c.op}"
    if c.op == "reordered":
        return "legs reordered"
    if c.field.endswith("argv") and scalar_list(c.old) and scalar_list(c.new):
        return f"{code(c.subject)} argv {argv_delta(c.old, c.new, code)}"
    return f"{code(c.subject)} {display_field(c.field)}"


def assess(
    report: Report,
    spec: str,
    saved: SavedRun,
    gates_by_mode: Mapping[str, set[str]],
    where_by_mode: Mapping[str, Mapping[str, str]],
    never: Mapping[str, tuple[str, str]] | None = None,
) -> list[Risk]:
    """Every risky change of one spec. `gates_by_mode`: mode -> the names of its gate checks in the NEW
    spec; `where_by_mode`: mode -> check -> file:line; `never`: gate -> (why, where) for each gate this change
    left with a `when` false in every mode."""
    if report.status == "new":  # a spec new since the base weakens nothing; its saved run may fail it
        return merge_modes(_saved_run_risks(spec, saved))
    if report.status == "deleted":
        gates = sorted({n for names in gates_by_mode.values() for n in names})
        return [
            Risk(
                "gate removed",
                spec,
                "",
                f"spec deleted: its {len(gates)} gate checks no longer "
                f"run ({', '.join(code(g) for g in gates[:8])}{', ...' if len(gates) > 8 else ''})",
                "",
                sorted(gates_by_mode),
            )
        ]
    risks: list[Risk] = []
    leg_changes: dict[str, list[Change]] = {}
    for md in report.modes:
        if md.status == "removed":
            risks.append(
                Risk(
                    "gate removed",
                    spec,
                    md.mode,
                    f"mode {code(md.mode)} removed: its gates no longer run in it",
                    "",
                    [md.mode],
                )
            )
        elif md.status == "both":
            gates, where = gates_by_mode.get(md.mode, set()), where_by_mode.get(md.mode, {})
            found, legs = _mode_risks(md, report, spec, gates, where, never or {})
            risks += found
            if legs:
                leg_changes[md.mode] = legs
    if leg_changes:
        risks += _leg_risks(leg_changes, spec, saved)
    elif saved.renewed and saved.refused:  # a new bundle committed that does not describe this spec
        risks.append(
            Risk(
                "saved run refused",
                spec,
                saved.label,
                f"{saved.label} (renewed in this change) is refused by `engine check`: {saved.refused[0]}",
                "",
                [saved.mode] if saved.mode else [],
            )
        )
    risks += _saved_run_risks(spec, saved)
    return merge_modes(risks)


def _mode_risks(
    md: ModeDiff,
    report: Report,
    spec: str,
    gates: set[str],
    where: Mapping[str, str],
    never: Mapping[str, tuple[str, str]],
) -> tuple[list[Risk], list[Change]]:
    """The risks of one mode both sides have, and its leg changes (judged later, with every mode's)."""
    changes = report.raw_modes.get(md.mode, [])
    # A gate that never runs is said as that, not as the `when` it was given.
    found = [r for r in _check_changes(md.mode, changes, spec, gates) if r.subject not in never]
    found += [
        Risk("gate never runs", spec, n, f"gate {code(n)}: {w}", at, [md.mode])
        for n, (w, at) in never.items()
        if n in gates
    ]
    risks = list(found)
    flagged = {r.subject for r in found if r.kind in ("gate demoted", "gate disabled", "gate never runs")}
    shifts = dict(md.shifts)
    if report.evidence is not None and report.evidence.mode == md.mode:
        # The saved run's verdict replaces the spec-only one for the checks it could answer.
        shifts.update({r.name: r.shift for r in report.evidence.checks if r.shift is not None})
    # A `when` risk says it already; the when's part of a shift is no second risk.
    when_only = {r.subject for r in found if r.kind == "gate given a when"} - {
        c.subject for c in changes if c.section == "checks" and (c.field == "expr" or c.field.startswith("let."))
    }
    run_label = report.evidence.label if report.evidence is not None else None
    risks += _shift_risks(
        md.mode,
        {k: v for k, v in shifts.items() if k not in when_only},
        gates,
        where,
        flagged,
        spec,
        run_label,
        _pin_places(changes),
    )
    exit_risks, legs = _step_risks(md.mode, changes, spec)
    risks += exit_risks
    risks += _budget_risks(md, report, spec)
    return risks, legs


def _budget_risks(md: ModeDiff, report: Report, spec: str) -> list[Risk]:
    """A budget raised (or removed) in this mode."""
    b = md.budget
    if b is None or b.old_budget is None or (b.new_budget is not None and b.new_budget <= b.old_budget):
        return []
    new = "none" if b.new_budget is None else f"{b.new_budget:g} s"
    where = next((c.where for c in report.spec_changes if c.subject == "budget_s"), "")
    return [Risk("budget raised", spec, "budget_s", f"budget_s {b.old_budget:g} s -> {new}", where, [md.mode])]


def _leg_risks(leg_changes: Mapping[str, list[Change]], spec: str, saved: SavedRun) -> list[Risk]:
    """Legs changed: fine only when a run of the new legs was committed with the change."""
    # Said for one mode (the saved run's where it is one of them): values make each mode's argv differ.
    shown_mode = saved.mode if saved.mode in leg_changes else sorted(leg_changes)[0]
    phrases = list(dict.fromkeys(_leg_phrase(c) for c in leg_changes[shown_mode]))
    shown = ", ".join(phrases[:6]) + (f" and {len(phrases) - 6} more" if len(phrases) > 6 else "")
    where = next((c.where for cs in leg_changes.values() for c in cs if c.where), "")
    modes = sorted(leg_changes)
    if saved.mode is None:
        because = f"no saved run under {saved.label}/"
    elif saved.refused:
        steps = [line.split(":")[0].removeprefix("step ") for line in saved.refused if line.startswith("step ")]
        because = (
            f"{saved.label} is a run of other legs ({', '.join(code(s) for s in steps)} differ: "
            f"`engine check` refuses it)"
            if steps
            else f"`engine check` refuses {saved.label}: {saved.refused[0]}"
        )
    elif not saved.renewed:
        because = f"{saved.label} was not renewed in this change"
    else:
        return []  # a new run of the new legs was committed, and the re-check accepts it
    others = f" (and in {', '.join(m for m in modes if m != shown_mode)})" if len(modes) > 1 else ""
    return [
        Risk("legs changed", spec, "legs", f"legs changed in {shown_mode}: {shown}{others}; {because}", where, modes)
    ]


def limit_phrase(cut: Any, saved: SavedRun) -> str:
    """`leg `leg1`'s timeout 1200 s -> 3 s (`t_leg1`), and the saved run's leg1 took 13.3 s (...)`."""
    old = "none" if cut.old is None else f"{cut.old:g} s"
    via = f" ({code(cut.value)})" if cut.value else ""
    return (
        f"leg {code(cut.subject)}'s timeout {old} -> {cut.new:g} s{via}, and the saved run's {cut.subject} "
        f"took {cut.seconds:.1f} s ({saved.run_label}, {saved.label})"
    )


def _saved_run_risks(spec: str, saved: SavedRun) -> list[Risk]:
    out: list[Risk] = [
        Risk("time limit under the saved run", spec, c.subject, limit_phrase(c, saved), c.where, [c.mode])
        for c in saved.cuts
        if c.below
    ]
    if saved.mode is None and saved.at_base:
        out.append(Risk("evidence removed", spec, saved.label, f"{saved.label} removed", ""))
    if saved.failing:
        before = set(saved.failing_at_base or [])
        new = [f for f in saved.failing if f not in before]
        if new:
            out.append(
                Risk(
                    "saved run fails",
                    spec,
                    saved.label,
                    f"{saved.label} ({saved.mode}) fails under the new spec: {', '.join(code(f) for f in new)}",
                    "",
                    [saved.mode] if saved.mode else [],
                )
            )
    return out


def merge_modes(risks: list[Risk]) -> list[Risk]:
    """The same risk in several modes (one change, seen per mode), listed once with its modes and
    said the best-known way (a saved run's numbers over the spec's values)."""
    out: dict[tuple, Risk] = {}
    for r in risks:
        key = (
            (r.kind, r.spec, r.subject, r.where)
            if r.kind in ("gate loosened", "gate rewritten", "gate pinned to a constant")
            else (r.kind, r.spec, r.subject, r.what, r.where)
        )
        if key not in out:
            out[key] = Risk(r.kind, r.spec, r.subject, r.what, r.where, list(r.modes), r.rank)
            continue
        kept = out[key]
        kept.modes = sorted(set(kept.modes) | set(r.modes))
        if r.rank < kept.rank:
            kept.what, kept.rank = r.what, r.rank
    return list(out.values())
