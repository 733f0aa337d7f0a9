"""Rendering check results: the terminal table and VERDICT line, JUnit XML, and Markdown.

All three are pure functions of (evidence, results, verdict) so a re-check renders exactly what
the live run rendered; `write_file` is the one place a report reaches the disk. The VERDICT line is the one line a log scraper greps; its shape is fixed:
``VERDICT <spec> <OUTCOME> [<message: a precondition's, an ERROR's>] <failed names as JSON> seconds <N>``.
"""

from __future__ import annotations

import json
import os
import re
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any, Mapping, Sequence

from engine.run.said import exception_text, exit_text, printed_failure, warned_text
from engine.text import compact_pair, markdown_code, markdown_text, printable, unhidden, utc_second

# Characters XML 1.0 cannot carry at all, not even escaped: one control byte from a leg's output
# would make the whole JUnit file unparsable.
_NOT_XML = re.compile("[^\x09\x0a\x0d\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")

EXPLAIN_LINES = 8
_MARK = {
    "PASS": "ok",
    "FAIL": "FAIL",
    "NO_DATA": "NO_DATA",
    "SKIPPED": "skip",
    "ERROR": "ERROR",
    "DISABLED": "DISABLED",
}
_ICON = {
    "PASS": "✅",
    "FAIL": "❌",
    "NO_DATA": "❔",
    "SKIPPED": "⏭️",
    "ERROR": "💥",
    "DISABLED": "🚫",
    "PRECONDITION": "⛔",
    "INTERRUPTED": "✋",
}


def _spec_name(evidence: Mapping[str, Any]) -> str:
    return (evidence.get("spec") or {}).get("name") or "spec"


def _shown(result: Mapping[str, Any], width: int = 80) -> str:
    """The table's last column: the value on PASS/FAIL, the reason otherwise."""
    if result["outcome"] in ("PASS", "FAIL") and not result.get("missing"):
        text = json.dumps(result.get("value"), separators=(",", ":"), default=str)
        if result["outcome"] == "FAIL" and result.get("value") is not False:
            text = result.get("reason") or text
    else:
        text = result.get("reason") or ""
    return text if len(text) <= width else text[: width - 3] + "..."


def _where(result: Mapping[str, Any]) -> str:
    if result.get("file"):
        return f"{result['file']}:{result.get('line') or '?'}"
    return ""


def revision_text(revision: Mapping[str, Any]) -> str:
    """`git 49a2d45c1a2b`, `git 49a2d45c1a2b with uncommitted changes (spec sha256 ...)` or
    `sha256 ... (not in a git work tree)`: which spec a re-check used, said with what identifies it."""
    sha = str(revision.get("sha256") or "?")[:12]
    if revision.get("git"):
        commit = str(revision["git"])[:12]
        return (
            f"git {commit} with uncommitted changes (spec sha256 {sha})" if revision.get("dirty") else f"git {commit}"
        )
    return f"sha256 {sha} of {Path(str(revision.get('path') or '?')).name} (not in a git work tree)"


def value_change(item: Mapping[str, Any]) -> tuple[str, str]:
    """A changed value as (the run's, the spec's now), each cut around where they differ."""
    run, now = compact_pair(item.get("run"), item.get("spec"), 80)
    return ("no such value" if "run" not in item else run), ("no such value" if "spec" not in item else now)


