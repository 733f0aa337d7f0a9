"""Rendering a diff: text for a terminal or Markdown for a PR comment, from one set of calls."""

from __future__ import annotations

import json
import re
from typing import Any, Mapping

from engine.diff.model import (
    ABSENT,
    EXPR_FIELDS,
    Budget,
    Change,
    CheckReview,
    EvidenceReview,
    Report,
    env_text,
    envs_text,
)
from engine.diff.phrases import display_field, expr_delta, fmt, prose_delta
from engine.diff.saved_run import UPSTREAM
from engine.diff.strictness import NUMBERS, RUN, SPEC, UNCHANGED, UNKNOWN, Move, Shift, num
from engine.expr.trace import MISSING, NOT_EVALUATED
from engine.text import argv_delta, code, printable, scalar_list, words

# A plain path (`steps.leg2.harvest.run_json.final_step`): the explain entries worth quoting.
_PATH = re.compile(r'[A-Za-z_]\w*(\.(?:[A-Za-z_]\w*|"[^"]*")|\[\d+\])*')


def _operands(result: Mapping[str, Any], limit: int = 4) -> str:
    """`resumed_from_step = 120, stop1 = 120`: the values a check compared, each under the shortest
    suffix of its path that is unique among them."""
    pairs = [(t, v) for t, v in result.get("explain") or [] if _PATH.fullmatch(t) and v != NOT_EVALUATED]
    pairs = list(dict.fromkeys(pairs))
    names = [t.split(".") for t, _ in pairs]
    shown = []
    for (_, value), parts in zip(pairs, names):
        n = 1
        while n < len(parts) and sum(1 for p in names if p[-n:] == parts[-n:]) > 1:
            n += 1
        shown.append(f"{'.'.join(parts[-n:])} = {'missing' if value == MISSING else value}")
    more = f", ... ({len(shown) - limit} more)" if len(shown) > limit else ""
    return ", ".join(shown[:limit]) + more


def _outcome_phrase(result: Mapping[str, Any], where: str = "") -> str:
    """`PASS on run X (soak): a = 1` / `NO_DATA on run X: no data: ... is missing`."""
    head = result["outcome"] + (f" on {where}" if where else "")
    if result["outcome"] in ("NO_DATA", "SKIPPED", "ERROR", "DISABLED"):
        return f"{head}: {result.get('reason')}"
    operands = _operands(result)
    return f"{head}: {operands}" if operands else head


# Text marks and Markdown words for each kind of line.
_MARKS = {
    "added": ("+", "**added**"),
    "removed": ("-", "**removed**"),
    "changed": ("~", "**changed**"),
    "reordered": ("~", "**reordered**"),
    "renamed": ("~", ""),
    "blocked": ("!", "**not comparable**"),
    "note": ("*", "**note**"),
    "plain": ("*", ""),
}


class Out:
    """Lines in text (for a terminal) or Markdown (for a PR comment), with one set of calls."""

    def __init__(self, markdown: bool):
        self.md = markdown
        self.lines: list[str] = []

    def code(self, value: Any) -> str:
        """A name, expression or value: a code span in Markdown (fenced past any backtick inside)."""
        text = fmt(value)
        return code(text) if self.md else text

    def at(self, where: str) -> str:
        """Where a change comes from, after its line: `  (specs/lib/p4_common.yaml:120)`."""
        if not where:
            return ""
        return f" ({self.code(where)})" if self.md else f"  ({where})"

    def blank(self) -> None:
        if self.lines and self.lines[-1] != "":
            self.lines.append("")

    def head(self, text: str) -> None:
        self.blank()
        self.lines.append(f"### {text}" if self.md else f"{text}:")
        if self.md:
            self.lines.append("")

    def section(self, text: str) -> None:
        if self.md:
            self.blank()
            self.lines += [f"**{text}**", ""]
        else:
            self.lines.append(f"  {text}:")

    def item(self, kind: str, text: str) -> None:
        mark, word = _MARKS[kind]
        if self.md:
            self.lines.append(f"- {word} {text}" if word else f"- {text}")
        else:
            self.lines.append(f"    {mark} {text}")

    def sub(self, label: str, text: str) -> None:
        self.lines.append(f"  - {label}: {text}" if self.md else f"        {label}: {text}")

    def delta(self, text: str) -> None:
        """A changed expression or sentence as its changed tokens, `[-old-]{+new+}`, on a line of its own."""
        self.lines.append(f"  - {code(text)}" if self.md else f"        {text}")

    def before_after(self, old: Any, new: Any) -> None:
        """A changed expression or sentence: old and new on lines of their own."""
        a, b = _fmt_def(old), _fmt_def(new)
        if self.md:
            self.lines += ["  ```diff", f"  - {a}", f"  + {b}", "  ```"]
        else:
            self.lines += [f"        - {a}", f"        + {b}"]


