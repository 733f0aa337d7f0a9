"""The run as one self-contained HTML page (`--html FILE`): the verdict, the failure trees, the
plots as inline SVG, the check table and the steps.

It opens from a Kaggle output tab or a CI artifact as it is: no script, no stylesheet or font to
fetch, and a Content-Security-Policy that forbids the page to load anything at all. Like the other
reports it is a pure function of (evidence, results, verdict, figures), so a re-check of a saved
run renders the page the live run rendered.
"""

from __future__ import annotations

import json
from html import escape
from typing import Any, Mapping, Sequence

from engine.run.said import exit_text
from engine.show import svg
from engine.show.plots import Figure
from engine.show.report import (
    _shown,
    _step_rows,
    child_exits,
    explain_lines,
    recheck_header,
    reused_line,
    value_change,
    verdict_line,
)
from engine.text import printable

_FAILING = ("FAIL", "NO_DATA", "ERROR")
_STYLE = """
body { font-family: sans-serif; color: #111; margin: 24px auto; max-width: 1000px; padding: 0 16px; }
h1 { font-size: 22px; margin: 0 0 4px; } h2 { font-size: 18px; margin: 28px 0 8px; }
h3 { font-size: 15px; margin: 18px 0 4px; }
.meta { color: #555; font-size: 13px; margin: 0; }
.outcome { display: inline-block; padding: 1px 8px; border-radius: 4px; color: #fff; font-weight: bold; }
.PASS, .ok { background: #2e7d32; } .FAIL, .failed, .ERROR, .interrupted { background: #c62828; }
.NO_DATA, .PRECONDITION, .INTERRUPTED { background: #ef6c00; }
.SKIPPED, .skipped, .not_run { background: #757575; }
table { border-collapse: collapse; width: 100%; font-size: 13px; }
th, td { text-align: left; vertical-align: top; border-bottom: 1px solid #ddd; padding: 4px 6px; }
td.name { font-family: monospace; white-space: nowrap; } td.value { font-family: monospace; word-break: break-all; }
.why { color: #555; font-family: sans-serif; white-space: normal; font-size: 12px; }
pre { background: #f6f6f6; padding: 8px; font-size: 12px; white-space: pre-wrap; overflow-wrap: anywhere; }
.recheck { background: #fff4d6; border-left: 4px solid #ef6c00; padding: 6px 10px; font-size: 13px; }
figure { margin: 16px 0 24px; } figcaption { font-size: 13px; color: #333; margin-bottom: 6px; }
svg.plot { display: block; border: 1px solid #ddd; }
ul.notes { font-size: 12px; color: #6d4c00; margin: 6px 0 0; }
"""


def _badge(text: str) -> str:
    return f'<span class="outcome {escape(text)}">{escape(text)}</span>'


def _figure(figure: Figure) -> str:
    where = f" ({figure.file}:{figure.line})" if figure.file else ""
    out = [
        f'<figure id="figure-{escape(figure.name)}">',
        f"<h3>{escape(figure.title)}</h3>",
        f'<figcaption>{escape(" ".join(figure.why.split()))}<span class="meta">{escape(where)}</span></figcaption>',
        svg.render(figure).rstrip("\n"),
    ]
    if figure.notes:
        out.append('<ul class="notes">' + "".join(f"<li>{escape(n)}</li>" for n in figure.notes) + "</ul>")
    out.append("</figure>")
    return "\n".join(out)


def _check_row(r: Mapping[str, Any]) -> str:
    where = f"{r['file']}:{r.get('line') or '?'}" if r.get("file") else ""
    warn = " (warn)" if r.get("severity") == "warn" else ""
    return (
        f'<tr><td class="name">{escape(r["name"])}<div class="why">{escape(" ".join((r.get("why") or "").split()))}'
        f"</div></td><td>{_badge(r['outcome'])}{escape(warn)}</td>"
        f'<td class="value">{escape(_shown(r, 200))}</td><td class="name">{escape(where)}</td></tr>'
    )


def render(
    evidence: Mapping[str, Any],
    results: Sequence[Mapping[str, Any]],
    verdict: Mapping[str, Any],
    figures: Sequence[Figure] = (),
) -> str:
    """The whole page as text (UTF-8 when written)."""
    out = _head(evidence, verdict)
    out += _failures(results)
    if figures:
        out += ['<section id="plots">', "<h2>Plots</h2>"] + [_figure(f) for f in figures] + ["</section>"]
    out += (
        [
            '<section id="checks">',
            "<h2>Checks</h2>",
            "<table>",
            "<thead><tr><th>check</th><th>outcome</th><th>value / reason</th><th>written at</th></tr></thead>",
            "<tbody>",
        ]
        + [_check_row(r) for r in results]
        + ["</tbody>", "</table>", "</section>"]
    )
    out += _steps(evidence)
    out += _values(evidence)
    out += ["</body>", "</html>"]
    # A browser acts on bidirectional and control characters; escaped, the page shows what is there.
    return printable("\n".join(out) + "\n")


