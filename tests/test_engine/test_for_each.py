"""`for_each`: a check (or a plot's series) declared once for every element of a list of values, expanded
in the plan into ordinary checks named `NAME[var=label]`, each with its declaration's file:line. Real
`engine` commands (in process) on small specs whose legs are `python -c`; the review on a real git
repository."""

from __future__ import annotations

import io
import json
import warnings
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from engine_helpers import git

from engine.cli import main
from engine.judge.verdict import Exit
from engine.spec.load import load_spec
from engine.spec.located import SpecErrors
from engine.spec.plan import build_plan
from engine.spec.validate import findings

# Two legs that report like the trainer; one check written once for both stops.
SPEC = """\
version: 1
name: stops
description: two legs, each stopping at its own step
budget_s: 100
values:
  stop1: 10
  stops:
    - {leg: leg1, stop: "${stop1}", next: leg2}
    - {leg: leg2, stop: 20, next: leg1}
  code1: "import json; print('RUN_JSON ' + json.dumps({'final_step': 10, 'losses': {'1': 6.0}}))"
  code2: "import json; print('RUN_JSON ' + json.dumps({'final_step': 20, 'losses': {'11': 4.0}}))"
steps:
  - name: leg1
    run:
      argv: ["${python}", "-c", "${code1}"]
      timeout_s: 30
      grace_s: 5
      output:
        harvest:
          run_json: {marker: "RUN_JSON ", pick: last}
  - name: leg2
    like: leg1
    run: {argv: ["${python}", "-c", "${code2}"]}
checks:
  - name: exit_clean
    why: the first leg exits 0
    expr: "steps.leg1.rc == `0`"
  - name: stopped_at_its_stop
    for_each: {leg: "values.stops"}
    why: ${leg} must stop at step ${leg.stop}, not one step early or late
    let:
      run: "steps.${leg}.harvest.run_json"
    expr: "let.run.final_step == `${leg.stop}`"
    when: "steps.${leg}.status == 'ok'"
"""
FAMILY_LINE = SPEC.splitlines().index("  - name: stopped_at_its_stop") + 1
FOR_EACH_LINE = FAMILY_LINE + 1


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # files are named relative to the cwd in messages


def write(name: str, text: str) -> Path:
    path = Path(name)
    path.write_text(text)
    return path


def spec_with(old: str, new: str, name: str = "stops.yaml") -> Path:
    assert old in SPEC, old
    return write(name, SPEC.replace(old, new, 1))


def child(body: str) -> Path:
    write("stops.yaml", SPEC)
    return write("child.yaml", "version: 1\nname: child\nextends: stops.yaml\n" + body)


def checks_of(path: Path, mode: str | None = None) -> dict[str, dict]:
    return {c["name"]: c for c in build_plan(load_spec(path), mode=mode, environ={}).checks}


def errors_of(path: Path) -> list[str]:
    try:
        spec = load_spec(path)
    except SpecErrors as e:
        return [str(x) for x in e.errors]
    return [str(e) for e in findings(spec, {})[0]]


def run(path: Path, run_dir: str, capsys: pytest.CaptureFixture, *more: str) -> tuple[int, str, dict]:
    capsys.readouterr()
    rc = main(["run", str(path), "--run-dir", run_dir, *more])
    out = capsys.readouterr().out
    return rc, out, json.loads((Path(run_dir) / "evidence.json").read_text())


# ------------------------------------------------------------------ expansion in the plan


def test_a_for_each_check_is_one_check_per_element_named_after_it():
    checks = checks_of(write("stops.yaml", SPEC))
    assert list(checks) == ["exit_clean", "stopped_at_its_stop[leg=leg1]", "stopped_at_its_stop[leg=leg2]"]
    one, two = checks["stopped_at_its_stop[leg=leg1]"], checks["stopped_at_its_stop[leg=leg2]"]
    # The element is spliced where it is referenced: its label, and its fields (a value's `${x}` too).
    assert one["expr"] == "let.run.final_step == `10`" and one["let"] == {"run": "steps.leg1.harvest.run_json"}
    assert two["expr"] == "let.run.final_step == `20`" and two["let"] == {"run": "steps.leg2.harvest.run_json"}
    assert one["why"] == "leg1 must stop at step 10, not one step early or late"
    assert (one["when"], two["when"]) == ("steps.leg1.status == 'ok'", "steps.leg2.status == 'ok'")
    # Every expansion is located where the check is declared.
    assert (one["file"], one["line"]) == (two["file"], two["line"]) == ("stops.yaml", FAMILY_LINE)
    assert "for_each" not in one
    assert findings(load_spec("stops.yaml"), {}) == ([], [])