def _fmt_def(v: Any) -> str:
    if v is ABSENT or v is None:
        return "(none)"
    return words(v) if isinstance(v, str) else json.dumps(v, sort_keys=True)


def _render_change(out: Out, c: Change) -> None:
    at = out.at(c.where)
    if c.op == "renamed":
        out.item(c.op, f"{rename_phrase(c, out.code)}{at}")
    elif c.section == "spec":
        note = f" ({c.extra['note']})" if c.extra.get("note") else ""
        if c.subject.startswith("values.") or c.subject == "description":
            out.item(c.op, f"{out.code(c.subject)}{note}{at}:")
            out.before_after(c.old, c.new)
        else:
            out.item(c.op, f"{out.code(c.subject)}: {out.code(c.old)} -> {out.code(c.new)}{at}")
    elif c.section == "values":
        if c.op == "added":
            out.item(c.op, f"{out.code(c.subject)} = {out.code(c.new)}{at}")
        elif c.op == "removed":
            out.item(c.op, f"{out.code(c.subject)} (was {out.code(c.old)}){at}")
        elif c.old == c.new:  # they differ only in a secret's text, which is never shown
            out.item(c.op, f"{out.code(c.subject)}: changed (in a secret, not shown){at}")
        elif scalar_list(c.old) and scalar_list(c.new):  # argument lists: which tokens moved
            out.item(c.op, f"{out.code(c.subject)}: {argv_delta(c.old, c.new, out.code)}{at}")
        else:
            out.item(c.op, f"{out.code(c.subject)}: {out.code(c.old)} -> {out.code(c.new)}{at}")
    elif c.section == "steps":
        _render_step_change(out, c, at)
    elif c.section == "checks":
        _render_check_change(out, c, at)


def rename_phrase(c: Change, shown: Any = code) -> str:
    """`renamed leg3 -> leg_last (with wipe_before_leg3, hub_after_leg3), in every step, value and check ...`."""
    if c.section == "checks":
        return f"renamed check {shown(c.old)} -> {shown(c.new)} (it checks exactly what it did)"
    others = [old for old, _ in c.extra.get("with") or []]
    with_ = f" (with {', '.join(shown(o) for o in others)})" if others else ""
    return f"renamed {shown(c.old)} -> {shown(c.new)}{with_}, in every step, value and check that names it"


