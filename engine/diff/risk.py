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

from engine.diff.model import ABSENT, Change, ModeDiff, Report, env_text
from engine.diff.operands import short
from engine.diff.phrases import display_field, fmt
from engine.diff.strictness import LOOSENED, NUMBERS, RUN, SPEC, UNKNOWN, Shift
from engine.spec.plan import PROGRESS_DISPLAY
from engine.text import argv_delta, code, compact, scalar_list

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
    "gate asks for another value": "no saved run shows a run giving the new value: a wrong one passes every run "
    "that matches it (another geometry, another step)",
    "gate skipped in some modes": "runs in those modes pass this gate unchecked",
    "harvest rule loosened": "a leg's output that used to fail the run now passes it, as a note at most",
    "value made overridable": "whoever runs the spec can now set it from the environment, and with it what the "
    "gates that read it accept, with no change to the spec for a reviewer to see",
    "spec turned into a fragment": "a file reviewed and re-checked as a spec of its own is now only read through "
    "another one: its own gates are no longer judged, and the other may disable them",
    "saved run rewritten": "a saved run's account of itself (what it ran, with which spec) was edited without "
    "running it again: the re-check reads it from the base revision instead",
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
    # The targets it is seen under beyond the spec's default one ({"target": "gpu"}), and whether it is
    # seen under the default one too.
    targets: list[dict[str, str]] = dc_field(default_factory=list)
    on_default: bool = True
    default_env: dict[str, str] = dc_field(default_factory=dict)  # what the default target is (`target: local`)

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
    env: dict[str, str] = dc_field(default_factory=dict)  # the target an environment variable set for it
    rewritten: list[str] = dc_field(default_factory=list)  # keys the change edited of the base's run (trust.py)


def _gate(check: Any) -> bool:
    return isinstance(check, Mapping) and (check.get("severity") or "gate") == "gate"


def _check_changes(
    mode: str, changes: Iterable[Change], spec: str, gates: set[str], false_in: Mapping[str, str]
) -> list[Risk]:
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
            if c.subject in false_in:
                what += f", false in {false_in[c.subject]}: it is skipped there"
            out.append(Risk("gate given a when", spec, c.subject, what, c.where, [mode]))
    return out


def _shift_risk(name: str, s: Shift, run_label: str | None) -> tuple[str, str] | None:
    """(kind, what) of a changed gate's shift, or None when it asks no less."""
    if s.pins:  # what it compares is a constant now: that, not which way a bound moved, is the news
        return "gate pinned to a constant", f"gate {code(name)}: {'; '.join(s.pins)}"
    if s.verdict == LOOSENED and s.basis == SPEC:
        return "gate loosened", f"gate {code(name)} loosened {_spec_moves(s, LOOSENED)}"
    if s.verdict == LOOSENED:
        on = f" on {run_label}" if s.basis == RUN else f" (with the numbers of {run_label})"
        numbers = "; ".join(_move_text(m, s) for m in s.moves) or s.why
        return "gate loosened", f"gate {code(name)} loosened{on}: {numbers}"
    if s.verdict == UNKNOWN and s.retarget and s.basis == SPEC:
        # An exact value asked for elsewhere, and no run of this mode and target shows one giving it.
        return "gate asks for another value", f"gate {code(name)} asks for {_spec_moves(s, UNKNOWN)}"
    if s.verdict == UNKNOWN and not s.retarget:
        return "gate rewritten", f"gate {code(name)} changed and it cannot be told whether it asks less: {s.why}"
    return None


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
        found = _shift_risk(name, s, run_label) if name in gates and name not in flagged else None
        if found is None:
            continue
        kind, what = found
        at = (pinned_at.get(name) if kind == "gate pinned to a constant" else None) or where.get(name, "")
        out.append(Risk(kind, spec, name, what, at, [mode], rank=[RUN, NUMBERS, SPEC].index(s.basis)))
    return out