def test_a_scalar_element_is_its_own_label(capsys):
    path = spec_with('for_each: {leg: "values.stops"}', 'for_each: {leg: "values.stops[*].leg"}')
    path.write_text(path.read_text().replace("`${leg.stop}`", "`10`").replace(" at step ${leg.stop}", ""))
    assert list(checks_of(path))[1:] == ["stopped_at_its_stop[leg=leg1]", "stopped_at_its_stop[leg=leg2]"]
    capsys.readouterr()
    assert main(["plan", str(path)]) == Exit.PASS
    out = capsys.readouterr().out
    assert "  - stopped_at_its_stop[leg=leg2] [gate] let.run.final_step == `10` when steps.leg2.status == 'ok'\n" in out
    assert "      let run = steps.leg2.harvest.run_json\n" in out


def test_each_expansion_is_its_own_check_in_every_report(tmp_path, capsys):
    # Leg 2 stops one step early: only its expansion fails, by name, in every report.
    path = spec_with("'final_step': 20", "'final_step': 19")
    rc, out, doc = run(path, "run", capsys, "--junit", "j.xml", "--markdown", "s.md")
    assert rc == Exit.FAILED
    assert 'VERDICT stops FAIL ["stopped_at_its_stop[leg=leg2]"]' in out
    rows = {line.split()[0]: line.split()[1] for line in out.splitlines() if line.startswith("stopped_at")}
    assert rows == {"stopped_at_its_stop[leg=leg1]": "ok", "stopped_at_its_stop[leg=leg2]": "FAIL"}
    assert f"stops.yaml:{FAMILY_LINE}  let.run.final_step == `20`" in out  # the failure tree
    results = {r["name"]: r for r in doc["checks"]}
    assert results["stopped_at_its_stop[leg=leg2]"]["outcome"] == "FAIL"
    assert results["stopped_at_its_stop[leg=leg2]"]["line"] == FAMILY_LINE
    assert results["stopped_at_its_stop[leg=leg1]"]["outcome"] == "PASS"
    cases = {c.get("name"): [e.tag for e in c] for c in ET.parse("j.xml").getroot()}
    assert cases["stopped_at_its_stop[leg=leg1]"] == [] and cases["stopped_at_its_stop[leg=leg2]"] == ["failure"]
    md = Path("s.md").read_text()
    assert (
        "| `stopped_at_its_stop[leg=leg2]` | ❌ FAIL |" in md and "| `stopped_at_its_stop[leg=leg1]` | ✅ PASS |" in md
    )


def test_engine_diff_compares_expansions_by_name(capsys):
    """An added stop is an added check, a removed one a removed check, a moved stop a changed one: each
    named after its element and placed where the family is written."""
    one = spec_with("    - {leg: leg2, stop: 20, next: leg1}\n", "", "one.yaml")
    two = write("two.yaml", SPEC.replace("stop1: 10", "stop1: 11"))
    capsys.readouterr()
    assert main(["diff", str(one), str(two)]) == 1
    out = capsys.readouterr().out
    assert f"    + stopped_at_its_stop[leg=leg2] [gate]  (two.yaml:{FAMILY_LINE})\n" in out
    assert "        why: leg2 must stop at step 20, not one step early or late\n" in out
    assert f"    ~ stopped_at_its_stop[leg=leg1] expr  (two.yaml:{FAMILY_LINE + 5}):\n" in out
    assert "        let.run.final_step == [-`10`-]{+`11`+}\n" in out
    assert main(["diff", str(two), str(one)]) == 1
    out = capsys.readouterr().out
    assert f"    - stopped_at_its_stop[leg=leg2] [gate]  (two.yaml:{FAMILY_LINE})\n" in out


# ------------------------------------------------------------------ refused, with file:line