def _render_step_change(out: Out, c: Change, at: str) -> None:
    name = out.code(c.subject)
    if c.op == "reordered":
        out.item(c.op, f"order: {', '.join(c.old)} -> {', '.join(c.new)}{at}")
        return
    if c.op in ("added", "removed"):
        s = c.new if c.op == "added" else c.old
        skipped = "" if s.get("enabled", True) else f" (skipped in this mode: when {out.code(s['when'])})"
        out.item(c.op, f"{name} [{s['kind']}]{skipped}{at}")
        if c.op == "removed":
            return
        if s["kind"] == "run":
            out.sub("argv", out.code(" ".join(str(a) for a in s["argv"])))
            out.sub("time", f"timeout {s['timeout_s']:g} s + grace {s['grace_s']:g} s")
        elif s["kind"] == "remove":
            out.sub("paths", out.code(", ".join(s["remove"])))
        else:
            out.sub("collect", out.code(json.dumps(s["collect"], sort_keys=True)))
        return
    label = display_field(c.field)
    if c.old == c.new:  # they differ only in a secret's text, which is never shown
        out.item(c.op, f"{name} {label}: changed (in a secret, not shown){at}")
    elif c.field == "when" and isinstance(c.old, str) and isinstance(c.new, str):
        out.item(c.op, f"{name} when{at}:")
        out.delta(expr_delta(c.old, c.new))
    elif c.field == "when":
        out.item(c.op, f"{name} when{at}:")
        out.before_after(c.old, c.new)
    elif c.field.endswith("argv") and isinstance(c.old, list) and isinstance(c.new, list):
        out.item(c.op, f"{name} argv: {argv_delta(c.old, c.new, out.code)}{at}")
    elif c.field == "enabled":
        out.item(c.op, f"{name}: {'now runs in this mode' if c.new else 'now skipped in this mode'}{at}")
    elif scalar_list(c.old) and scalar_list(c.new) and _only_added_removed(c.old, c.new):
        added = [x for x in c.new if x not in c.old]
        removed = [x for x in c.old if x not in c.new]
        # Quoted: list items like "CKPT " often end in a space that matters.
        parts = ([f"added {', '.join(out.code(json.dumps(x)) for x in added)}"] if added else []) + (
            [f"removed {', '.join(out.code(json.dumps(x)) for x in removed)}"] if removed else []
        )
        out.item(c.op, f"{name} {label}: {'; '.join(parts)}{at}")
    else:
        out.item(c.op, f"{name} {label}: {out.code(c.old)} -> {out.code(c.new)}{at}")


def _only_added_removed(a: list, b: list) -> bool:
    """Kept items in the same order, some added or removed: then listing those is the whole story."""
    kept_a = [x for x in a if x in b]
    kept_b = [x for x in b if x in a]
    return kept_a == kept_b and (len(kept_a) < len(a) or len(kept_b) < len(b))


def _severity(check: Any) -> str:
    return (check.get("severity") if isinstance(check, dict) else None) or "gate"


def _render_check_change(out: Out, c: Change, at: str) -> None:
    name = out.code(c.subject)
    if c.op == "added":
        f = c.new
        out.item(c.op, f"{name} [{_severity(f)}]{at}")
        out.sub("why", words(f.get("why", "")))
        out.sub("expr", out.code(f["expr"]))
        for key in (k for k in f if k.startswith("let.")):
            out.sub(key, out.code(f[key]))
        if f.get("when"):
            out.sub("when", out.code(f["when"]))
    elif c.op == "removed":  # what it guarded, so a reviewer can tell whether anything still does
        out.item(c.op, f"{name} [{_severity(c.old)}]{at}")
        out.sub("why", words(c.old.get("why", "")))
        out.sub("expr", out.code(c.old["expr"]))
    elif c.op == "disabled":  # a gate taken out is what a reviewer must not miss
        out.item("changed", f"{name}: now DISABLED: {words(c.new)}{at}")
        out.sub(f"it was a {_severity(c.old)} because", words(c.old.get("why", "")))
    elif c.op == "enabled":
        out.item("changed", f"{name}: enabled again (was DISABLED: {words(c.old)}){at}")
    elif c.field == "disabled":
        out.item(c.op, f"{name} DISABLED reason{at}:")
        out.delta(prose_delta(words(c.old), words(c.new)))
    elif (c.field in EXPR_FIELDS or c.field.startswith("let.")) and isinstance(c.old, str) and isinstance(c.new, str):
        out.item(c.op, f"{name} {c.field}{at}:")
        out.delta(expr_delta(c.old, c.new))
    elif c.field == "why" and isinstance(c.old, str) and isinstance(c.new, str):
        out.item(c.op, f"{name} why{at}:")
        out.delta(prose_delta(words(c.old), words(c.new)))
    elif c.field in EXPR_FIELDS or c.field.startswith("let.") or c.field == "why":
        out.item(c.op, f"{name} {c.field}{at}:")  # one side has none: show both whole
        out.before_after(c.old, c.new)
    else:
        out.item(c.op, f"{name} {c.field}: {out.code(c.old)} -> {out.code(c.new)}{at}")


