"""engine/judge/checks.py and engine/judge/verdict.py: outcomes, missing-data detection, explain traces, the verdict."""

from __future__ import annotations

import json
from pathlib import Path

import jmespath
import pytest

from engine.expr.functions import OPTIONS
from engine.expr.trace import check_document, trace, unparse
from engine.judge.checks import evaluate
from engine.judge.verdict import Exit, verdict

GOLDEN = Path(__file__).parents[1] / "golden" / "checks"


def _evidence() -> dict:
    return {
        "evidence_version": 1,
        "spec": {"name": "demo"},
        "mode": "smoke",
        "values": {"stop1": 10, "steps": 20, "gate_peak": False, "push_steps": [10]},
        "seconds": 12.34,
        "steps": {
            "leg1": {
                "kind": "run",
                "status": "ok",
                "rc": 0,
                "harvest": {
                    "run_json": {
                        "final_step": 10,
                        "segment_stop": True,
                        "val_ppl": None,
                        "losses": {"5": 6.1, "10": 5.2},
                    }
                },
            },
            "leg2": {"kind": "run", "status": "ok", "rc": 0, "harvest": {"run_json": {}}},
            "hub": {"kind": "collect", "status": "ok"},
        },
        "state": {"hub": {"checkpoints": [10, 20], "pointer": None, "has_final": True}},
        "checks": [{"name": "stale", "outcome": "PASS"}],
        "verdict": {"outcome": "PASS"},
    }


def _one(expr: str, when: str | None = None, evidence: dict | None = None, **extra) -> dict:
    check = {"name": "c", "expr": expr, "why": "because", "file": "s.yaml", "line": 7, **extra}
    if when is not None:
        check["when"] = when
    return evaluate([check], evidence or _evidence(), OPTIONS)[0]


def test_exactly_true_passes():
    r = _one("steps.leg1.harvest.run_json.final_step == values.stop1")
    assert (r["outcome"], r["value"], r["missing"]) == ("PASS", True, [])
    assert (r["file"], r["line"], r["severity"], r["why"]) == ("s.yaml", 7, "gate", "because")


@pytest.mark.parametrize(
    "expr, value",
    [
        ("values.stop1", 10),  # truthy number is not true
        ("state.hub.checkpoints", [10, 20]),  # nor is a non-empty list
        ("'true'", "true"),  # nor the string
        ("steps.leg1.harvest.run_json.final_step == `11`", False),
    ],
)
def test_anything_but_true_fails(expr, value):
    r = _one(expr)
    assert r["outcome"] == "FAIL"
    assert r["value"] == value


def test_absent_key_is_no_data_but_explicit_null_is_data():
    absent = _one("steps.leg2.harvest.run_json.final_step == `null`")
    assert absent["outcome"] == "NO_DATA"
    assert absent["missing"] == ["steps.leg2.harvest.run_json.final_step"]
    assert absent["reason"] == "no data: steps.leg2.harvest.run_json.final_step is missing"
    present_null = _one("steps.leg1.harvest.run_json.val_ppl == `null`")
    assert present_null["outcome"] == "PASS"


def no_data(expr: str, missing: list[str]) -> dict:
    """The check `expr`, which must say NO_DATA naming exactly `missing`."""
    r = _one(expr)
    assert (r["outcome"], r["missing"]) == ("NO_DATA", missing), r
    return r


def test_missing_data_never_passes_even_when_the_result_is_true():
    assert no_data("steps.leg9.rc == `null`", ["steps.leg9.rc"])["value"] is True  # jmespath alone: true


def test_missing_names_the_full_requested_path_below_a_missing_parent():
    no_data("steps.leg3.harvest.run_json.final_step == `10`", ["steps.leg3.harvest.run_json.final_step"])


def test_projection_over_missing_keys_is_no_data():
    # `steps.*.rc` silently drops the collect step's absent rc; the check must not count it as data.
    assert no_data("length(steps.*.rc) == `2`", ["steps.hub.rc"])["value"] is True


def test_lookup_on_a_null_value_is_missing():
    no_data("state.hub.pointer.step == `20`", ["state.hub.pointer.step"])


def test_quoted_keys_in_missing_paths():
    no_data('steps.leg1.harvest.run_json.losses."15" < `6`', ['steps.leg1.harvest.run_json.losses."15"'])


def test_only_an_exact_false_when_skips():
    r = _one("values.stop1 == `99`", when="values.gate_peak")
    assert r["outcome"] == "SKIPPED"
    assert r["reason"] == "when `values.gate_peak` was false"
    assert _one("values.stop1 == `10`", when="values.stop1 == `10`")["outcome"] == "PASS"