def _spec_moves(s: Shift, direction: str) -> str:
    """The moves of a shift known from the spec's values alone, said in the spec's terms: `loss_ceiling
    10.7 -> 12 by the spec's values: ...` (the values that moved the bound), `0 -> 1 by the spec's
    values: `values.tol` -> `1.0`` (the bound itself), else the comparisons before and after."""
    moves = [m for m in s.moves if m.direction == direction and (direction != UNKNOWN or m.retarget)]
    parts = []
    for m in moves or s.moves:
        old, new = m.old.operand(m.bound), m.new.operand(m.bound)
        if m.values:
            moved = ", ".join(f"{code(n)} {_shown(a)} -> {_shown(b)}" for n, a, b in m.values)
            parts.append(f"{moved} by the spec's values: {code(short(m.new.text, 80))}")
        elif m.bound is not None and old.known and new.known:
            parts.append(f"{old.value} -> {new.value} by the spec's values: {code(old.text)} -> {code(new.text)}")
        else:
            parts.append(f"by the spec's values: {m.old.phrase()} -> {m.new.phrase()}")
    return "; ".join(parts) or f"by the spec's values: {s.why}"


def _shown(v: Any) -> str:
    """A spec value as the spec writes it (`12.0`, `-0.5`): the reader finds it so in the YAML."""
    return compact(v, 60) if v is not ABSENT else "(none)"


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


# A harvest rule's options that judge what it found, and the value each one loosens to, in words.
_HARVEST_LOOSER = {
    "on_conflict": ("pick", "two different {what} lines no longer fail the run"),
    "on_malformed": ("skip", "a {what} line that is not JSON no longer fails the run"),
}


def _harvest_risks(mode: str, changes: Iterable[Change], spec: str) -> list[Risk]:
    """A harvest rule that let its leg's output fail the run and now does not: one risk per rule and
    option, with every leg it is written for."""
    legs: dict[tuple[str, str, str], list[Change]] = {}
    for c in changes:
        parts = c.field.split(".")
        if c.section != "steps" or c.op != "changed" or parts[:3] != ["run", "output", "harvest"] or len(parts) != 5:
            continue
        looser = _HARVEST_LOOSER.get(parts[4])
        if looser and c.new == looser[0] and c.old in (None, ABSENT, "fail"):
            legs.setdefault((parts[3], parts[4], c.new), []).append(c)
    out = []
    for (rule, option, value), cs in legs.items():
        marker = str((cs[0].extra.get("rule") or {}).get("marker") or "").strip()
        what = code(marker) if marker else f"`{rule}`"
        names = ", ".join(code(c.subject) for c in cs)
        said = _HARVEST_LOOSER[option][1].format(what=what)
        text = f"harvest rule `{rule}` of {names}: {option} fail -> {value}: {said}"
        out.append(Risk("harvest rule loosened", spec, rule, text, cs[0].where, [mode]))
    return out


def _step_risks(mode: str, changes: Iterable[Change], spec: str) -> tuple[list[Risk], list[Change]]:
    """(exit-code and harvest risks, the step changes that change what a leg does: not only its time
    limits)."""
    changes = list(changes)
    out: list[Risk] = _harvest_risks(mode, changes, spec)
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
    false_in: Mapping[str, str] | None = None,
) -> list[Risk]:
    """Every risky change of one spec. `gates_by_mode`: ModeDiff.key -> the names of its gate checks in the
    NEW spec; `where_by_mode`: ModeDiff.key -> check -> file:line; `never`: gate -> (why, where) for each
    gate this change left with a `when` false in every mode; `false_in`: gate -> the modes (and targets)
    where its new `when` is false (`mode smoke`)."""
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
    leg_changes: dict[str, tuple[ModeDiff, list[Change]]] = {}
    for md in report.modes:
        if md.status == "removed":
            on = f" on {env_text(md.env)}" if md.env else ""
            risks.append(
                Risk(
                    "gate removed",
                    spec,
                    md.key,
                    f"mode {code(md.mode)}{on} removed: its gates no longer run in it",
                    "",
                    [md.mode],
                    targets=[md.env] if md.env else [],
                    on_default=not md.env,
                )
            )
        elif md.status == "both":
            gates, where = gates_by_mode.get(md.key, set()), where_by_mode.get(md.key, {})
            found, legs = _mode_risks(md, report, spec, gates, where, never or {}, false_in or {})
            for r in found if md.env else []:
                r.targets, r.on_default = [md.env], False
            risks += found
            if legs:
                leg_changes[md.key] = (md, legs)
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
    false_in: Mapping[str, str],
) -> tuple[list[Risk], list[Change]]:
    """The risks of one mode both sides have (under one target), and its leg changes (judged later, with
    every mode's)."""
    changes = report.raw_modes.get(md.key, [])
    # A gate that never runs is said as that, not as the `when` it was given.
    found = [r for r in _check_changes(md.mode, changes, spec, gates, false_in) if r.subject not in never]
    found += [
        Risk("gate never runs", spec, n, f"gate {code(n)}: {w}", at, [md.mode])
        for n, (w, at) in never.items()
        if n in gates and not md.env  # said of every target already
    ]
    risks = list(found)
    flagged = {r.subject for r in found if r.kind in ("gate demoted", "gate disabled", "gate never runs")}
    shifts = dict(md.shifts)
    if report.evidence is not None and report.evidence.mode == md.mode and not md.env:
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


