"""Rendering a diff: text for a terminal or Markdown for a PR comment, from one set of calls."""
from __future__ import annotations

import json
import re
from typing import Any, Mapping

from engine.checks import MISSING, NOT_EVALUATED
from engine.diff.model import ABSENT, EXPR_FIELDS, Budget, Change, EvidenceReview, Report
from engine.diff.text import argv_delta, display_field, fmt, scalar_list, words


# A plain path (`steps.leg2.harvest.run_json.final_step`): the explain entries worth quoting.
_PATH = re.compile(r'[A-Za-z_]\w*(\.(?:[A-Za-z_]\w*|"[^"]*")|\[\d+\])*')


def _operands(result: Mapping[str, Any], limit: int = 4) -> str:
    """`resumed_from_step = 120, stop1 = 120`: the values a check compared, each under the shortest
    suffix of its path that is unique among them."""
    pairs = [(t, v) for t, v in result.get("explain") or []
             if _PATH.fullmatch(t) and v != NOT_EVALUATED]
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
_MARKS = {"added": ("+", "**added**"), "removed": ("-", "**removed**"), "changed": ("~", "**changed**"),
          "reordered": ("~", "**reordered**"), "blocked": ("!", "**not comparable**"),
          "note": ("*", "**note**"), "plain": ("*", "")}


class _Out:
    """Lines in text (for a terminal) or Markdown (for a PR comment), with one set of calls."""

    def __init__(self, markdown: bool):
        self.md = markdown
        self.lines: list[str] = []

    def code(self, value: Any) -> str:
        """A name, expression or value: a code span in Markdown (fenced past any backtick inside)."""
        text = fmt(value)
        if not self.md:
            return text
        fence = "`" * (max((len(m) for m in re.findall(r"`+", text)), default=0) + 1)
        pad = " " if text.startswith("`") or text.endswith("`") else ""
        return f"{fence}{pad}{text}{pad}{fence}"

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


def _render_change(out: _Out, c: Change) -> None:
    if c.section == "spec":
        note = f" ({c.extra['note']})" if c.extra.get("note") else ""
        if c.subject.startswith("values.") or c.subject == "description":
            out.item(c.op, f"{out.code(c.subject)}{note}:")
            out.before_after(c.old, c.new)
        else:
            out.item(c.op, f"{out.code(c.subject)}: {out.code(c.old)} -> {out.code(c.new)}")
    elif c.section == "values":
        if c.op == "added":
            out.item(c.op, f"{out.code(c.subject)} = {out.code(c.new)}")
        elif c.op == "removed":
            out.item(c.op, f"{out.code(c.subject)} (was {out.code(c.old)})")
        elif c.old == c.new:  # they differ only in a secret's text, which is never shown
            out.item(c.op, f"{out.code(c.subject)}: changed (in a secret, not shown)")
        elif scalar_list(c.old) and scalar_list(c.new):  # argument lists: which tokens moved
            out.item(c.op, f"{out.code(c.subject)}: {argv_delta(c.old, c.new, out.code)}")
        else:
            out.item(c.op, f"{out.code(c.subject)}: {out.code(c.old)} -> {out.code(c.new)}")
    elif c.section == "steps":
        _render_step_change(out, c)
    elif c.section == "checks":
        _render_check_change(out, c)


def _render_step_change(out: _Out, c: Change) -> None:
    name = out.code(c.subject)
    if c.op == "reordered":
        out.item(c.op, f"order: {', '.join(c.old)} -> {', '.join(c.new)}")
        return
    if c.op in ("added", "removed"):
        s = c.new if c.op == "added" else c.old
        skipped = "" if s.get("enabled", True) else f" (skipped in this mode: when {out.code(s['when'])})"
        out.item(c.op, f"{name} [{s['kind']}]{skipped}")
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
        out.item(c.op, f"{name} {label}: changed (in a secret, not shown)")
    elif c.field == "when":
        out.item(c.op, f"{name} when:")
        out.before_after(c.old, c.new)
    elif c.field.endswith("argv") and isinstance(c.old, list) and isinstance(c.new, list):
        out.item(c.op, f"{name} argv: {argv_delta(c.old, c.new, out.code)}")
    elif c.field == "enabled":
        out.item(c.op, f"{name}: {'now runs in this mode' if c.new else 'now skipped in this mode'}")
    elif scalar_list(c.old) and scalar_list(c.new) and _only_added_removed(c.old, c.new):
        added = [x for x in c.new if x not in c.old]
        removed = [x for x in c.old if x not in c.new]
        # Quoted: list items like "CKPT " often end in a space that matters.
        parts = ([f"added {', '.join(out.code(json.dumps(x)) for x in added)}"] if added else []) + \
                ([f"removed {', '.join(out.code(json.dumps(x)) for x in removed)}"] if removed else [])
        out.item(c.op, f"{name} {label}: {'; '.join(parts)}")
    else:
        out.item(c.op, f"{name} {label}: {out.code(c.old)} -> {out.code(c.new)}")


def _only_added_removed(a: list, b: list) -> bool:
    """Kept items in the same order, some added or removed: then listing those is the whole story."""
    kept_a = [x for x in a if x in b]
    kept_b = [x for x in b if x in a]
    return kept_a == kept_b and (len(kept_a) < len(a) or len(kept_b) < len(b))