def test_when_over_absent_data_is_no_data_and_fails_the_verdict():
    """A gate whose condition reads a fact the run never reported must not be skipped: it would
    turn into a pass by the absence of the very data it guards."""
    evidence = _evidence()
    r = _one("values.stop1 == `99`", when="values.nothing", evidence=evidence)
    assert r["outcome"] == "NO_DATA"
    assert r["missing"] == ["values.nothing"]
    assert r["reason"] == "when `values.nothing`: no data: values.nothing is missing"
    # Even when the condition's value would happen to be true (a projection drops the miss).
    r = _one("`true`", when="length(steps.*.harvest.run_json.nope) == `0`", evidence=evidence)
    assert r["outcome"] == "NO_DATA"
    # Absent data fed to a typed function in the condition: NO_DATA, not an ERROR about types.
    r = _one("`true`", when="length(state.hub.nothing) > `0`", evidence=evidence)
    assert (r["outcome"], r["missing"]) == ("NO_DATA", ["state.hub.nothing"])
    v = verdict(evidence, [r])
    assert (v["outcome"], v["failed"]) == ("FAIL", ["c"])


@pytest.mark.parametrize(
    "when, shown",
    [
        ("values.stop1", "10"),
        ("steps.leg1.harvest.run_json.val_ppl", "null"),
        ("'false'", '"false"'),
        ("state.hub.checkpoints", "[10,20]"),
    ],
)
def test_when_that_is_not_a_boolean_is_an_error(when, shown):
    r = _one("`true`", when=when)
    assert r["outcome"] == "ERROR"
    assert r["reason"] == f"when `{when}` gave {shown}, not true or false"


def test_expression_raising_is_error_with_the_message():
    r = _one("steps.leg1.harvest.run_json.final_step < 'ten'")
    assert r["outcome"] == "ERROR"
    assert "not supported between" in r["reason"]
    assert r["explain"] == [["steps.leg1.harvest.run_json.final_step", "10"]]  # computed before the error
    r = _one("abs('x') == `1`")
    assert r["outcome"] == "ERROR"
    assert "abs" in r["reason"]


def test_checks_do_not_see_checks_or_verdict():
    assert _one("verdict == `null`")["outcome"] == "NO_DATA"
    assert "checks" not in check_document(_evidence())


def test_document_is_plain_json():
    doc = check_document({"steps": {"a": {"t": (1, 2)}}, "p": Path("/x")})
    assert doc == {"steps": {"a": {"t": [1, 2]}}, "p": "/x"}


def test_explain_shows_comparison_operands():
    r = _one("steps.leg1.harvest.run_json.final_step == add(values.stop1, `1`)")
    explain = dict(r["explain"])
    assert explain["steps.leg1.harvest.run_json.final_step"] == "10"
    assert r["outcome"] == "FAIL"
    assert explain["add(values.stop1, `1`)"] == "11"
    assert explain["values.stop1"] == "10"


def test_explain_marks_short_circuited_branches():
    r = _one("values.gate_peak && state.hub.has_final")
    assert r["explain"] == [["values.gate_peak", "false"], ["state.hub.has_final", "not evaluated"]]
    r = _one("values.stop1 == `3` || state.hub.has_final == `false`")
    assert r["explain"] == [
        ["values.stop1 == `3`", "false"],
        ["values.stop1", "10"],
        ["state.hub.has_final == `false`", "false"],
        ["state.hub.has_final", "true"],
    ]


def test_explain_values_are_cut_at_240_chars():
    ev = _evidence()
    ev["values"]["big"] = list(range(500))
    r = _one("length(values.big) == `1`", evidence=ev)
    big = dict(r["explain"])["values.big"]
    assert len(big) == 240 and big.endswith("...")


def test_two_long_values_that_differ_are_cut_around_the_difference_so_the_hash_that_differs_reads_whole():
    ev = _evidence()
    files = {f"file{i}.bin": f"{i:x}" * 64 for i in range(6)}
    stored = {**files, "file5.bin": "5" * 58 + "000000"}
    ev["state"] = {"hub": {"pointer_files": files, "stored": stored}}
    r = _one("state.hub.pointer_files == state.hub.stored", evidence=ev)
    explain = dict(r["explain"])
    pointer, read_back = explain["state.hub.pointer_files"], explain["state.hub.stored"]
    assert r["outcome"] == "FAIL" and len(json.dumps(files)) > 240
    # Both sides are cut at the same place, a little before the file whose hash differs, and show it whole.
    assert pointer.endswith('"file5.bin":"' + "5" * 64 + '"}') and pointer.startswith("...")
    assert read_back.endswith('"file5.bin":"' + "5" * 58 + '000000"}') and read_back.startswith("...")
    assert pointer[:40] == read_back[:40] and len(pointer) <= 243


def test_warn_severity_is_kept():
    assert _one("values.stop1 == `1`", severity="warn")["severity"] == "warn"