def _leg_risks(leg_changes: Mapping[str, tuple[ModeDiff, list[Change]]], spec: str, saved: SavedRun) -> list[Risk]:
    """Legs changed: fine only when a run of the new legs was committed with the change (a run of its
    own target: a local run says nothing of the legs another target runs)."""
    if saved.mode is not None and saved.renewed and not saved.refused:
        leg_changes = {k: v for k, v in leg_changes.items() if v[0].env and v[0].env != saved.env}
        if not leg_changes:
            return []  # a new run of the new legs was committed, and the re-check accepts it
        because = f"{saved.label} is a run of another target"
    elif saved.mode is None:
        because = f"no saved run under {saved.label}/"
    elif saved.refused:
        steps = [line.split(":")[0].removeprefix("step ") for line in saved.refused if line.startswith("step ")]
        because = (
            f"{saved.label} is a run of other legs ({', '.join(code(s) for s in steps)} differ: "
            f"`engine check` refuses it)"
            if steps
            else f"`engine check` refuses {saved.label}: {saved.refused[0]}"
        )
    else:
        because = f"{saved.label} was not renewed in this change"
    # Said for one mode (the saved run's where it is one of them): values make each mode's argv differ.
    keys = sorted(leg_changes)
    shown_key = saved.mode if saved.mode in leg_changes else keys[0]
    phrases = list(dict.fromkeys(_leg_phrase(c) for c in leg_changes[shown_key][1]))
    shown = ", ".join(phrases[:6]) + (f" and {len(phrases) - 6} more" if len(phrases) > 6 else "")
    where = next((c.where for _, cs in leg_changes.values() for c in cs if c.where), "")
    others = f" (and in {', '.join(k for k in keys if k != shown_key)})" if len(keys) > 1 else ""
    mds = [md for md, _ in leg_changes.values()]
    risk = Risk(
        "legs changed",
        spec,
        "legs",
        f"legs changed in {shown_key}: {shown}{others}; {because}",
        where,
        sorted({md.mode for md in mds}),
        targets=[md.env for md in mds if md.env],
        on_default=any(not md.env for md in mds),
    )
    return [risk]


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
    if saved.rewritten:
        out.append(
            Risk(
                "saved run rewritten",
                spec,
                saved.label,
                f"{saved.label} is still the base's run ({saved.run_label}), with its "
                f"{', '.join(code(k) for k in saved.rewritten)} edited in this change: read as the base has it",
                "",
                [saved.mode] if saved.mode else [],
            )
        )
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
            out[key] = Risk(r.kind, r.spec, r.subject, r.what, r.where, list(r.modes), r.rank, list(r.targets))
            out[key].on_default = r.on_default
            continue
        kept = out[key]
        kept.modes = sorted(set(kept.modes) | set(r.modes))
        kept.targets += [e for e in r.targets if e not in kept.targets]
        kept.on_default = kept.on_default or r.on_default
        if r.rank < kept.rank:
            kept.what, kept.rank = r.what, r.rank
    return list(out.values())
