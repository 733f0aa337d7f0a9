"""Loading specs: located YAML, extends/include merging, schema errors with file:line:col."""

import json
from pathlib import Path

import jsonschema
import pytest

from engine.spec.load import load_spec, schema, schema_text
from engine.spec.located import SpecError, SpecErrors, json_path

ROOT = Path(__file__).resolve().parents[2]
LOAD = ROOT / "tests" / "specs" / "load"


@pytest.fixture(autouse=True)
def _at_repo_root(monkeypatch):
    # Files are reported relative to the cwd; pin it so messages are stable.
    monkeypatch.chdir(ROOT)


def write(tmp_path, text, name="s.yaml"):
    p = tmp_path / name
    p.write_text(text)
    return p


def errors_of(path):
    with pytest.raises(SpecErrors) as e:
        load_spec(path)
    return [str(x) for x in e.value.errors]


def test_extends_and_include_merge_maps_deeply_and_named_lists_by_name():
    spec = load_spec(LOAD / "child.yaml")
    d = spec.data
    assert d["name"] == "child"
    assert d["values"] == {"a": 1, "nested": {"x": 1, "y": 20, "z": 30}, "lst": [9], "from_fragment": 7}
    assert [(s["name"], s["remove"]) for s in d["steps"]] == [
        ("one", "/tmp/specprobe-one"),
        ("two", "/tmp/specprobe-two-replaced"),
        ("three", "/tmp/specprobe-three"),
    ]
    assert [c["name"] for c in d["checks"]] == ["first", "second", "from_fragment", "third"]
    assert "extends" not in d and "include" not in d


def test_every_merged_node_keeps_the_file_and_line_it_came_from():
    spec = load_spec(LOAD / "child.yaml")
    assert spec.locate(("checks", 0)) == ("tests/specs/load/lib/parent.yaml", 14, 5)
    assert spec.locate(("checks", 1, "expr")) == ("tests/specs/load/child.yaml", 18, 11)
    assert spec.locate(("checks", 2)) == ("tests/specs/load/lib/fragment.yaml", 4, 5)
    assert spec.locate(("values", "nested", "x")) == ("tests/specs/load/lib/parent.yaml", 6, 15)
    assert spec.locate(("values", "nested", "z")) == ("tests/specs/load/child.yaml", 6, 22)
    # An absent path falls back to its nearest located ancestor.
    assert spec.locate(("steps", 0, "run", "nope")) == ("tests/specs/load/lib/parent.yaml", 9, 5)


def test_files_lists_every_file_with_its_sha256():
    import hashlib

    spec = load_spec(LOAD / "child.yaml")
    assert set(spec.files) == {
        "tests/specs/load/child.yaml",
        "tests/specs/load/lib/parent.yaml",
        "tests/specs/load/lib/fragment.yaml",
    }
    for f, digest in spec.files.items():
        assert digest == hashlib.sha256((ROOT / f).read_bytes()).hexdigest()
    assert spec.sha256 == spec.files["tests/specs/load/child.yaml"]


def test_include_of_itself_is_a_cycle():
    assert errors_of(LOAD / "self_include.yaml") == [
        "tests/specs/load/self_include.yaml:1:11: $.include[0]: extends/include cycle: "
        "tests/specs/load/self_include.yaml -> tests/specs/load/self_include.yaml"
    ]


def test_yaml_syntax_error_has_line_and_column(tmp_path):
    (e,) = errors_of(write(tmp_path, "version: 1\nname: [a\nbudget_s: 3\n"))
    assert e.startswith(str(tmp_path / "s.yaml") + ":3:")
    assert "YAML: while parsing a flow sequence" in e


def test_duplicate_keys_are_errors_not_silently_the_last(tmp_path):
    errs = errors_of(write(tmp_path, "version: 1\nname: a\nname: b\n"))
    assert errs == [f"{tmp_path / 's.yaml'}:3:1: $.name: duplicate key 'name' (first at line 2)"]


@pytest.mark.parametrize(
    "text,want",
    [
        ("", "a spec must be a YAML mapping, this is empty"),
        ("- a\n- b\n", "a spec must be a YAML mapping, this is a seq"),
        ("just text\n", "a spec must be a YAML mapping, this is a str"),
    ],
)
def test_top_level_must_be_a_mapping(tmp_path, text, want):
    (e,) = errors_of(write(tmp_path, text))
    assert e.endswith(want)


def test_recursive_alias_is_an_error(tmp_path):
    (e,) = errors_of(write(tmp_path, "a: &x [1, *x]\n"))
    assert e.endswith("recursive YAML alias")