_SECTIONS = ("values", "steps", "checks")


def _render_changes(out: Out, changes: list[Change]) -> None:
    for section in _SECTIONS:
        part = [c for c in changes if c.section == section]
        if part:
            out.section(section)
            for c in part:
                _render_change(out, c)


def _budget_line(b: Budget) -> str:
    """`worst case 610 s -> 645 s of budget_s 900 s, headroom 290 s -> 255 s`."""

    def moved(old: float | None, new: float | None, unit: str = " s") -> str:
        shown = [("none" if v is None else f"{v:g}{unit}") for v in (old, new)]
        return shown[1] if old == new else f"{shown[0]} -> {shown[1]}"

    def headroom(budget: float | None, worst: float) -> float | None:
        return None if budget is None else budget - worst

    if b.old_budget is None and b.old_worst == 0.0:  # an added mode: only its own numbers
        b = Budget(b.new_budget, b.new_worst, b.new_budget, b.new_worst)
    elif b.new_budget is None and b.new_worst == 0.0:  # a removed mode
        b = Budget(b.old_budget, b.old_worst, b.old_budget, b.old_worst)
    line = f"worst case {moved(b.old_worst, b.new_worst)} of budget_s {moved(b.old_budget, b.new_budget)}"
    left_old, left_new = headroom(b.old_budget, b.old_worst), headroom(b.new_budget, b.new_worst)
    if left_new is not None:
        line += f", headroom {moved(left_old, left_new)}"
        if left_new < 0:
            line += f" (OVER BUDGET by {-left_new:g} s)"
    return line


def summary(report: Report) -> str:
    """One line: what kind of things changed, counted by distinct name."""
    # An added/removed mode's own values are part of that mode, counted as the mode.
    changes = report.common + report.env_common + [c for m in report.modes if m.status == "both" for c in m.changes]
    parts = []
    for status in ("added", "removed"):
        modes = [m.key for m in report.modes if m.status == status]
        if modes:
            parts.append(f"mode {status}: {', '.join(modes)}")
    for section in ("checks", "steps", "values"):
        ops: dict[str, set[str]] = {}
        for c in changes:
            if c.section == section:
                ops.setdefault(c.op, set()).add(c.subject or "order")
        if ops:
            parts.append(f"{section}: " + ", ".join(f"{len(v)} {k}" for k, v in sorted(ops.items())))
    renamed = [c for c in report.spec_changes if c.op == "renamed"]
    if renamed:
        parts.insert(0, "renamed " + ", ".join(f"{c.old} -> {c.new}" for c in renamed))
    if len(report.spec_changes) > len(renamed):
        parts.append(f"spec: {len(report.spec_changes) - len(renamed)} changed")
    over = [
        m.mode
        for m in report.modes
        if m.budget and m.budget.new_budget is not None and m.budget.new_worst > m.budget.new_budget
    ]
    if over:
        parts.append(f"OVER BUDGET in {', '.join(over)}")
    return "; ".join(parts) if parts else "no semantic change"


def _title(report: Report) -> tuple[str, str]:
    """(old label, new label), a spec new or deleted since the base said in words."""
    if report.status == "new":
        return f"new spec (no {report.old_label})", report.new_label
    return report.old_label, report.new_label


def _env_common_head(report: Report) -> str:
    """`every mode (smoke, soak) on target gpu, real`: what is the same under every other target."""
    mds = [md for md in report.modes if md.key in report.env_common_keys]
    modes = list(dict.fromkeys(md.mode for md in mds))
    which = f"every mode ({', '.join(modes)})" if len(modes) > 1 else f"mode {modes[0]}"
    return f"{which} on {envs_text([md.env for md in mds])}"


def render(report: Report, markdown: bool = False) -> str:
    """The whole diff as text (terminal) or Markdown (PR comment / job summary)."""
    out = Out(markdown)
    lines_of(out, report)
    # A spec's text with a bidirectional override would read otherwise to the reviewer: escaped.
    return printable("\n".join(out.lines).rstrip() + "\n")


