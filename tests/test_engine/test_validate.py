"""Semantic validation cases the golden files do not pin: per-mode behaviour, environment, the shipped specs."""

from pathlib import Path

import pytest
import yaml

from engine.spec.load import load_spec
from engine.spec.validate import validate

ROOT = Path(__file__).resolve().parents[2]

BASE = {
    "version": 1,
    "name": "v",
    "budget_s": 100,
    "modes": {"default": "a", "a": {"n": 1, "t": 10}, "b": {"n": 2, "t": 20}},
    "steps": [{"name": "leg", "run": {"argv": ["true"], "timeout_s": "${t}"}}],
    "checks": [{"name": "c", "why": "w", "expr": "steps.leg.rc == `0`"}],
}


def spec_of(tmp_path, doc):
    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump(doc, sort_keys=False))
    return load_spec(p)


def messages(tmp_path, doc, environ=None):
    return [e.message for e in validate(spec_of(tmp_path, doc), environ=environ or {})]


def test_base_is_valid(tmp_path):
    assert messages(tmp_path, BASE) == []


def test_unknown_reference_in_only_one_mode_names_that_mode(tmp_path):
    doc = dict(BASE, modes={"default": "a", "a": {"n": 1, "t": 10, "extra": "x"}, "b": {"n": 2, "t": 20}})
    doc["steps"] = [{"name": "leg", "run": {"argv": ["${extra}"], "timeout_s": "${t}"}}]
    assert messages(tmp_path, doc) == [
        "mode 'b' does not define 'extra' (mode 'a' does); every mode must define the same keys",
        "unknown value ${extra} in mode b",
    ]


def test_templated_regex_is_checked_in_each_mode(tmp_path):
    doc = dict(BASE, modes={"default": "a", "a": {"n": "1", "t": 10}, "b": {"n": "(", "t": 20}})
    doc["steps"] = [
        {
            "name": "leg",
            "run": {"argv": ["true"], "timeout_s": "${t}", "signals": [{"match": "^step ${n}", "signal": "SIGKILL"}]},
        }
    ]
    (msg,) = messages(tmp_path, doc)
    assert msg.startswith("bad regex '^step (': missing ), unterminated subpattern")


def test_budget_counts_timeout_plus_grace_and_fits_exactly(tmp_path):
    doc = dict(BASE, budget_s=50)  # mode b: 20 + default grace 30 = 50
    assert messages(tmp_path, doc) == []
    doc = dict(BASE, budget_s=49)
    assert messages(tmp_path, doc) == ["mode 'b': worst case 50 s exceeds budget_s 49 s (biggest: leg 50 s)"]


def test_environment_overrides_take_part_in_validation(tmp_path):
    doc = dict(BASE, env={"V_T": "t"})
    assert messages(tmp_path, doc, {"V_T": "500"}) == [
        "mode 'a': worst case 530 s exceeds budget_s 100 s (biggest: leg 530 s)",
        "mode 'b': worst case 530 s exceeds budget_s 100 s (biggest: leg 530 s)",
    ]
    assert messages(tmp_path, doc, {"V_T": "soon"}) == [
        "in mode 'a' after substitution: 'soon' is not of type 'number'",
        "in mode 'b' after substitution: 'soon' is not of type 'number'",
    ]


def test_step_when_must_read_known_values(tmp_path):
    doc = dict(BASE, steps=[{"name": "leg", "when": "nn == `1`", "run": {"argv": ["true"], "timeout_s": 1}}])
    (msg,) = messages(tmp_path, doc)
    assert msg.startswith("step condition 'nn == `1`' reads unknown value 'nn'; known: mode, n, python,")


def test_command_collector_timeout_must_be_a_number(tmp_path):
    doc = dict(
        BASE,
        steps=BASE["steps"]
        + [{"name": "st", "collect": {"collector": "command", "args": {"argv": ["true"], "timeout_s": "x"}}}],
    )
    assert messages(tmp_path, doc) == [
        "the command collector's timeout_s must be a positive number of seconds and grace_s a non-negative one "
        "(got timeout_s='x', grace_s=None)"
    ]


def test_errors_are_all_returned_in_file_order(tmp_path):
    doc = dict(
        BASE,
        checks=[
            {"name": "c", "why": "w", "expr": "steps.nope.rc"},
            {"name": "c", "why": "w", "expr": "nope(steps.leg.rc)"},
        ],
    )
    errs = validate(spec_of(tmp_path, doc), environ={})
    assert [e.path for e in errs] == ["$.checks[0].expr", "$.checks[1].name", "$.checks[1].expr"]
    assert [e.line for e in errs] == sorted(e.line for e in errs)


@pytest.mark.parametrize("spec", sorted((ROOT / "specs").glob("*.yaml")), ids=lambda p: p.stem)
def test_shipped_specs_validate(spec, monkeypatch):
    monkeypatch.chdir(ROOT)
    assert [str(e) for e in validate(load_spec(spec.relative_to(ROOT)), environ={})] == []


def test_harvest_regex_must_compile_and_name_what_it_harvests(tmp_path):
    def with_harvest(rule):
        return dict(
            BASE,
            steps=[{"name": "leg", "run": {"argv": ["true"], "timeout_s": 10, "output": {"harvest": {"p": rule}}}}],
        )

    assert messages(tmp_path, with_harvest({"match": r"^step (?P<step>\d+)"})) == []
    assert messages(tmp_path, with_harvest({"match": r"^step \d+"})) == [
        r"harvest regex '^step \\d+' has no named group (?P<name>...) to harvest"
    ]
    assert messages(tmp_path, with_harvest({"match": "("}))[0].startswith("bad regex '(':")
    from engine.spec.located import SpecErrors

    with pytest.raises(SpecErrors, match="a harvest rule needs exactly one of marker, match"):
        spec_of(tmp_path, with_harvest({"match": "(?P<a>x)", "marker": "M "}))


def test_progress_total_is_a_value_and_each_phase_regex_must_compile(tmp_path):
    def with_progress(progress):
        step = {"name": "leg", "run": {"argv": ["true"], "timeout_s": 10, "progress": progress}}
        return dict(BASE, steps=[step])

    good = {"match": r"^step (?P<step>\d+)/\d+", "total": "${n}", "phases": {"pushing": "^CKPT save "}}
    assert messages(tmp_path, with_progress(good)) == []
    bad = dict(good, phases={"pushing": "^CKPT (save"})
    (error,) = validate(spec_of(tmp_path, with_progress(bad)), environ={})
    assert error.message.startswith("bad regex '^CKPT (save':")
    assert ".progress.phases.pushing" in str(error) and str(error).startswith(f"{tmp_path / 's.yaml'}:")
    from engine.spec.located import SpecErrors

    with pytest.raises(SpecErrors, match=r"progress.total: 0 is less than the minimum of 1"):
        spec_of(tmp_path, with_progress(dict(good, total=0)))


def test_a_bare_null_in_a_value_eval_or_a_step_when_is_refused_with_its_fix(tmp_path):
    doc = dict(BASE, values={"nothing": {"eval": "null"}})
    doc["steps"] = [dict(BASE["steps"][0], when="mode == false")]
    assert sorted(messages(tmp_path, doc)) == [
        "bare false is a JMESPath field name (it reads a field called false), not the literal: "
        "write `false` in backticks: mode == `false`",
        "bare null is a JMESPath field name (it reads a field called null), not the literal: "
        "write `null` in backticks: `null`",
    ]