def _render_check_change(out: _Out, c: Change) -> None:
    name = out.code(c.subject)
    if c.op == "added":
        f = c.new
        out.item(c.op, f"{name} [{f.get('severity') or 'gate'}]")
        out.sub("why", words(f.get("why", "")))
        out.sub("expr", out.code(f["expr"]))
        for key in (k for k in f if k.startswith("let.")):
            out.sub(key, out.code(f[key]))
        if f.get("when"):
            out.sub("when", out.code(f["when"]))
    elif c.op == "removed":
        out.item(c.op, f"{name} [{c.old.get('severity') or 'gate'}]")
        out.sub("expr", out.code(c.old["expr"]))
    elif c.field == "disabled":  # a gate taken out (or put back) is what a reviewer must not miss
        if c.old is ABSENT or c.old is None:
            out.item(c.op, f"{name}: now DISABLED: {words(c.new)}")
        elif c.new is ABSENT or c.new is None:
            out.item(c.op, f"{name}: enabled again (was DISABLED: {words(c.old)})")
        else:
            out.item(c.op, f"{name} DISABLED reason:")
            out.before_after(c.old, c.new)
    elif c.field in EXPR_FIELDS or c.field == "why" or c.field.startswith("let."):
        out.item(c.op, f"{name} {c.field}:")
        out.before_after(c.old, c.new)
    else:
        out.item(c.op, f"{name} {c.field}: {out.code(c.old)} -> {out.code(c.new)}")


_SECTIONS = ("values", "steps", "checks")


def _render_changes(out: _Out, changes: list[Change]) -> None:
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
    changes = report.spec_changes + report.common + \
        [c for m in report.modes if m.status == "both" for c in m.changes]
    parts = []
    for status in ("added", "removed"):
        modes = [m.mode for m in report.modes if m.status == status]
        if modes:
            parts.append(f"mode {status}: {', '.join(modes)}")
    for section in ("checks", "steps", "values"):
        ops: dict[str, set[str]] = {}
        for c in changes:
            if c.section == section:
                ops.setdefault(c.op, set()).add(c.subject or "order")
        if ops:
            parts.append(f"{section}: " + ", ".join(f"{len(v)} {k}" for k, v in sorted(ops.items())))
    if report.spec_changes:
        parts.append(f"spec: {len(report.spec_changes)} changed")
    over = [m.mode for m in report.modes if m.budget and m.budget.new_budget is not None
            and m.budget.new_worst > m.budget.new_budget]
    if over:
        parts.append(f"OVER BUDGET in {', '.join(over)}")
    return "; ".join(parts) if parts else "no semantic change"


def render(report: Report, markdown: bool = False) -> str:
    """The whole diff as text (terminal) or Markdown (PR comment / job summary)."""
    out = _Out(markdown)
    verdict = summary(report)
    if markdown:
        out.lines += [f"## Spec diff {out.code(report.name)}", "",
                      f"{out.code(report.old_label)} -> {out.code(report.new_label)}", "",
                      f"**{verdict}**" if report.changed else "No semantic change."]
    else:
        out.lines += [f"engine diff {report.name}: {report.old_label} -> {report.new_label}", verdict]
    if report.spec_changes:
        out.head("spec")
        for c in report.spec_changes:
            _render_change(out, c)
    if report.common:
        out.head(f"every mode ({', '.join(report.common_modes)})")
        _render_changes(out, report.common)
    unchanged = []
    for md in report.modes:
        if md.status == "both" and not report.raw_modes.get(md.mode) and md.budget is None:
            unchanged.append(md.mode)
            continue
        if md.status == "both" and not md.changes and md.budget is None:
            continue  # everything it had is in "every mode"
        out.head({"both": f"mode {md.mode}", "added": f"mode {md.mode} (added)",
                  "removed": f"mode {md.mode} (removed)"}[md.status])
        _render_changes(out, md.changes)
        if md.budget is not None:
            if out.md:
                out.blank()
            out.lines.append(f"**budget**: {_budget_line(md.budget)}" if out.md
                             else f"  budget: {_budget_line(md.budget)}")
    if unchanged and report.changed:
        out.blank()
        out.lines.append(f"unchanged modes: {', '.join(unchanged)}")
    if report.evidence is not None:
        _render_evidence(out, report.evidence)
    return "\n".join(out.lines).rstrip() + "\n"


def _render_evidence(out: _Out, ev: EvidenceReview) -> None:
    out.head(f"evidence: {ev.label}, {ev.run_dir}")
    for note in ev.notes:
        out.item("note", note)
    if not ev.checks:
        out.item("plain", "no added or changed check to evaluate on this run")
    for r in ev.checks:
        name = out.code(r.name)
        what = {"added": "new check", "changed": "changed check", "affected": "unchanged check"}[r.status]
        if r.blockers:
            out.item("blocked", f"{what} {name}: this run cannot say how it fares, because")
            for b in r.blockers:
                out.lines.append(f"  - {b}" if out.md else f"        - {b}")
        elif r.status == "added":
            out.item("plain" if out.md else "added",
                     f"new check {name} would {_outcome_phrase(r.new, ev.label)}")
        else:
            same = r.old is not None and r.old["outcome"] == r.new["outcome"]
            out.item("plain" if out.md else "changed", f"changed check {name} on {ev.label}: "
                                f"{'same outcome' if same else 'outcome changes'}")
            out.sub("old", _outcome_phrase(r.old) if r.old else "(not evaluated)")
            out.sub("new", _outcome_phrase(r.new))