@pytest.mark.parametrize(
    "old, new, message",
    [
        ('"values.stops"}', '"values.stop1"}', "for_each leg: 'values.stop1' is 10, not a list"),
        ('"values.stops"}', '"values.nope"}', "for_each leg: 'values.nope' reads unknown value 'nope'; known:"),
        (
            '"values.stops"}',
            '"steps.leg1"}',
            "for_each leg: 'steps.leg1' reads steps.leg1: the list is read from the values",
        ),
        ('"values.stops"}', '"values.stops[?stop > `99`]"}', "is an empty list: the check would assert nothing"),
        ('"values.stops"}', '"values.stops ||"}', "invalid JMESPath 'values.stops ||'"),
        (
            "{leg: leg2, stop: 20",
            "{leg: leg1, stop: 20",
            "elements 0 and 1 both name [leg=leg1]; each expansion needs a name of its own",
        ),
        (
            "{leg: leg2, stop: 20",
            "{lag: leg2, stop: 20",
            'element 1 ({"lag":"leg2","stop":20,"next":"leg1"}) cannot name an expansion: an object element is named by its field \'leg\', which it lacks (its fields: lag, stop, next)',
        ),
        ("{leg: leg2, stop: 20", "{leg: 2.5, stop: 20", 'element 1 ({"leg":2.5,'),
        (
            "{leg: leg2, stop: 20",
            "{leg: true, stop: 20",
            "true cannot name a check: an element is a name, an integer, or an object with a 'leg' field",
        ),
        (
            "{leg: leg2, stop: 20",
            "{leg: 'leg 2]', stop: 20",
            "\"leg 2]\" cannot name a check: a label is 1 to 64 letters, digits, '_', '.' or '-'",
        ),
        (
            "{leg: leg2, stop: 20",
            "{leg: [leg2], stop: 20",
            "its field 'leg' is [\"leg2\"]: a name or an integer names an expansion",
        ),
        (
            "  code2:",
            "  leg: leg1\n  code2:",
            "for_each variable 'leg' is also a value: ${leg} would mean two things; rename it",
        ),
    ],
)
def test_a_list_that_cannot_expand_is_refused_at_the_for_each(old, new, message):
    errors = errors_of(spec_with(old, new))
    line = FOR_EACH_LINE + new.count("\n") - old.count("\n")
    assert any(e.startswith(f"stops.yaml:{line}:") and message in e for e in errors), errors


def test_for_each_names_exactly_one_variable():
    path = spec_with('for_each: {leg: "values.stops"}', 'for_each: {leg: "values.stops", at: "values.stops"}')
    (error,) = errors_of(path)
    assert error.startswith(f"stops.yaml:{FOR_EACH_LINE}:") and "for_each names exactly one variable" in error


def test_a_for_each_past_the_limit_is_refused_before_it_makes_a_check():
    """A list a value computes (`range()`) could make a million checks in every report."""
    path = spec_with('"values.stops"}', '"values.many"}')
    path.write_text(path.read_text().replace("  stop1: 10\n", '  stop1: 10\n  many: {eval: "range(`0`, `1001`)"}\n'))
    (error,) = errors_of(path)
    assert error.startswith(f"stops.yaml:{FOR_EACH_LINE + 1}:") and error.endswith(
        "for_each leg: 'values.many' has 1,001 elements; one for_each expands to at most 1,000 checks"
    )
    path.write_text(path.read_text().replace("`1001`", "`1000`").replace("`${leg.stop}`", "`${leg}`"))
    path.write_text(path.read_text().replace("steps.${leg}.harvest.run_json", "steps.leg1.harvest.run_json"))
    path.write_text(path.read_text().replace(" at step ${leg.stop}", ""))
    assert len(checks_of(path)) == 1 + 1000


def test_checks_that_would_expand_past_the_total_limit_are_refused_before_one_is_expanded(engine_process):
    """3,000 checks over a list of 1,000 are 3 million checks: counted from the lists' lengths, refused
    at the for_each that passes the limit, before the first is made (a subprocess with a timeout: made
    one by one, they take minutes and gigabytes)."""
    checks = "".join(
        f'  - name: c{i}\n    for_each: {{x: "values.items"}}\n    why: element ${{x}} holds\n'
        f'    expr: "steps.leg1.rc == `0`"\n'
        for i in range(3000)
    )
    body = SPEC[: SPEC.index("checks:\n")].replace(
        "  stop1: 10\n", '  stop1: 10\n  items: {eval: "range(`0`, `1000`)"}\n'
    )
    path = write("many.yaml", body + "checks:\n" + checks)
    ran = engine_process("validate", str(path), timeout=120, expect=Exit.USAGE)
    line = body.count("\n") + 1 + 20 * 4 + 2  # the 21st check's for_each: 20 lists of 1,000 fit
    assert f"many.yaml:{line}:15: $.checks[20].for_each: the checks expand to 3,000,000 in mode 'default'" in ran.out
    assert "over the limit of 20,000 (this one, 1,000 of them, passes it)" in ran.out