def lines_of(out: Out, report: Report, level: int = 2) -> None:
    """The diff into `out`; Markdown headings at `level` (a review nests each spec's diff one deeper)."""
    verdict = summary(report)
    if report.status != "both":
        verdict = f"{'new spec' if report.status == 'new' else 'spec deleted'}; {verdict}"
    old_label, new_label = _title(report)
    if out.md:
        out.lines += [
            f"{'#' * level} Spec diff {out.code(report.name)}",
            "",
            f"{out.code(old_label)} -> {out.code(new_label)}",
            "",
            f"**{verdict}**" if report.changed else "No semantic change.",
        ]
    else:
        out.lines += [f"engine diff {report.name}: {old_label} -> {new_label}", verdict]
    if report.spec_changes:
        out.head("spec")
        for c in report.spec_changes:
            _render_change(out, c)
    if report.common:
        out.head(f"every mode ({', '.join(report.common_modes)})")
        _render_changes(out, report.common)
    if report.env_common:
        out.head(_env_common_head(report))
        _render_changes(out, report.env_common)
    unchanged = []
    for md in report.modes:
        if md.status == "both" and not md.env and not report.raw_modes.get(md.mode) and md.budget is None:
            unchanged.append(md.mode)
            continue
        if md.status == "both" and not md.changes and md.budget is None:
            continue  # everything it had is in "every mode"
        out.head(
            {"both": f"mode {md.key}", "added": f"mode {md.key} (added)", "removed": f"mode {md.key} (removed)"}[
                md.status
            ]
        )
        _render_changes(out, md.changes)
        if md.budget is not None:
            if out.md:
                out.blank()
            out.lines.append(
                f"**budget**: {_budget_line(md.budget)}" if out.md else f"  budget: {_budget_line(md.budget)}"
            )
    if unchanged and report.changed:
        out.blank()
        under = f" on {env_text(report.default_env)}" if any(md.env for md in report.modes) else ""
        out.lines.append(f"unchanged modes{under}: {', '.join(unchanged)}")
    if report.evidence is not None:
        _render_evidence(out, report.evidence)


# ---------------------------------------------------------------- a saved run: numbers

# What a verdict's numbers come from, as a label before them.
BASIS = {RUN: "on this run", NUMBERS: "with this run's numbers", SPEC: "by the spec's values"}


def _margin(bound: Any) -> str:
    m = bound.margin()
    return "" if m is None else f" (margin {num(m)})"


def verdict_phrase(s: Shift) -> str:
    """`loosened`, `unchanged on this run`, `cannot tell: ...`: how a check moved, in words."""
    if s.verdict == UNKNOWN:
        return f"cannot tell: {s.why}"
    if s.verdict == UNCHANGED:
        return ("unchanged on this run" if s.on_run else "unchanged") + (f" ({s.why})" if s.why else "")
    return s.verdict if s.moves else f"{s.verdict}: {s.why}"


def move_line(m: Move, old_outcome: str | None, new_outcome: str | None) -> str:
    """`13.2 <= 13.6 PASS (margin 0.4) -> 13.2 <= 20 PASS (margin 6.8)`."""

    def side(bound: Any, outcome: str | None) -> str:
        return f"{bound.phrase()}{' ' + outcome if outcome else ''}{_margin(bound)}"

    tail = f": cannot tell: {m.why}" if m.direction == UNKNOWN and m.why else ""
    return f"{side(m.old, old_outcome)} -> {side(m.new, new_outcome)}{tail}"


def _shift_lines(out: Out, s: Shift, old: Any = None, new: Any = None) -> None:
    """The numbers behind a verdict: each moved comparison before -> after, with the outcomes."""
    if len(s.moves) == 1:
        out.sub(BASIS[s.basis], move_line(s.moves[0], s.old_outcome, s.new_outcome))
    else:
        for m in s.moves:
            out.sub("bound", move_line(m, None, None))
        if s.on_run or old is not None:
            out.sub("old", _outcome_phrase(old) if old else "(not evaluated)")
            out.sub("new", _outcome_phrase(new) if new else "(not evaluated)")


