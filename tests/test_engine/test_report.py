"""engine/show/report.py: terminal table + VERDICT line, JUnit XML, Markdown."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path

from engine.expr.functions import OPTIONS
from engine.judge.checks import evaluate
from engine.judge.verdict import verdict
from engine.show.report import junit, markdown, table, verdict_line

GOLDEN = Path(__file__).parents[1] / "golden" / "checks"


def _golden() -> tuple[dict, list[dict], dict]:
    evidence = json.loads((GOLDEN / "evidence.json").read_text())
    results = evaluate(json.loads((GOLDEN / "checks.json").read_text()), evidence, OPTIONS)
    return evidence, results, verdict(evidence, results)


def test_verdict_line_shape():
    assert (
        verdict_line("p4_smoke", {"outcome": "PASS", "failed": [], "seconds": 3.2})
        == "VERDICT p4_smoke PASS [] seconds 3.2"
    )
    assert (
        verdict_line("p4_smoke", {"outcome": "FAIL", "failed": ["step:leg2", "a"], "seconds": 9})
        == 'VERDICT p4_smoke FAIL ["step:leg2", "a"] seconds 9'
    )
    assert (
        verdict_line(
            "p4",
            {
                "outcome": "PRECONDITION",
                "failed": ["step:fetch_mix"],
                "seconds": 1.0,
                "message": "could not fetch the published mix",
            },
        )
        == 'VERDICT p4 PRECONDITION could not fetch the published mix ["step:fetch_mix"] seconds 1.0'
    )


def test_table_lists_steps_and_checks_and_ends_with_the_verdict():
    evidence, results, v = _golden()
    text = table(evidence, results, v)
    lines = text.splitlines()
    assert lines[-1] == (
        'VERDICT p4_smoke FAIL ["step:leg2", "leg2_resumed_and_finished", '
        '"all_steps_present", "leg2_pointer_terminal", "loss_is_a_number"] seconds 41.7'
    )
    row = next(line for line in lines if line.startswith("leg2_resumed_and_finished"))
    assert "NO_DATA" in row and "steps.leg2.harvest.run_json.final_step is missing" in row
    assert any(line.startswith("step:leg2") and "failed" in line and "rc 1" in line for line in lines)
    # A failing check is followed by its location and its explain tree.
    i = lines.index(next(line for line in lines if line.startswith("all_steps_present")))
    assert lines[i + 1].strip() == ("specs/p4_smoke.yaml:52  state.hub_after_leg2.checkpoints == values.all_push_steps")
    assert "state.hub_after_leg2.checkpoints = [10]" in lines[i + 2]
    assert "values.all_push_steps = [10,20]" in lines[i + 3]
    warn = next(line for line in lines if line.startswith("tokens_warn"))
    assert "(warn)" in warn
    assert any("skip" in line and "when `values.gate_peak` was false" in line for line in lines)


def test_explain_is_capped_unless_verbose():
    evidence = {"spec": {"name": "t"}, "values": {f"v{i}": i for i in range(12)}, "steps": {}}
    expr = " && ".join(f"values.v{i} == `{i}`" for i in range(1, 12)) + " && values.v0 == `1`"
    results = evaluate([{"name": "long", "expr": expr}], evidence, OPTIONS)
    v = verdict(evidence, results)
    short = table(evidence, results, v)
    assert "more (use -v)" in short
    full = table(evidence, results, v, verbose=True)
    assert "more (use -v)" not in full and "values.v0 = 0" in full


def test_junit_is_valid_xml_with_the_right_counts():
    evidence, results, v = _golden()
    root = ET.fromstring(junit(evidence, results, v))
    assert root.tag == "testsuite" and root.get("name") == "p4_smoke"
    cases = root.findall("testcase")
    assert len(cases) == 4 + 11 == int(root.get("tests"))
    # failures: step leg2 + FAIL all_steps_present + NO_DATA x2; the warn FAIL is not a failure.
    assert int(root.get("failures")) == 4
    assert int(root.get("errors")) == 1
    assert int(root.get("skipped")) == 1
    by_name = {c.get("name"): c for c in cases}
    assert by_name["leg2"].find("failure").get("message") == "failed: rc 1"
    assert (
        by_name["leg2_resumed_and_finished"].find("failure").get("message")
        == "no data: steps.leg2.harvest.run_json.final_step is missing"
    )
    assert by_name["peak_memory_below_limit"].find("skipped") is not None
    assert by_name["tokens_warn"].find("failure") is None
    assert "WARNING" in by_name["tokens_warn"].find("system-out").text
    assert by_name["leg1"].get("time") == "20.100"


def test_markdown_has_the_verdict_on_top_and_a_row_per_check():
    evidence, results, v = _golden()
    md = markdown(evidence, results, v)
    lines = md.splitlines()
    assert lines[0].startswith("### ") and "**FAIL**" in lines[0] and "`p4_smoke`" in lines[0]
    rows = [line for line in lines if line.startswith("| `")]
    assert len(rows) == 4 + 11
    assert any("`all_steps_present`" in r and "FAIL" in r for r in rows)
    assert "<details>" in md and "values.all_push_steps = [10,20]" in md


def test_markdown_escapes_pipes():
    evidence = {"spec": {"name": "t"}, "steps": {}}
    results = evaluate([{"name": "p", "expr": "a || b"}], {"a": "x|y"}, OPTIONS)
    md = markdown(evidence, results, verdict(evidence, results))
    assert "a \\|\\| b" not in md.splitlines()[0]
    assert all(line.count("|") - line.count("\\|") == 4 for line in md.splitlines() if line.startswith("| `p`"))


def test_harvested_html_and_links_reach_the_markdown_report_as_text(tmp_path: Path) -> None:
    """A leg's strings go into the job summary and the PR comment: escaped as the HTML report escapes
    them, never an image that loads, a link that reads PASS, or a table cell broken out of."""
    nasty = {
        "img": "<img src=https://evil.example/x.png onerror=alert(1)>",
        "link": "[PASS: signed-off](https://evil.example/approve)",
        "code": "``` </details> <script>x()</script>",
        "cell": "a | b",
    }
    evidence = {
        "spec": {"name": "t"},
        "mode": "smoke",
        "steps": {"leg": {"kind": "run", "status": "failed", "rc": 1, "error": nasty["img"] + " " + nasty["link"]}},
        "harvest": nasty,
    }
    checks = [
        {"name": name, "why": "w", "expr": f"harvest.{name} == 'ok'", "file": "s.yaml", "line": 1} for name in nasty
    ]
    results = evaluate(checks, evidence, OPTIONS)
    md = markdown(evidence, results, verdict(evidence, results))
    # Outside code fences (where nothing renders) no tag, and no link, is left.
    text = re.sub(r"^(`{3,})$.*?^\1$", "", md, flags=re.M | re.S)
    assert "<img" not in text and "<script" not in text and not re.search(r"(?<!\\)\]\(", text)
    assert "&lt;img src=https://evil.example/x.png onerror=alert(1)&gt;" in md
    assert "\\[PASS: signed-off\\](https://evil.example/approve)" in md
    # The explanations are fenced past any backtick run they hold: ``` inside cannot close them.
    fences = [line for line in md.splitlines() if set(line) == {"`"}]
    assert fences.count("````") == 2 and fences.count("```") == 6
    tags = [line for line in md.splitlines() if "</details>" in line and not line.startswith(("| ", "  "))]
    assert tags == ["</details>"], tags