def test_plot_series_that_would_expand_past_the_total_limit_are_refused_too():
    series = "".join(
        f'      - {{label: "s{i} ${{x}}", for_each: {{x: "values.items"}}, points: "steps.leg1.harvest.run_json.losses"}}\n'
        for i in range(21)
    )
    body = SPEC.replace("  stop1: 10\n", '  stop1: 10\n  items: {eval: "range(`0`, `1000`)"}\n')
    path = write(
        "plots.yaml",
        body
        + "plots:\n  loss:\n    title: Loss\n    why: the loss falls\n    x: {label: step}\n    y: {label: loss}\n    series:\n"
        + series,
    )
    (error,) = errors_of(path)
    assert "$.plots.loss.series[20].for_each: the plot series expand to 21,000 in mode 'default'" in error


@pytest.mark.parametrize(
    "old, new, path, message",
    [
        (
            "`${leg.stop}`",
            "`${leg.stoop}`",
            "expr",
            "in stopped_at_its_stop[leg=leg1]: ${leg.stoop}: the element has no field 'stoop' (its fields: leg, stop, next)",
        ),
        (
            "step ${leg.stop},",
            "step ${leg.stoop},",
            "why",
            "in stopped_at_its_stop[leg=leg1]: ${leg.stoop}: the element has no field",
        ),
        (
            "`${leg.stop}`",
            "`${stop.stop}`",
            "expr",
            "${stop.stop}: only a for_each variable has fields, and this check's is 'leg'",
        ),
        (
            "stop: 20",
            "stop: 2.5",
            "expr",
            "in stopped_at_its_stop[leg=leg2]: ${leg.stop} is 2.5: in an expression, ${x} may only stand for a name or an integer",
        ),
        (
            "next: leg1}",
            "next: leg9}",
            "let.run",
            "steps.leg9.harvest.run_json: no step named 'leg9'; steps: leg1, leg2",
        ),
    ],
)
def test_an_expansion_that_cannot_be_spliced_is_refused_at_its_field(old, new, path, message):
    spec_with(old, new)
    if "leg9" in new:  # the element names a step through `${leg.next}`: checked once spliced, per expansion
        write("stops.yaml", Path("stops.yaml").read_text().replace("steps.${leg}.harvest", "steps.${leg.next}.harvest"))
    # Said once, as a spec error: the text left unspliced is never handed to JMESPath (whose lexer would
    # warn about `${...}` inside a literal).
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        errors = errors_of(Path("stops.yaml"))
    assert [str(w.message) for w in seen] == []
    where = {"expr": "$.checks[1].expr", "why": "$.checks[1].why", "let.run": "$.checks[1].let.run"}[path]
    assert any(f": {where}: " in e and message in e and e.startswith("stops.yaml:") for e in errors), errors


def test_a_check_named_like_an_expansion_is_only_an_override_of_an_inherited_one():
    """A plain check may not wear an expansion's name (it would sit beside the real one as a second
    gate, or be mistaken for it): such a name only overrides one expansion, on purpose."""
    plain = child('checks:\n  - name: "stopped_at_its_stop[leg=leg1]"\n    why: w\n    expr: "`true` == `true`"\n')
    (msg,) = errors_of(plain)
    assert msg.startswith(
        "child.yaml:5:5: $.checks[0]: check 'stopped_at_its_stop[leg=leg1]' is named like an expansion"
    )
    not_a_family = child(
        'checks:\n  - name: "exit_clean[leg=leg1]"\n    override: true\n    why: w\n    expr: "`true` == `true`"\n'
    )
    (msg,) = errors_of(not_a_family)
    assert "overrides one expansion of 'exit_clean', which is not an inherited for_each check" in msg
    own = write(
        "own.yaml",
        SPEC
        + '  - name: "stopped_at_its_stop[leg=leg1]"\n    override: true\n    why: w\n    expr: "`true` == `true`"\n',
    )
    (msg,) = errors_of(own)
    assert "which is not an inherited for_each check" in msg and msg.startswith(
        f"own.yaml:{len(SPEC.splitlines()) + 1}:"
    )


