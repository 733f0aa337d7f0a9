"""Value layering, derived values and templating."""

import pytest

from engine.spec.located import SpecError
from engine.spec.values import UsageError, layer, parse_scalar, parse_sets, refs, resolve, template

BUILTINS = {
    "python": "/usr/bin/python3",
    "work_dir": "/w",
    "spec_dir": "/w/specs",
    "run_dir": "/w/runs/r1",
    "run_id": "20260101T000000Z",
    "mode": "smoke",
}

DATA = {
    "env": {"PROBE_REPO": "repo", "PROBE_STEPS": "steps"},
    "values": {
        "tps": 262144,
        "tokens": {"eval": "mul(steps, tps)"},
        "push_steps": {"eval": "range(push_every, add(stop1, `1`), push_every)"},
        "target": "local",
        "nproc": {"switch": "target", "cases": {"local": 2, "real": 4}},
        "store_root": "${run_dir}/store",
        "repo": "file://${store_root}/probe/ckpt-${run_id}",
        "steps": 1,
    },
    "modes": {
        "default": "smoke",
        "smoke": {"steps": 20, "push_every": 10, "stop1": 10},
        "soak": {"steps": 180, "push_every": 60, "stop1": 120},
    },
}


def resolved(mode="smoke", environ=None, sets=None, data=DATA):
    r = resolve(layer(data, mode, environ or {}, sets or {}, dict(BUILTINS, mode=mode)))
    assert r.errors == []
    return r


def test_mode_values_and_derived_values_resolve_in_dependency_order():
    r = resolved("soak")
    assert r.values["steps"] == 180
    assert r.values["tokens"] == 180 * 262144
    assert r.values["push_steps"] == [60, 120]
    assert r.values["nproc"] == 2
    assert r.values["repo"] == "file:///w/runs/r1/store/probe/ckpt-20260101T000000Z"


def test_sources_record_each_layer():
    r = resolved("smoke", environ={"PROBE_REPO": "hf://o/n"}, sets={"stop1": 25})
    assert r.sources["python"] == "builtin"
    assert r.sources["tps"] == "default"
    assert r.sources["steps"] == "mode"
    assert r.sources["repo"] == "env"
    assert r.sources["stop1"] == "--set"
    assert r.sources["tokens"] == "derived"
    assert r.sources["store_root"] == "derived"
    assert r.values["push_steps"] == [10, 20]  # derived from the --set value


def test_precedence_builtin_default_mode_env_set():
    assert resolved().values["steps"] == 20
    assert resolved(environ={"PROBE_STEPS": "30"}).values["steps"] == 30  # env text parsed as YAML: int
    assert resolved(environ={"PROBE_STEPS": "30"}, sets={"steps": 40}).values["steps"] == 40


def test_overriding_a_derived_value_replaces_the_derivation():
    r = resolved(sets={"tokens": 7})
    assert r.values["tokens"] == 7 and r.sources["tokens"] == "--set"


def test_parse_sets_parses_yaml_scalars():
    assert parse_sets(["steps=30", "repo=hf://o/n", "flag=true", "lst=[10, 20]", "empty="]) == {
        "steps": 30,
        "repo": "hf://o/n",
        "flag": True,
        "lst": [10, 20],
        "empty": None,
    }


@pytest.mark.parametrize("bad", ["steps", "=3", "a b=1"])
def test_parse_sets_rejects_malformed_items(bad):
    with pytest.raises(UsageError, match="expected NAME=VALUE"):
        parse_sets([bad])


def test_unknown_set_key_names_the_known_ones():
    with pytest.raises(UsageError) as e:
        layer(DATA, "smoke", {}, {"stepz": 3}, BUILTINS)
    assert "--set stepz: unknown value; known: mode, nproc, push_every," in str(e.value)


def test_parse_scalar_keeps_unparseable_text():
    assert parse_scalar("a: b: c") == "a: b: c"
    assert parse_scalar("10") == 10
    assert parse_scalar("1e3") == "1e3"  # YAML 1.1: not a float without a dot


def test_switch_without_a_case_names_the_value_and_known_cases():
    r = resolve(layer(DATA, "smoke", {}, {"target": "cloud"}, BUILTINS))
    assert [e.message for e in r.errors] == ["value 'nproc': no case for target='cloud'; known cases: local, real"]


def test_cycle_is_reported_with_the_whole_cycle():
    data = {"values": {"a": {"eval": "add(b, `1`)"}, "b": "${c}", "c": {"eval": "a"}, "d": 1}}
    r = resolve(layer(data, None, {}, {}, {}))
    assert [e.message for e in r.errors] == ["value cycle: a -> b -> c -> a"]
    assert r.values == {"d": 1}


def test_eval_reading_an_unknown_value_is_an_error():
    r = resolve(layer({"values": {"a": {"eval": "mul(b, `2`)"}}}, None, {}, {}, {}))
    assert r.errors[0].message == "'mul(b, `2`)' reads unknown value 'b'; known: a"
    assert r.errors[0].path == "$.values.a.eval"


def test_eval_runtime_failure_is_located():
    r = resolve(layer({"values": {"a": "x", "b": {"eval": "add(a, `1`)"}}}, None, {}, {}, {}))
    assert r.errors[0].path == "$.values.b.eval"
    assert "'add(a, `1`)' failed: " in r.errors[0].message


def test_errors_are_located_through_the_locate_callback():
    r = resolve(layer({"values": {"a": "${nope}"}}, None, {}, {}, {}), lambda p: ("s.yaml", 4, 3))
    (e,) = r.errors
    assert str(e) == "s.yaml:4:3: $.values.a: uses unknown value ${nope}; known: a"


def test_whole_string_reference_keeps_type_and_embedded_becomes_text():
    values = {"n": 30, "flag": True, "lst": [1, 2], "s": "x"}
    assert template("${n}", values) == 30
    assert template("--steps=${n}", values) == "--steps=30"
    assert template("${flag}-${lst}", values) == "true-[1, 2]"
    assert template({"a": ["${s}", {"b": "${n}"}]}, values) == {"a": ["x", {"b": 30}]}


def test_list_reference_splices_into_a_list():
    values = {"torchrun": ["torchrun", "--nproc_per_node=2"], "n": 3}
    assert template(["${torchrun}", "train.py", "--n", "${n}", "x${n}"], values) == [
        "torchrun",
        "--nproc_per_node=2",
        "train.py",
        "--n",
        3,
        "x3",
    ]


def test_double_dollar_escapes_a_reference():
    assert template("echo $${HOME} ${n} $$ $f", {"n": 1}) == "echo ${HOME} 1 $$ $f"
    assert refs("$${HOME} ${a}${b}") == ["a", "b"]


def test_unknown_reference_names_the_variable_and_where():
    with pytest.raises(SpecError) as e:
        template({"argv": ["x", "${missing}"]}, {"a": 1}, ("steps", 0, "run"), lambda p: ("f.yaml", 9, 7))
    assert str(e.value) == "f.yaml:9:7: $.steps[0].run.argv[1]: unknown value ${missing}; known: a"