def _head(evidence: Mapping[str, Any], verdict: Mapping[str, Any]) -> list[str]:
    """The document's head and the page's header: the spec, its verdict, what the run was."""
    spec = evidence.get("spec") or {}
    name = spec.get("name") or "spec"
    mode = evidence.get("mode") or "?"
    outcome = verdict.get("outcome", "?")
    meta = [f"mode {mode}", f"{verdict.get('seconds', 0)} s"]
    if spec.get("path"):
        meta.append(f"spec {spec['path']}")
    if evidence.get("started_at"):
        meta.append(f"started {evidence['started_at']}")
    if evidence.get("engine_version"):
        meta.append(f"engine {evidence['engine_version']}")
    out = [
        "<!DOCTYPE html>",
        '<html lang="en">',
        "<head>",
        '<meta charset="utf-8">',
        # Nothing may be fetched: the page must read the same offline, from an artifact or a tab.
        '<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; '
        "style-src 'unsafe-inline'; img-src data:\">",
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{escape(name)} ({escape(mode)}): {escape(outcome)}</title>",
        f"<style>{_STYLE}</style>",
        "</head>",
        "<body>",
        "<header>",
        f"<h1>{escape(name)} {_badge(outcome)}</h1>",
        f'<p class="meta">{escape(" · ".join(meta))}</p>',
        f'<p class="meta"><code>{escape(verdict_line(name, verdict))}</code></p>',
    ]
    recheck = recheck_header(evidence)
    if recheck is not None:
        out.append(f'<p class="recheck" id="recheck">{escape(recheck)}</p>')
    if verdict.get("message"):
        out.append(f"<p><strong>{escape(verdict['message'])}</strong></p>")
    out += [f'<p class="child"><strong>{escape(text)}</strong></p>' for text in child_exits(evidence)]
    reused = reused_line(evidence, verdict)
    if reused:
        out.append(f'<p class="meta">{escape(reused)}</p>')
    out.append("</header>")
    return out


def _failures(results: Sequence[Mapping[str, Any]]) -> list[str]:
    """Why each failing check failed, open at the top of the page; nothing when none failed."""
    failing = [r for r in results if r["outcome"] in _FAILING]
    if not failing:
        return []
    out = ['<section id="failures">', "<h2>Why the failing checks failed</h2>"]
    for r in failing:
        out.append(
            f"<details open><summary><code>{escape(r['name'])}</code> {_badge(r['outcome'])}"
            f"</summary><pre>{escape(chr(10).join(explain_lines(r, verbose=True)))}</pre></details>"
        )
    out.append("</section>")
    return out


def _steps(evidence: Mapping[str, Any]) -> list[str]:
    """The steps section: each step's status, then each failed one's failure lines and log tail."""
    out = [
        '<section id="steps">',
        "<h2>Steps</h2>",
        "<table>",
        "<thead><tr><th>step</th><th>status</th><th>detail</th></tr></thead>",
        "<tbody>",
    ]
    for step_name, status, detail in _step_rows(evidence):
        out.append(
            f'<tr><td class="name">{escape(step_name[5:])}</td><td>{_badge(status)}</td><td>{escape(detail)}</td></tr>'
        )
    out += ["</tbody>", "</table>"]
    steps = evidence.get("steps") or {}
    failed = [
        (n, s) for n, s in steps.items() if s.get("status") == "failed" and (s.get("failure_lines") or s.get("tail"))
    ]
    for step_name, step in failed:
        exited = exit_text(step)
        said = [exited] if exited is not None else []
        lines = said + list(step.get("failure_lines") or []) + ["..."] + list(step.get("tail") or [])
        out.append(
            f"<h3>step {escape(step_name)}: failure lines, then the tail</h3>"
            f"<pre>{escape(chr(10).join(str(x) for x in lines))}</pre>"
        )
    for step_name, step in steps.items():
        warned = step.get("warn_on") if isinstance(step, Mapping) else None
        kept = warned.get("lines") if isinstance(warned, Mapping) else None
        if isinstance(kept, list) and kept:
            shown = [f"{hit.get('line')}: {hit.get('text')}" for hit in kept if isinstance(hit, Mapping)]
            count = warned.get("count")
            if isinstance(count, int) and count > len(shown):
                shown.append(f"... {count - len(shown)} more")
            out.append(
                f"<h3>step {escape(step_name)}: its warnings (<code>warn_on</code>)</h3>"
                f'<pre class="warn">{escape(chr(10).join(shown))}</pre>'
            )
    out += ["</section>"]
    return out


def _values(evidence: Mapping[str, Any]) -> list[str]:
    """The values section: the run's own, or for a re-check the spec's now with each one the re-check
    changed shown as the run's -> now (the values the checks read are not the run's)."""
    values = evidence.get("values") or {}
    info = evidence.get("rechecked") if isinstance(evidence.get("rechecked"), Mapping) else None
    changed = {str(i.get("name")): i for i in (info or {}).get("values_changed") or []}
    if not values and not changed:
        return []
    lines = []
    for k, v in values.items():
        shown = " -> ".join(value_change(changed[k])) if k in changed else json.dumps(v, default=str)
        lines.append(f"{k} = {shown}")
    lines += [f"{k} = {' -> '.join(value_change(i))}" for k, i in changed.items() if k not in values]
    summary = (
        f"every value the checks read ({len(lines)}): the spec's now, {len(changed)} changed since the run (run -> now)"
        if info is not None
        else f"every value of the run ({len(values)})"
    )
    return [
        '<section id="values">',
        "<h2>Values</h2>",
        f"<details{' open' if changed else ''}><summary>{escape(summary)}</summary><pre>"
        + escape("\n".join(lines))
        + "</pre></details>",
        "</section>",
    ]