# ------------------------------------------------------------------ disable and override


def test_disable_takes_one_expansion_or_the_whole_family(capsys):
    path = child('disable:\n  "stopped_at_its_stop[leg=leg2]": leg 2 has no stop in this variant\n')
    checks = checks_of(path)
    assert "disabled" not in checks["stopped_at_its_stop[leg=leg1]"]
    assert checks["stopped_at_its_stop[leg=leg2]"]["disabled"] == "leg 2 has no stop in this variant"
    assert checks["stopped_at_its_stop[leg=leg2]"]["disabled_at"] == "child.yaml:5"
    rc, out, doc = run(path, "one", capsys)
    assert rc == Exit.PASS and doc["verdict"]["disabled"] == ["stopped_at_its_stop[leg=leg2]"]

    path = child("disable:\n  stopped_at_its_stop: this variant never stops\n")
    checks = checks_of(path)
    disabled = {n: c.get("disabled") for n, c in checks.items()}
    assert disabled == {
        "exit_clean": None,
        "stopped_at_its_stop[leg=leg1]": "this variant never stops",
        "stopped_at_its_stop[leg=leg2]": "this variant never stops",
    }
    # Leg 2 stops early: a disabled family never fails the verdict, and says so for each expansion.
    write("stops.yaml", SPEC.replace("'final_step': 20", "'final_step': 19"))
    rc, out, doc = run(path, "all", capsys)
    assert rc == Exit.PASS
    assert doc["verdict"]["disabled"] == ["stopped_at_its_stop[leg=leg1]", "stopped_at_its_stop[leg=leg2]"]
    assert "stopped_at_its_stop[leg=leg2]  DISABLED  this variant never stops (disabled at child.yaml:5)" in out


@pytest.mark.parametrize(
    "body, message",
    [
        (
            'disable:\n  "stopped_at_its_stop[leg=leg7]": typo\n',
            'child.yaml:5:3: $.disable["stopped_at_its_stop[leg=leg7]"]: disable names '
            "'stopped_at_its_stop[leg=leg7]', an expansion 'stopped_at_its_stop' does not have in mode "
            "'default'; its expansions: stopped_at_its_stop[leg=leg1], stopped_at_its_stop[leg=leg2]",
        ),
        (
            'disable:\n  "exit_clean[leg=leg1]": typo\n',
            "disable names 'exit_clean[leg=leg1]', one expansion of 'exit_clean', which is not an inherited "
            "for_each check",
        ),
        (
            'disable:\n  stopped_at_its_stop: not here\nchecks:\n  - name: "stopped_at_its_stop[leg=leg1]"\n'
            '    override: true\n    why: w\n    expr: "`true` == `true`"\n',
            "check 'stopped_at_its_stop[leg=leg1]' is both disabled here and written at child.yaml:7; delete the check instead",
        ),
    ],
)
def test_a_disable_that_names_no_expansion_is_refused(body, message):
    errors = errors_of(child(body))
    assert any(message in e for e in errors), errors


def test_override_replaces_one_expansion_or_the_whole_family(capsys):
    one = child(
        'checks:\n  - name: "stopped_at_its_stop[leg=leg2]"\n    override: true\n'
        "    why: leg 2 of this variant trains one step less\n"
        '    expr: "steps.leg2.harvest.run_json.final_step == `19`"\n'
    )
    checks = checks_of(one)
    assert list(checks) == ["exit_clean", "stopped_at_its_stop[leg=leg1]", "stopped_at_its_stop[leg=leg2]"]
    mine = checks["stopped_at_its_stop[leg=leg2]"]
    assert (mine["expr"], mine["file"], mine["line"]) == (
        "steps.leg2.harvest.run_json.final_step == `19`",
        "child.yaml",
        5,
    )
    assert "override" not in mine and checks["stopped_at_its_stop[leg=leg1]"]["expr"] == "let.run.final_step == `10`"
    write("stops.yaml", SPEC.replace("'final_step': 20", "'final_step': 19"))
    assert run(one, "one", capsys)[0] == Exit.PASS

    whole = child(
        "checks:\n  - name: stopped_at_its_stop\n    override: true\n    why: only the last leg counts here\n"
        '    expr: "steps.leg2.harvest.run_json.final_step == `19`"\n'
    )
    assert list(checks_of(whole)) == ["exit_clean", "stopped_at_its_stop"]

    missing = child(
        'checks:\n  - name: "stopped_at_its_stop[leg=leg3]"\n    override: true\n    why: w\n    expr: "`true` == `true`"\n'
    )
    (msg,) = errors_of(missing)
    assert msg.startswith("child.yaml:5:") and (
        "check 'stopped_at_its_stop[leg=leg3]' overrides an expansion 'stopped_at_its_stop' does not have in "
        "mode 'default'; its expansions: stopped_at_its_stop[leg=leg1], stopped_at_its_stop[leg=leg2]" in msg
    )