_WHAT = {
    "added": "new check",
    "changed": "changed check",
    "moved": "check (unchanged; reads a changed value)",
    "removed": "removed check",
    "disabled": "disabled check",
    "enabled": "re-enabled check",
    "affected": "unchanged check",
}


def _named(out: Out, r: CheckReview) -> str:
    """`changed check x`, `check x (unchanged; reads a changed value)`."""
    if r.status == "moved":
        return f"check {out.code(r.name)} (unchanged; reads a changed value)"
    return f"{_WHAT[r.status]} {out.code(r.name)}"


def _render_review(out: Out, r: CheckReview, label: str) -> None:
    name, at = out.code(r.name), out.at(r.where)
    if r.status == "added":
        out.item("plain" if out.md else "added", f"new check {name} would {_outcome_phrase(r.new, label)}{at}")
        return
    if r.status in ("removed", "disabled"):
        gone = "no longer checked" if r.status == "removed" else "DISABLED now"
        out.item(
            "plain" if out.md else "removed",
            f"{_WHAT[r.status]} {name} ({gone}) was {_outcome_phrase(r.old, label)}{at}",
        )
        if r.why:
            out.sub("why", r.why)
        return
    if r.status == "enabled":
        out.item("plain" if out.md else "added", f"re-enabled check {name} would {_outcome_phrase(r.new, label)}{at}")
        return
    s = r.shift
    head = f"{_named(out, r)} on {label}: {verdict_phrase(s) if s else 'evaluated'}{at}"
    out.item("plain" if out.md else "changed", head)
    if s is not None and s.moves:
        _shift_lines(out, s, r.old, r.new)
    else:
        out.sub("old", _outcome_phrase(r.old) if r.old else "(not evaluated)")
        out.sub("new", _outcome_phrase(r.new) if r.new else "(not evaluated)")


def _render_evidence(out: Out, ev: EvidenceReview) -> None:
    out.head(f"evidence: {ev.label}, {ev.run_dir}")
    for note in ev.notes:
        out.item("note", note)
    if not ev.checks:
        out.item("plain", "no check this change touches to evaluate on this run")
    for r in ev.checks:
        if not r.blockers:
            _render_review(out, r, ev.label)
    # One reason (a changed leg) voids many checks: each reason said once, then the checks' names.
    blocked = [r for r in ev.checks if r.blockers]
    if len(blocked) == 1:
        r = blocked[0]
        out.item("blocked", f"{_named(out, r)}: this run cannot say how it fares, because")
        for b in r.blockers:
            out.lines.append(f"  - {b}" if out.md else f"        - {b}")
    elif blocked:
        names = ", ".join(out.code(r.name) + _GROUP_LABEL[r.status] for r in blocked)
        out.item("blocked", f"{len(blocked)} checks this run cannot say how they fare ({names}), because")
        voids: dict[str, int] = {}
        for r in blocked:
            for b in dict.fromkeys(b.removesuffix(UPSTREAM) for b in r.blockers):
                voids[b] = voids.get(b, 0) + 1
        for b, n in voids.items():
            verb = "reads" if n == 1 else "read"
            share = "" if n == len(blocked) else f" ({n} of them {verb} it or what ran after it)"
            out.lines.append(f"  - {b}{share}" if out.md else f"        - {b}{share}")
    for r in blocked:  # which way the bounds of the changed ones moved, all the same
        s = r.shift
        if s is not None and s.verdict != UNCHANGED and not s.retarget:
            label = "with the run's numbers (not its outcome)" if s.basis == NUMBERS else "by the spec's values"
            out.sub(f"{r.name}, {label}", verdict_phrase(s))
            for m in s.moves:
                if m.direction != UNCHANGED:
                    out.sub("bound", move_line(m, None, None))


_GROUP_LABEL = {
    "added": " (new)",
    "changed": " (changed)",
    "moved": " (reads a changed value)",
    "removed": " (removed)",
    "disabled": " (disabled)",
    "enabled": " (re-enabled)",
    "affected": "",
}