@pytest.mark.parametrize(
    "expr",
    [
        "a.b",
        "a[*].b",
        "a.*.b",
        "a[]",
        "a[?x == `1`].y",
        "a[0]",
        "a[1:2]",
        "*",
        "a | b",
        "!a",
        "a && b || c",
        "(a || b) && c",
        "sort_by(@, &x)",
        "{a: b, c: d[0]}",
        "[a, b]",
        "@",
        "`1`",
        "'s'",
        'a."x-y"',
        "a[-1].b",
        "length(a[*])",
        "a[*][*]",
        "a.[b, c]",
        "(a || b).c",
        "!(a == b)",
        "(a.b[*].c).d",
        "a.b[*].c[?d].e",
        "a[::2]",
        "foo[].bar[]",
        "(a | b)[0]",
        "!a.b",
        "max_by(a, &b).c",
        '`{"k": [1, null]}`',
        "'it\\'s'",
        "a[?!(b == c)]",
    ],
)
def test_unparse_round_trips(expr):
    parsed = jmespath.compile(expr).parsed
    assert jmespath.compile(unparse(parsed)).parsed == parsed


def test_trace_returns_value_missing_explain():
    value, missing, explain = trace("a.b == `1`", {"a": {"b": 1}})
    assert (value, missing, explain) == (True, [], [["a.b", "1"]])


# ---------------------------------------------------------------- verdict


def _results(*outcomes: tuple[str, str, str]) -> list[dict]:
    return [{"name": n, "outcome": o, "severity": s} for n, o, s in outcomes]


def test_verdict_pass():
    v = verdict(_evidence(), _results(("a", "PASS", "gate"), ("b", "SKIPPED", "gate")))
    assert v == {"outcome": "PASS", "failed": [], "warnings": [], "exit_code": Exit.PASS, "seconds": 12.3}


def test_verdict_fail_names_gate_checks_and_failed_steps():
    ev = _evidence()
    ev["steps"]["leg2"].update(status="failed", rc=1)
    # A failed collect step fails the verdict too, even when no check reads its state.
    ev["steps"]["hub"]["status"] = "failed"
    v = verdict(
        ev,
        _results(
            ("a", "FAIL", "gate"),
            ("b", "NO_DATA", "gate"),
            ("c", "ERROR", "gate"),
            ("w", "FAIL", "warn"),
            ("ok", "PASS", "gate"),
        ),
    )
    assert v["outcome"] == "FAIL" and v["exit_code"] == Exit.FAILED
    assert v["failed"] == ["step:leg2", "step:hub", "a", "b", "c"]
    assert v["warnings"] == ["w"]


def test_warn_never_fails_the_verdict():
    v = verdict(_evidence(), _results(("w", "NO_DATA", "warn")))
    assert (v["outcome"], v["exit_code"], v["warnings"]) == ("PASS", Exit.PASS, ["w"])


def test_verdict_precondition():
    ev = _evidence()
    ev["steps"]["leg1"]["status"] = "failed"
    v = verdict(ev, _results(("a", "NO_DATA", "gate")), {"leg1": "could not fetch the published mix"})
    assert (v["outcome"], v["exit_code"]) == ("PRECONDITION", Exit.PRECONDITION)
    assert v["message"] == "could not fetch the published mix"
    assert v["failed"] == ["step:leg1"]


def test_verdict_interrupted_wins():
    ev = _evidence()
    ev["steps"]["leg1"]["status"] = "failed"
    ev["steps"]["leg2"]["status"] = "interrupted"
    v = verdict(ev, _results(("a", "FAIL", "gate")), {"leg1": "x"})
    assert (v["outcome"], v["exit_code"]) == ("INTERRUPTED", Exit.INTERRUPTED)


def test_golden_results():
    """A fixed evidence + checks -> results; the golden file is the reviewed expectation."""
    evidence = json.loads((GOLDEN / "evidence.json").read_text())
    checks = json.loads((GOLDEN / "checks.json").read_text())
    got = evaluate(checks, evidence, OPTIONS)
    want = json.loads((GOLDEN / "results.json").read_text())
    assert got == want


def test_index_past_the_end_is_missing():
    r = _one("state.hub.checkpoints[5] == `null`")
    assert (r["outcome"], r["missing"]) == ("NO_DATA", ["state.hub.checkpoints[5]"])
    assert _one("state.hub.checkpoints[-1] == `20`")["outcome"] == "PASS"


def test_absent_path_fed_to_a_typed_function_is_no_data_not_an_error():
    # sub(null, 1) raises a type error inside jmespath; the null came from a missing path, so the
    # outcome is the missing data, named, not an ERROR about types.
    r = _one("sub(steps.leg2.harvest.run_json.final_loss, `1`) < `5`")
    assert r["outcome"] == "NO_DATA"
    assert r["missing"] == ["steps.leg2.harvest.run_json.final_loss"]
    assert "steps.leg2.harvest.run_json.final_loss is missing" in r["reason"]


def test_type_error_on_present_data_is_still_an_error():
    r = _one("sub(steps.leg1.harvest.run_json.val_ppl, `1`) < `5`")
    assert r["outcome"] == "ERROR" and "sub()" in r["reason"]
