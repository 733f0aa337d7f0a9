"""build_plan: mode choice, resolved steps with defaults, checks, budget arithmetic, fingerprints, describe."""

import copy
from pathlib import Path

import pytest

from engine.spec.load import load_spec
from engine.spec.located import SpecErrors
from engine.spec.plan import UsageError, build_plan, fingerprint
from engine.spec.validate import validate

ROOT = Path(__file__).resolve().parents[2]
PROBE = ROOT / "tests" / "specs" / "plan" / "probe.yaml"
BUILTINS = {"run_dir": "/runs/r1", "run_id": "r1"}


@pytest.fixture(autouse=True)
def _at_repo_root(monkeypatch):
    monkeypatch.chdir(ROOT)


@pytest.fixture(scope="module")
def spec():
    return load_spec(PROBE)


def plan(spec, **kw):
    kw.setdefault("environ", {})
    kw.setdefault("builtins", BUILTINS)
    return build_plan(spec, **kw)


def test_fixture_spec_is_valid(spec):
    assert validate(spec, environ={}) == []


def test_mode_comes_from_arg_then_mode_env_then_default(spec):
    assert plan(spec).mode == "smoke"
    assert plan(spec, environ={"PROBE_MODE": "soak"}).mode == "soak"
    assert plan(spec, mode="smoke", environ={"PROBE_MODE": "soak"}).mode == "smoke"


def test_unknown_mode_lists_the_known_ones(spec):
    with pytest.raises(UsageError, match=r"unknown mode 'sock' \(from --mode\); known modes: smoke, soak"):
        plan(spec, mode="sock")
    with pytest.raises(UsageError, match=r"\(from PROBE_MODE\)"):
        plan(spec, environ={"PROBE_MODE": "x"})


def test_bad_set_is_a_usage_error(spec):
    with pytest.raises(UsageError, match="--set nope: unknown value; known: "):
        plan(spec, sets=["nope=1"])
    with pytest.raises(UsageError, match="expected NAME=VALUE"):
        plan(spec, sets=["steps"])


def test_values_and_sources(spec):
    p = plan(spec, mode="soak", sets=["tps=8"], environ={"PROBE_REPO": "hf://o/probe"})
    assert p.values["tokens"] == 180 * 8
    assert p.values["push_steps"] == [60, 120]
    assert p.values["repo"] == "hf://o/probe"
    assert p.values["store_root"] == "/runs/r1/store"
    assert p.values["mode"] == "soak"
    assert (p.sources["tps"], p.sources["repo"], p.sources["tokens"], p.sources["steps"], p.sources["run_id"]) == (
        "--set",
        "env",
        "derived",
        "mode",
        "builtin",
    )
    assert p.secret_names == ["hf_token"]
    assert p.values["hf_token"] == "hf_sekrit_value"  # the runner needs the real value


def test_steps_are_resolved_with_defaults_and_locations(spec):
    p = plan(spec)
    leg1 = p.steps[0]
    assert leg1["name"] == "leg1" and leg1["kind"] == "run" and leg1["enabled"] is True
    assert (leg1["file"], leg1["line"]) == ("tests/specs/plan/lib/base.yaml", 24)
    run = leg1["run"]
    assert run["argv"][1:2] == ["-c"] and run["argv"][-2:] == ["--steps", "20"]  # list value spliced
    assert run["timeout_s"] == 60 and run["grace_s"] == 30 and run["ok_exit_codes"] == [0]
    assert run["env"] == {"PYTHONUNBUFFERED": "1", "HF_TOKEN": "hf_sekrit_value"}
    assert run["output"]["harvest"] == {
        "run_json": {"marker": "RUN_JSON ", "pick": "last", "on_conflict": "fail", "on_malformed": "fail"}
    }
    assert run["output"]["failure_lines"] == 45 and run["output"]["tail_lines"] == 40
    assert run["signals"] == [{"match": "^CKPT push step=10 ", "signal": "SIGKILL", "after_s": 0}]
    assert run["progress"] == {"match": r"^step (?P<step>\d+)/(?P<total>\d+)", "every_s": 30}
    assert run["stop_on_failure"] is False and run["precondition"] is None
    wipe = next(s for s in p.steps if s["name"] == "wipe")
    assert wipe["remove"] == ["/runs/r1/store"]