def recheck_header(evidence: Mapping[str, Any]) -> str | None:
    """`re-checked at T against the spec at REV, N values changed (the run started S)`, or None when
    the evidence is a run's own, not a re-check of it."""
    info = evidence.get("rechecked")
    if not isinstance(info, Mapping):
        return None
    changed = info.get("values_changed") or []
    verb = "replayed (logs re-harvested) and re-checked" if info.get("kind") == "replay" else "re-checked"
    count = f"{len(changed)} value{'' if len(changed) == 1 else 's'} changed"
    started = str(evidence.get("started_at") or "")
    started = f" (the run started {started[:19]}Z)" if re.match(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d", started) else ""
    return (
        f"{verb} at {info.get('at')} against the spec at {revision_text(info.get('revision') or {})}, {count}{started}"
    )


def recheck_lines(evidence: Mapping[str, Any]) -> list[str]:
    """The header, then one `name: run 6.0 -> now 4.0` line per changed value; [] for a run's own report."""
    head = recheck_header(evidence)
    if head is None:
        return []
    changed = (evidence.get("rechecked") or {}).get("values_changed") or []
    return [head] + [f"  {item.get('name')}: run {' -> now '.join(value_change(item))}" for item in changed]


def verdict_line(name: str, verdict: Mapping[str, Any]) -> str:
    """``VERDICT p4_smoke FAIL ["leg1_pointer_at_stop"] seconds 812.4``."""
    parts = ["VERDICT", name, verdict["outcome"]]
    if verdict["outcome"] in ("PRECONDITION", "ERROR") and verdict.get("message"):
        parts.append(verdict["message"])
    parts += [json.dumps(verdict.get("failed", [])), "seconds", str(verdict.get("seconds", 0))]
    return " ".join(parts)


def reused_line(evidence: Mapping[str, Any], verdict: Mapping[str, Any]) -> str | None:
    """`resumed at leg2: fetch_mix, leg1, hub_after_leg1 reused from the run of 2026-...Z`, or None
    for a run that reused nothing (`engine run --from`)."""
    by_run: dict[str, list[str]] = {}
    for entry in verdict.get("reused") or []:
        by_run.setdefault(utc_second(entry.get("from")), []).append(str(entry.get("step")))
    if not by_run:
        return None
    resumed = evidence.get("resumed") if isinstance(evidence.get("resumed"), Mapping) else {}
    head = f"resumed at {resumed['from_step']}: " if isinstance(resumed.get("from_step"), str) else ""
    return head + "; ".join(f"{', '.join(names)} reused from the run of {when}" for when, names in by_run.items())


def _step_notes(step: Mapping[str, Any]) -> tuple[list[str], list[str]]:
    """What a step row says before and after its outcome: that it was reused, and the progress
    warning of a leg whose ETA passed its timeout."""
    before = [f"reused from the run of {utc_second(step.get('reused_from'))}"] if step.get("reused") is True else []
    ref = step.get("reference")
    if isinstance(ref, Mapping) and isinstance(ref.get("reused_from"), str):
        before.append(f"reused reference from {ref['reused_from']}")
    warning = step.get("progress_warning")
    after = [f"WARNING the ETA passed the timeout: {warning.get('message')}"] if isinstance(warning, Mapping) else []
    # A crashed leg's own last word, and the trainer's warnings (a leg that warned may still exit 0).
    after += [text for text in (exception_text(step), warned_text(step)) if text is not None]
    return before, after


def _step_rows(evidence: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    rows = []
    for name, step in (evidence.get("steps") or {}).items():
        before, after = _step_notes(step)
        detail = list(before)
        if step.get("rc") is not None:
            detail.append(f"rc {step['rc']}")
        if step.get("timed_out"):
            detail.append("timed out")
        if step.get("error"):
            detail.append(str(step["error"]))
        printed = printed_failure(step)
        if printed is not None:
            first = printed["lines"][0].get("line") if printed["lines"] else None
            detail.append(f"printed a failure line{f' (line {first})' if isinstance(first, int) else ''}")
        if step.get("seconds") is not None:
            detail.append(f"{step['seconds']} s")
        detail += after
        rows.append((f"step:{name}", str(step.get("status", "?")), ", ".join(detail)))
    return rows


def child_exits(evidence: Mapping[str, Any]) -> list[str]:
    """`leg1: the trainer exited 3: refused: ...`, one per failed step whose launcher's output said
    how its child failed (`output.child_exit`), or `leg1: exited 0 but printed a failure line: ...`
    (`output.fail_on`): what the report says first."""
    lines = []
    for name, step in (evidence.get("steps") or {}).items():
        said = exit_text(step) if isinstance(step, Mapping) else None
        if said is not None and step.get("status") in ("failed", "interrupted"):
            lines.append(f"{name}: {said}")
    return lines


def _harvest_rows(verdict: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    """One row per harvest problem: FAIL, or `note` where the spec opted in."""
    return [
        (
            f"harvest:{p['step']}.{p['harvest']}",
            "FAIL" if p.get("fails") else "note",
            f"{p.get('kind')}: {p.get('message')}",
        )
        for p in verdict.get("harvest") or []
    ]


def table(evidence: Mapping[str, Any], results: list[dict], verdict: Mapping[str, Any], verbose: bool = False) -> str:
    """The terminal summary: steps, harvest problems, checks, explain trees of failing checks,
    VERDICT last."""
    rows = (
        _step_rows(evidence)
        + _harvest_rows(verdict)
        + [
            (
                r["name"],
                _MARK[r["outcome"]] + (" (warn)" if r.get("severity") == "warn" and r["outcome"] != "PASS" else ""),
                _shown(r),
            )
            for r in results
        ]
    )
    width = max([len(r[0]) for r in rows] + [5])
    mark_width = max([len(r[1]) for r in rows] + [7])
    # A re-check says so first; a failed leg's own exit and message come before the checks they explain.
    lines = recheck_lines(evidence) + child_exits(evidence)
    lines.append(f"{'check'.ljust(width)}  {'outcome'.ljust(mark_width)}  value / reason")
    by_name = {r["name"]: r for r in results}
    for name, mark, shown in rows:
        lines.append(f"{name.ljust(width)}  {mark.ljust(mark_width)}  {shown}".rstrip())
        result = by_name.get(name)
        if result and result["outcome"] in ("FAIL", "NO_DATA", "ERROR"):
            lines.extend(explain_lines(result, verbose))
    reused = reused_line(evidence, verdict)
    if reused:
        lines.append(reused)
    lines.append(verdict_line(_spec_name(evidence), verdict))
    return "\n".join(lines)


def explain_lines(result: Mapping[str, Any], verbose: bool = False) -> list[str]:
    """The indented explanation under a failing check: where, expression, sub-values."""
    out = [f"    {_where(result)}  {result['expr']}".rstrip()]
    out += [f"    let {name} = {text}" for name, text in (result.get("let") or {}).items()]
    if result["outcome"] != "FAIL" or result.get("value") is not False:
        out.append(f"    {result.get('reason', '')}")
    pairs = result.get("explain") or []
    shown = pairs if verbose else pairs[:EXPLAIN_LINES]
    out += [f"      {text} = {value}" for text, value in shown]
    if len(pairs) > len(shown):
        out.append(f"      ... {len(pairs) - len(shown)} more (use -v)")
    return out


# ---------------------------------------------------------------- JUnit


def junit(evidence: Mapping[str, Any], results: list[dict], verdict: Mapping[str, Any] | None = None) -> str:
    """One <testsuite>: a testcase per step and per check. Warn-severity misses are reported in
    <system-out> but are not failures, matching the verdict."""
    name = _spec_name(evidence)
    suite = ET.Element("testsuite", name=name)
    counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    _recheck_properties(suite, evidence)

    def case(classname: str, case_name: str, seconds: Any) -> ET.Element:
        counts["tests"] += 1
        return ET.SubElement(suite, "testcase", classname=classname, name=case_name, time=f"{float(seconds or 0):.3f}")

    for step_name, step in (evidence.get("steps") or {}).items():
        el = case(f"{name}.steps", step_name, step.get("seconds"))
        status = step.get("status")
        if status == "failed" or status == "interrupted":
            counts["failures"] += 1
            exited = exit_text(step)
            said = [exited] if exited is not None else []
            message = (
                f"{status}: "
                + "".join(f"{text}; " for text in said)
                + f"rc {step.get('rc')}"
                + (" (timed out)" if step.get("timed_out") else "")
                + (f": {step['error']}" if step.get("error") else "")
            )
            failure = ET.SubElement(el, "failure", message=message, type=status)
            failure.text = "\n".join(said + list(step.get("failure_lines") or []))
        elif status in ("skipped", "not_run"):
            counts["skipped"] += 1
            ET.SubElement(el, "skipped", message=status)
        before, after = _step_notes(step)
        if before or after:
            ET.SubElement(el, "system-out").text = "\n".join(before + after)

    for problem in (verdict or {}).get("harvest") or []:
        el = case(f"{name}.harvest", f"{problem['step']}.{problem['harvest']} ({problem.get('kind')})", 0)
        if problem.get("fails"):
            counts["failures"] += 1
            ET.SubElement(el, "failure", message=str(problem.get("message")), type="HARVEST").text = (
                "lines " + ", ".join(str(n) for n in problem.get("lines") or [])
            )
        else:
            ET.SubElement(el, "system-out").text = f"NOTE (opted in): {problem.get('message')}"

    for r in results:
        el = case(f"{name}.checks", r["name"], 0)
        detail = "\n".join(
            [f"{_where(r)} {r['expr']}".strip()]
            + [f"let {n} = {t}" for n, t in (r.get("let") or {}).items()]
            + [f"{t} = {v}" for t, v in r.get("explain") or []]
        )
        warn = r.get("severity") == "warn"
        if r["outcome"] == "SKIPPED":
            counts["skipped"] += 1
            ET.SubElement(el, "skipped", message=r.get("reason", ""))
        elif r["outcome"] == "DISABLED":  # reported, never a failure: the reason is the message
            counts["skipped"] += 1
            ET.SubElement(el, "skipped", message=f"DISABLED: {r.get('reason', '')}")
        elif r["outcome"] in ("FAIL", "NO_DATA", "ERROR") and warn:
            ET.SubElement(el, "system-out").text = f"WARNING {r['outcome']}: {r.get('reason')}\n{detail}"
        elif r["outcome"] in ("FAIL", "NO_DATA"):
            counts["failures"] += 1
            ET.SubElement(el, "failure", message=r.get("reason", ""), type=r["outcome"]).text = detail
        elif r["outcome"] == "ERROR":
            counts["errors"] += 1
            ET.SubElement(el, "error", message=r.get("reason", ""), type="ERROR").text = detail
    for key, value in counts.items():
        suite.set(key, str(value))
    suite.set("time", str((verdict or {}).get("seconds", evidence.get("seconds") or 0)))
    ET.indent(suite)
    text = ET.tostring(suite, encoding="unicode")
    return '<?xml version="1.0" encoding="utf-8"?>\n' + unhidden(_NOT_XML.sub("", text)) + "\n"


def _recheck_properties(suite: ET.Element, evidence: Mapping[str, Any]) -> None:
    """A re-check says so in the suite's <properties>: when, which spec, each changed value run -> now."""
    head = recheck_header(evidence)
    if head is None:
        return
    info = evidence["rechecked"]
    props = ET.SubElement(suite, "properties")
    changed = info.get("values_changed") or []
    for key, value in [
        ("rechecked", head),
        ("rechecked_at", info.get("at")),
        ("spec_revision", revision_text(info.get("revision") or {})),
        ("values_changed", len(changed)),
    ] + [(f"value.{item.get('name')}", " -> ".join(value_change(item))) for item in changed]:
        ET.SubElement(props, "property", name=str(key), value=str(value))


# ---------------------------------------------------------------- Markdown


def _cell(text: Any) -> str:
    """Text from the evidence (a harvested string, a failure line, a path) in a Markdown table:
    escaped as the HTML report escapes it, so it reaches the job summary or a PR comment as
    text, never as HTML, a link or an image (engine/text.py markdown_text)."""
    return markdown_text(text)


def _fence(lines: Sequence[str]) -> str:
    """A code fence longer than any run of backticks in `lines`: they cannot close it."""
    longest = max((len(m) for line in lines for m in re.findall(r"`+", line)), default=0)
    return "`" * max(3, longest + 1)


def markdown(
    evidence: Mapping[str, Any], results: list[dict], verdict: Mapping[str, Any], figures: Sequence[Any] = ()
) -> str:
    """A PR-comment / step-summary table with the verdict on top, then the plots (`figures`,
    engine/show/plots.py) as Mermaid charts. Every text from the run is escaped (`_cell`)."""
    name = _spec_name(evidence)
    head = (
        f"### {_ICON.get(verdict['outcome'], '')} {markdown_code(name)} ({_cell(evidence.get('mode', '?'))}): "
        f"**{verdict['outcome']}** in {verdict.get('seconds', 0)} s"
    )
    lines = [head, ""]
    recheck = recheck_header(evidence)
    if recheck is not None:
        changed = evidence["rechecked"].get("values_changed") or []
        lines += [f"> {_cell(recheck)}", ""]
        if changed:
            lines += ["| value | the run had | the spec has now |", "|---|---|---|"]
            lines += [
                f"| {markdown_code(i.get('name'))} | {' | '.join(_cell(v) for v in value_change(i))} |" for i in changed
            ]
            lines.append("")
    if verdict.get("message"):
        lines += [f"> {_cell(verdict['message'])}", ""]
    said = child_exits(evidence)
    if said:
        lines += [f"- {_cell(text)}" for text in said] + [""]
    reused = reused_line(evidence, verdict)
    if reused:
        lines += [f"> {_cell(reused)}", ""]
    if verdict.get("failed"):
        lines += ["Failed: " + ", ".join(markdown_code(f) for f in verdict["failed"]), ""]
    lines += ["| step | status | detail |", "|---|---|---|"]
    lines += [f"| {markdown_code(n[5:])} | {_cell(s)} | {_cell(d)} |" for n, s, d in _step_rows(evidence)]
    lines += [
        f"| {markdown_code(n)} | {'❌ FAIL' if m == 'FAIL' else 'note'} | {_cell(d)} |"
        for n, m, d in _harvest_rows(verdict)
    ]
    lines += ["", "| check | outcome | value / reason |", "|---|---|---|"]
    for r in results:
        outcome = f"{_ICON[r['outcome']]} {r['outcome']}" + (" (warn)" if r.get("severity") == "warn" else "")
        lines.append(f"| {markdown_code(r['name'])} | {outcome} | {_cell(_shown(r, 120))} |")
    failing = [r for r in results if r["outcome"] in ("FAIL", "NO_DATA", "ERROR")]
    if failing:
        lines += ["", "<details><summary>why the failing checks failed</summary>", ""]
        for r in failing:
            explained = explain_lines(r, verbose=True)
            fence = _fence(explained)
            lines += [f"**{_cell(r['name'])}** ({_cell(_where(r))})", fence, *explained, fence]
        lines += ["</details>"]
    if figures:
        from engine.show import mermaid

        lines += ["", mermaid.section(list(figures)).rstrip("\n")]
    # A PR comment shows bidirectional controls as they act: escaped, a reviewer reads what is there.
    return printable("\n".join(lines) + "\n")


def write_file(path: str | Path, text: str) -> None:
    """Write a report file (`--junit FILE`, `--markdown FILE`), creating its directory."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(text, encoding="utf-8")


def writable_problem(path: str | Path) -> str | None:
    """Why a report could not be written to `path` (None when it can), found before a run spends
    an hour: the file is created (and removed again when it was not there)."""
    target = Path(path)
    if target.is_dir():
        return f"{target} is a directory"
    existed = target.exists()
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with open(target, "a", encoding="utf-8"):
            pass
    except (OSError, ValueError) as exc:
        return f"cannot write {target}: {getattr(exc, 'strerror', None) or exc}"
    if not existed:
        try:
            os.unlink(target)
        except OSError:
            pass
    return None
