"""Property: whatever text or structure a spec file holds, loading and validating it only ever yields
SpecErrors (raised by load_spec, returned by validate), never another exception. A spec that validates
clean must also plan in every mode."""

import copy
from pathlib import Path

import yaml
from engine_helpers import YAML_PIECES
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.spec.load import load_spec
from engine.spec.located import SpecError, SpecErrors
from engine.spec.plan import build_plan, mode_names
from engine.spec.validate import validate

SETTINGS = settings(
    max_examples=120,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

VALID = {
    "version": 1,
    "name": "fuzz",
    "budget_s": 1000,
    "mode_env": "FUZZ_MODE",
    "env": {"FUZZ_N": "n"},
    "values": {
        "n": 2,
        "m": {"eval": "mul(n, `3`)"},
        "s": "${run_dir}/x-${n}",
        "w": {"switch": "mode", "cases": {"a": 1, "b": 2}},
        "lst": ["--n", "${n}"],
    },
    "modes": {"default": "a", "a": {"t": 10}, "b": {"t": 20}},
    "steps": [
        {
            "name": "leg",
            "when": "n > `1`",
            "run": {
                "argv": ["${python}", "-c", "pass", "${lst}"],
                "timeout_s": "${t}",
                "grace_s": 1,
                "output": {
                    "strip_prefix": "^x",
                    "harvest": {"rj": {"marker": "RJ ", "pick": "all"}},
                    "failure_patterns": ["Error"],
                },
                "signals": [{"match": "^boom ${n}", "signal": "SIGTERM"}],
                "progress": {"match": "(?P<step>\\d+)"},
            },
        },
        {"name": "wipe", "remove": ["${s}"]},
        {"name": "st", "collect": {"collector": "command", "args": {"argv": ["true"], "timeout_s": 5}}},
    ],
    "checks": [
        {
            "name": "c",
            "why": "w",
            "expr": "steps.leg.harvest.rj[0].x == values.m && state.st != `null`",
            "when": "mode == 'a'",
            "severity": "warn",
        }
    ],
}

TOKENS = [
    *YAML_PIECES,
    "name: x\n",
    "extends: x.yaml\n",
    "include: [a]\n",
    "name: ",
    "<<: ",
    "${n}",
    "switch: ",
    "cases: ",
    "timeout_s: ",
    "0",
    "1e9",
    "-1",
    "null",
    "true",
    "~",
    "!!binary aGk=",
    "|\n  x\n",
    "...\n",
    "%YAML 1.1\n",
    "\x00",
    "é",
    "#c\n",
]

KEYS = [
    "version",
    "name",
    "budget_s",
    "values",
    "modes",
    "steps",
    "checks",
    "run",
    "argv",
    "timeout_s",
    "grace_s",
    "remove",
    "collect",
    "collector",
    "args",
    "expr",
    "why",
    "when",
    "severity",
    "eval",
    "switch",
    "cases",
    "default",
    "output",
    "harvest",
    "marker",
    "pick",
    "signals",
    "match",
    "signal",
    "progress",
    "env",
    "x",
]

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-5, 10**6),
    st.floats(allow_nan=True),
    st.sampled_from(
        [
            "",
            "x",
            "${n}",
            "${nope}",
            "`1`",
            "mul(n)",
            "steps.leg.rc",
            "a ==",
            "(?P<step>",
            "SIGKILL",
            "last",
            "${n}${n}",
            "$${n}",
        ]
    ),
    st.text(max_size=8),
)
structures = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.sampled_from(KEYS), inner, max_size=5)),
    max_leaves=25,
)


def _paths(node, prefix=()):
    yield prefix
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _paths(v, prefix + (i,))


def _replace(doc, path, value):
    if not path:
        return value
    out = copy.deepcopy(doc)
    node = out
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = value
    return out


def check_file(path: Path) -> None:
    try:
        spec = load_spec(path)
    except SpecErrors as e:
        assert e.errors and all(isinstance(x, SpecError) for x in e.errors)
        assert all(x.line >= 0 and x.col >= 0 and x.path.startswith("$") for x in e.errors)
        return
    errors = validate(spec, environ={})
    assert all(isinstance(x, SpecError) for x in errors)
    if not errors:
        for mode in mode_names(spec.data) or ["default"]:
            build_plan(spec, mode=mode, environ={}, builtins={"run_dir": "/r", "run_id": "i"})


def test_the_base_document_is_valid(tmp_path):
    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump(VALID))
    assert validate(load_spec(p), environ={}) == []


@SETTINGS
@given(st.lists(st.sampled_from(TOKENS), max_size=30))
def test_random_yaml_text_only_yields_spec_errors(tmp_path, tokens):
    p = tmp_path / "s.yaml"
    p.write_bytes("".join(tokens).encode("utf-8"))
    check_file(p)


@SETTINGS
@given(st.text(max_size=200))
def test_arbitrary_text_only_yields_spec_errors(tmp_path, text):
    p = tmp_path / "s.yaml"
    p.write_bytes(text.encode("utf-8", "surrogatepass"))
    check_file(p)


@SETTINGS
@given(st.data())
def test_mutated_valid_spec_only_yields_spec_errors(tmp_path, data):
    paths = list(_paths(VALID))
    doc = VALID
    for _ in range(data.draw(st.integers(1, 3))):
        target = data.draw(st.sampled_from(paths))
        try:
            doc = _replace(doc, target, data.draw(structures))
        except (KeyError, IndexError, TypeError):
            continue  # an earlier mutation removed this path
    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump(doc, allow_unicode=True))
    check_file(p)