def test_merge_keys_and_anchors_are_supported(tmp_path):
    text = (
        "version: 1\nname: a\nbudget_s: 5\nvalues:\n  base: &b {x: 1, y: 2}\n  more: {<<: *b, y: 3}\n"
        "steps: [{name: s, remove: /tmp/x}]\nchecks: [{name: c, why: w, expr: '`true`'}]\n"
    )
    assert load_spec(write(tmp_path, text)).data["values"]["more"] == {"x": 1, "y": 3}


def test_an_aliased_mapping_with_a_merge_key_can_be_reused(tmp_path):
    text = (
        "version: 1\nname: a\nbudget_s: 5\nvalues:\n  base: &b {x: 1, y: 2}\n"
        "  one: &o {<<: *b, y: 3}\n  two: *o\n"
        "steps: [{name: s, remove: /tmp/x}]\nchecks: [{name: c, why: w, expr: '`true`'}]\n"
    )
    values = load_spec(write(tmp_path, text)).data["values"]
    assert values["one"] == values["two"] == {"x": 1, "y": 3}


def test_schema_errors_are_all_reported_sorted_with_keys_located(tmp_path):
    text = """\
version: 1
name: ok
budget_s: 100
steps:
  - name: leg1
    run:
      argv: [python]
      timeout_s: 0
      timout_s: 5
checks:
  - name: c1
    expr: "`true`"
"""
    assert errors_of(write(tmp_path, text)) == [
        f"{tmp_path / 's.yaml'}:8:18: $.steps[0].run.timeout_s: 0 is less than the minimum of 1",
        f"{tmp_path / 's.yaml'}:9:7: $.steps[0].run.timout_s: unknown key 'timout_s'; allowed: argv, cwd, env, "
        "grace_s, ok_exit_codes, on_failure, output, precondition, progress, signals, stop_on_failure, timeout_s",
        f"{tmp_path / 's.yaml'}:11:5: $.checks[0]: 'why' is a required property",
    ]


def test_extending_file_need_not_repeat_required_keys_but_the_merge_must_have_them(tmp_path):
    write(tmp_path, "values: {a: 1}\n", "parent.yaml")
    errs = errors_of(write(tmp_path, "extends: parent.yaml\nname: child\n"))
    # The missing keys are reported against the top file, the one the user ran.
    assert errs == [
        f"{tmp_path / 's.yaml'}:1:1: $: '{k}' is a required property"
        for k in ("budget_s", "checks", "steps", "version")
    ]


def test_extends_must_be_a_string(tmp_path):
    (e,) = errors_of(write(tmp_path, "extends: [a.yaml]\n"))
    assert e == f"{tmp_path / 's.yaml'}:1:10: $.extends: extends must be a non-empty path string"


def test_missing_parent_is_located_at_the_extends_line(tmp_path):
    (e,) = errors_of(write(tmp_path, "name: a\nextends: nope.yaml\n"))
    assert e.startswith(f"{tmp_path / 's.yaml'}:2:10: $.extends: cannot read ")
    assert e.endswith("nope.yaml: No such file or directory")


def test_spec_error_str_and_json_path():
    e = SpecError("specs/x.yaml", 12, 5, json_path(("steps", 2, "run", "timeout_s")), "0 is less than the minimum of 1")
    assert str(e) == "specs/x.yaml:12:5: $.steps[2].run.timeout_s: 0 is less than the minimum of 1"
    assert json_path(("env", "A-B", 0)) == '$.env["A-B"][0]'
    assert str(SpecErrors([e, e])).count("\n") == 1


def test_schema_is_valid_draft_2020_12_and_every_property_is_described():
    s = schema()
    jsonschema.Draft202012Validator.check_schema(s)
    assert json.loads(schema_text()) == s
    missing = []

    def walk(node, where):
        if isinstance(node, dict):
            for name, sub in (node.get("properties") or {}).items():
                if isinstance(sub, dict) and "description" not in sub and "$ref" not in sub:
                    missing.append(f"{where}.{name}")
            for k, v in node.items():
                walk(v, f"{where}.{k}")
        elif isinstance(node, list):
            for i, v in enumerate(node):
                walk(v, f"{where}[{i}]")

    walk(s, "$")
    assert missing == []
    # Properties that are $refs are described by the definition they point to.
    for ref in ("run", "output", "collect", "progress", "harvest", "signal", "check", "step"):
        assert s["$defs"][ref]["description"]