def test_when_false_disables_a_step_and_its_budget(spec):
    on = plan(spec)
    off = plan(spec, sets=["target=real"])
    assert [s["enabled"] for s in off.steps if s["name"] == "leg2"] == [False]
    assert on.worst_case_s == 90 + 25 + 35  # leg1 60+30, command collector 20+5 (its grace), leg2 30+5
    assert off.worst_case_s == 90 + 25
    assert on.contributions() == [("leg1", 90.0), ("leg2", 35.0), ("state_after_leg1", 25.0)]


def test_checks_carry_defaults_and_their_origin(spec):
    checks = {c["name"]: c for c in plan(spec).checks}
    assert checks["leg1_stopped_at_the_stop_step"]["severity"] == "gate"
    assert checks["leg1_stopped_at_the_stop_step"]["file"] == "tests/specs/plan/lib/base.yaml"
    assert checks["state_collected"]["severity"] == "warn"
    assert checks["leg1_ok"]["file"] == "tests/specs/plan/probe.yaml"


def test_fingerprints_ignore_output_rules_but_not_the_command(spec):
    p = plan(spec)
    leg1 = p.steps[0]
    assert p.fingerprints["leg1"] == fingerprint(leg1)
    changed_output = copy.deepcopy(leg1)
    changed_output["run"]["output"]["harvest"]["other"] = {"marker": "X", "pick": "all"}
    changed_output["line"] = 999
    assert fingerprint(changed_output) == fingerprint(leg1)
    changed_cmd = copy.deepcopy(leg1)
    changed_cmd["run"]["timeout_s"] = 61
    assert fingerprint(changed_cmd) != fingerprint(leg1)
    assert plan(spec, mode="soak").fingerprints["leg1"] != p.fingerprints["leg1"]  # argv differs per mode
    assert plan(spec).fingerprints == p.fingerprints  # stable for the same inputs


def test_describe_shows_everything_but_secrets(spec):
    text = plan(spec).describe()
    assert "hf_sekrit_value" not in text
    assert "HF_TOKEN=<redacted>" in text
    assert 'hf_token   = "<redacted>"  [default]' in text
    assert "budget 600 s, worst case 150 s, headroom 450 s" in text
    assert "timeout 60 s + grace 30 s, ok exit codes [0]" in text
    assert "  4. leg2 [run] tests/specs/plan/probe.yaml:8" in text
    assert "(skipped: when is not true)" in plan(spec, sets=["target=real"]).describe()
    assert "tokens     = 80  [derived]" in text


def test_spec_errors_surface_from_build_plan(tmp_path):
    p = tmp_path / "s.yaml"
    p.write_text(
        "version: 1\nname: s\nbudget_s: 9\nvalues: {t: soon}\n"
        "steps: [{name: a, run: {argv: [x], timeout_s: '${t}'}}]\n"
        "checks: [{name: c, why: w, expr: '`true`'}]\n"
    )
    with pytest.raises(SpecErrors) as e:
        build_plan(load_spec(p), environ={})
    assert [x.path for x in e.value.errors] == ["$.steps[0].run.timeout_s"]
    assert "'soon' is not of type 'number'" in str(e.value)


def test_spec_without_modes_runs_in_mode_default(tmp_path):
    p = tmp_path / "s.yaml"
    p.write_text(
        "version: 1\nname: s\nbudget_s: 9\n"
        "steps: [{name: a, remove: '${run_dir}/x'}]\n"
        "checks: [{name: c, why: w, expr: '`true`'}]\n"
    )
    pl = build_plan(load_spec(p), environ={}, builtins={"run_dir": "/r"})
    assert pl.mode == "default" and pl.steps[0]["remove"] == ["/r/x"] and pl.worst_case_s == 0
    with pytest.raises(UsageError, match="this spec has no modes"):
        build_plan(load_spec(p), mode="soak", environ={})