# ------------------------------------------------------------------ engine review


def test_engine_review_names_a_removed_expansion_as_a_removed_gate(tmp_path, capsys, monkeypatch):
    repo = tmp_path / "repo"
    (repo / "specs").mkdir(parents=True)
    (repo / "specs" / "stops.yaml").write_text(SPEC)
    monkeypatch.chdir(repo)
    assert main(["run", "specs/stops.yaml", "--run-dir", "evidence/stops"]) == Exit.PASS
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "the spec and its saved run")
    spec = repo / "specs" / "stops.yaml"
    spec.write_text(SPEC.replace("    - {leg: leg2, stop: 20, next: leg1}\n", ""))
    capsys.readouterr()
    from engine.cli import _parser
    from engine.diff.review import review_main

    out, err = io.StringIO(), io.StringIO()
    rc = review_main(_parser().parse_args(["review", "--base", "main"]), out, err)
    text = out.getvalue()
    assert rc == 1, text + err.getvalue()
    assert "gate `stopped_at_its_stop[leg=leg2]` removed" in text
    assert f"(main:specs/stops.yaml:{FAMILY_LINE})" in text
    assert "stopped_at_its_stop[leg=leg1]" not in text.split("risky changes")[1].split("----")[0]


# ------------------------------------------------------------------ plots


PLOT = """\
plots:
  loss:
    title: Loss per leg
    why: every leg's curve
    series:
      - {for_each: {leg: "values.stops"}, label: "${leg} (to ${leg.stop})", points: "steps.${leg}.harvest.run_json.losses"}
"""


def test_a_for_each_series_draws_every_element(capsys):
    from engine.show.plots import for_spec

    path = write("stops.yaml", SPEC + PLOT)
    (plot,) = build_plan(load_spec(path), environ={}).plots
    assert [(s.label, s.points) for s in plot.series] == [
        ("leg1 (to 10)", "steps.leg1.harvest.run_json.losses"),
        ("leg2 (to 20)", "steps.leg2.harvest.run_json.losses"),
    ]
    rc, out, doc = run(path, "run", capsys, "--markdown", "s.md")
    assert rc == Exit.PASS
    (figure,) = for_spec(load_spec(path), doc)
    assert [(s.label, s.points) for s in figure.series] == [("leg1 (to 10)", [(1, 6.0)]), ("leg2 (to 20)", [(11, 4.0)])]
    assert 'line "leg1 (to 10) + leg2 (to 20)" [' in Path("s.md").read_text()


@pytest.mark.parametrize(
    "old, new, where, message",
    [
        (
            "{leg: leg2, stop: 20",
            "{leg: leg7, stop: 20",
            "$.plots.loss.series[0].points",
            "steps.leg7.harvest.run_json.losses: no step named 'leg7'; steps: leg1, leg2",
        ),
        (
            'for_each: {leg: "values.stops"}, label',
            'for_each: {leg: "values.stop1"}, label',
            "$.plots.loss.series[0].for_each.leg",
            "for_each leg: 'values.stop1' is 10, not a list",
        ),
        (
            "(to ${leg.stop})",
            "(to ${leg.stp})",
            "$.plots.loss.series[0].label",
            "${leg.stp}: the element has no field 'stp'",
        ),
    ],
)
def test_a_for_each_series_is_validated_per_element(old, new, where, message):
    text = SPEC + PLOT
    assert old in text
    errors = errors_of(write("stops.yaml", text.replace(old, new) if old in PLOT else SPEC.replace(old, new) + PLOT))
    assert any(f": {where}: " in e and message in e for e in errors), errors
