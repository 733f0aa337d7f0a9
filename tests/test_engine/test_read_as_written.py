"""What reaches a leg's argv and environment is what was written, or the spec is refused, naming
where: YAML folds a line break into a space (`owner/name` and `--delete-everything` became one
argument, silently), drops a `#` comment and the blanks around a plain scalar, and reads `010` as 8
and `12:30` as 750. None of it may happen quietly, from the environment, from --set, or from the spec
file; what is quoted, or written as a block scalar, is taken as written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from engine_helpers import LEG, write_spec

from engine.spec.load import load_spec
from engine.spec.validate import validate

SPEC = """\
version: 1
name: literal
budget_s: 100
env:
  PROBE_REPO: repo
values:
  repo: owner/name
steps:
  - name: leg
    run:
      argv: ["${{python}}", "{leg}", "@pidfile:{pidfile}", "@env:REPO", "${{repo}}"]
      env:
        REPO: "${{repo}}"
{extra_env}      timeout_s: 30
checks:
  - name: ran
    why: >
      Prose may be folded: a check's why is read by people,
      not by a leg.
    expr: "steps.leg.rc == `0`"
"""


def literal_spec(tmp_path: Path, extra_env: str = "") -> Path:
    return write_spec(tmp_path / "s.yaml", SPEC.format(leg=LEG, pidfile=tmp_path / "leg.pid", extra_env=extra_env))


def test_an_environment_value_holding_a_line_break_is_refused_naming_its_env_entry(engine, tmp_path, monkeypatch):
    spec = literal_spec(tmp_path)
    monkeypatch.setenv("PROBE_REPO", "owner/name\n--delete-everything")
    ran = engine("run", str(spec), "--run-dir", str(tmp_path / "r"), expect=2)
    assert not (tmp_path / "leg.pid").exists()  # no leg ran
    assert (
        f"{spec}:5:15: $.env.PROBE_REPO: the environment variable PROBE_REPO (value 'repo'): it holds a "
        "line break, which YAML would fold into a space" in ran.out + ran.err
    )
    ran = engine("validate", str(spec), expect=2)
    assert "$.env.PROBE_REPO: the environment variable PROBE_REPO" in ran.out


@pytest.mark.parametrize(
    "text, says",
    [
        ("owner/name #1", "YAML would read 'owner/name #1' as 'owner/name' (a ` #` starts a comment); quote it"),
        ("owner/name ", "YAML would read 'owner/name ' as 'owner/name' (its blanks at either end are dropped)"),
        ("010", "YAML 1.1 would read '010' as 8; quote it ('...') to mean the text"),
        ("12:30", "YAML 1.1 would read '12:30' as 750; quote it ('...') to mean the text"),
        ("", "it is set but empty (YAML would read null); unset it to keep the spec's value"),
    ],
)
def test_an_environment_value_yaml_would_change_is_refused_saying_how(tmp_path, text, says):
    errors = validate(load_spec(literal_spec(tmp_path)), environ={"PROBE_REPO": text})
    assert len(errors) == 1
    assert errors[0].message.startswith(f"the environment variable PROBE_REPO (value 'repo'): {says}")


def test_a_set_value_yaml_would_change_is_refused_and_a_quoted_one_reaches_the_leg_as_written(engine, tmp_path):
    spec = literal_spec(tmp_path)
    for text, says in [
        ("owner/name\n--delete-everything", "--set repo: it holds a line break"),
        ("owner/name #1", "--set repo: YAML would read 'owner/name #1' as 'owner/name'"),
    ]:
        ran = engine("run", str(spec), "--run-dir", str(tmp_path / "r"), "--set", f"repo={text}", expect=2)
        assert says in ran.err and not (tmp_path / "leg.pid").exists()
    engine("run", str(spec), "--run-dir", str(tmp_path / "r"), "--set", "repo='owner/name #1'", expect=0)
    log = (tmp_path / "r" / "logs" / "leg.log").read_text().splitlines()
    assert log[0] == "REPO=owner/name #1" and log[1] == "owner/name #1"


def test_a_spec_value_yaml_folded_over_lines_is_refused_naming_the_step_s_env_key(tmp_path):
    spec = literal_spec(tmp_path, "        EXTRA: owner/name\n          --delete-everything\n")
    errors = [str(e) for e in validate(load_spec(spec), environ={})]
    assert errors == [
        f"{spec}:14:16: $.steps[0].run.env.EXTRA: this reads 'owner/name --delete-everything': written over "
        "several lines without `|` or `>`: YAML folds each line break into a space; write it on one line, or "
        "as a block scalar (`|` keeps the line breaks, `>-` folds them on purpose)"
    ]


def test_octal_and_base_60_numbers_in_a_spec_are_refused_where_they_reach_a_leg(tmp_path):
    text = SPEC.format(leg=LEG, pidfile=tmp_path / "leg.pid", extra_env="        SEED: 010\n")
    path = write_spec(tmp_path / "s.yaml", text.replace("  repo: owner/name\n", "  repo: owner/name\n  at: 12:30\n"))
    assert [e.message for e in validate(load_spec(path), environ={})] == [
        "this reads 750: YAML 1.1 reads 12:30 as a base-60 number; quote it ('12:30') to mean the text",
        "this reads 8: YAML 1.1 reads 010 as an octal number; quote it ('010') to mean the text",
    ]


def test_a_line_break_written_on_purpose_reaches_the_leg_exactly(engine, tmp_path):
    # A block scalar, an escaped \n, an empty line in quotes (how a YAML emitter writes a line break):
    # the author means the line break, and the leg gets it.
    show = "import json, os; print(json.dumps([os.environ[k] for k in ('BLOCK', 'ESCAPED', 'EMITTED')]))"
    spec = write_spec(
        tmp_path / "s.yaml",
        "version: 1\nname: literal\nbudget_s: 100\nsteps:\n  - name: leg\n    run:\n"
        f'      argv: ["${{python}}", "-c", "{show}"]\n'
        '      env:\n        BLOCK: |\n          first\n          second\n        ESCAPED: "a\\nb"\n'
        "        EMITTED: 'c\n\n          d'\n"
        "      timeout_s: 30\n"
        'checks:\n  - {name: ran, why: w, expr: "steps.leg.rc == `0`"}\n',
    )
    engine("run", str(spec), "--run-dir", str(tmp_path / "r"), expect=0)
    shown = json.loads((tmp_path / "r" / "logs" / "leg.log").read_text().splitlines()[0])
    assert shown == ["first\nsecond\n", "a\nb", "c\nd"]
