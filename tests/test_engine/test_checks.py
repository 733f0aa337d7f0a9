"""engine/judge/checks.py and engine/judge/verdict.py: outcomes, missing-data detection, explain traces, the verdict."""

from __future__ import annotations

import json
import math
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


def _killed_leg(evidence: dict | None = None) -> dict:
    """Leg 2 killed before it reported: its harvest rule matched no line, and the record says so."""
    ev = evidence or _evidence()
    ev["steps"]["leg2"]["harvest"] = {}
    ev["steps"]["leg2"]["harvest_errors"] = [
        {"name": "run_json", "marker": "RUN_JSON ", "line": None, "kind": "missing", "error": "missing", "text": None}
    ]
    return ev


def test_a_harvest_that_matched_no_line_compared_with_null_is_answered():
    ev = _killed_leg()
    r = _one("steps.leg2.harvest.run_json == `null`", evidence=ev)
    assert (r["outcome"], r["missing"], r["reason"]) == ("PASS", [], "true")
    assert r["explain"] == [["steps.leg2.harvest.run_json", "<absent>"]]
    r = _one("steps.leg2.harvest.run_json != `null`", evidence=ev)
    assert (r["outcome"], r["explain"]) == ("FAIL", [["steps.leg2.harvest.run_json", "<absent>"]])
    # Through a let, and with the literal on the left.
    r = _one("`null` == let.run", evidence=ev, let={"run": "steps.leg2.harvest.run_json"})
    assert (r["outcome"], r["explain"][0]) == ("PASS", ["let.run", "<absent>"])
    # A leg that did report: the comparison is about its value.
    r = _one("steps.leg1.harvest.run_json == `null`", evidence=ev)
    assert r["outcome"] == "FAIL" and r["explain"][0][1].startswith('{"final_step":10')


@pytest.mark.parametrize(
    "expr",
    [
        "steps.leg2.harvest.run_json.final_step == `null`",  # below the recorded absence: not recorded itself
        "steps.leg2.harvest.other == `null`",  # no rule recorded as matching nothing
        "steps.leg9.harvest.run_json == `null`",  # a step that has no record at all
        "steps.leg2.harvest.run_json == `null` && length(steps.leg2.harvest.run_json) == `0`",  # read as data too
        "steps.leg2.harvest.run_json == steps.leg9.rc",  # compared with another absent path, not with null
    ],
)
def test_an_absence_the_evidence_does_not_record_stays_no_data_even_compared_with_null(expr):
    r = _one(expr, evidence=_killed_leg())
    assert r["outcome"] == "NO_DATA", (r["outcome"], r["reason"])


def test_a_let_asked_about_its_absence_and_read_as_data_too_is_no_data_whichever_comes_first():
    lets = {"run": "steps.leg2.harvest.run_json"}
    for expr in (
        "let.run == `null` && not_null(let.run, `1`) == `1`",
        "not_null(let.run, `1`) == `1` && let.run == `null`",
    ):
        r = _one(expr, evidence=_killed_leg(), let=lets)
        assert (r["outcome"], r["missing"]) == ("NO_DATA", ["steps.leg2.harvest.run_json"]), expr


def test_a_when_may_ask_whether_a_leg_reported():
    ev = _killed_leg()
    r = _one(
        "steps.leg2.harvest.run_json.final_step == `20`", when="steps.leg2.harvest.run_json != `null`", evidence=ev
    )
    assert (r["outcome"], r["reason"]) == ("SKIPPED", "when `steps.leg2.harvest.run_json != `null`` was false")


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


def test_get_of_a_key_the_object_lacks_is_missing_data_even_compared_with_null():
    # get(x, k) reads x.k with a computed key: a step the leg never logged must not pass as "null".
    r = _one("get(steps.leg1.harvest.run_json.losses, '15') == `null`")
    assert (r["outcome"], r["missing"]) == ("NO_DATA", ['steps.leg1.harvest.run_json.losses."15"'])
    assert r["explain"][0] == ["get(steps.leg1.harvest.run_json.losses, '15')", "<absent>"]
    r = _one("get(state.hub.checkpoints, `5`) == `null`")
    assert (r["outcome"], r["missing"]) == ("NO_DATA", ["state.hub.checkpoints[5]"])
    # A key it has is data, and so is an explicit null under it.
    assert _one("get(steps.leg1.harvest.run_json.losses, to_string(values.stop1)) == `5.2`")["outcome"] == "PASS"
    assert _one("get(steps.leg1.harvest.run_json, 'val_ppl') == `null`")["outcome"] == "PASS"
    # An object that is itself absent is named once, as the path that is missing.
    r = _one("get(steps.leg2.harvest.run_json.losses, '1') == `null`")
    assert (r["outcome"], r["missing"]) == ("NO_DATA", ["steps.leg2.harvest.run_json.losses"])


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


# ---------------------------------------------------------------- comparisons explain where they differ


def _series_evidence() -> dict:
    ev = _evidence()
    reference = {str(s): round(6.5 - 0.1 * s, 4) for s in range(1, 21)}
    resumed = {str(s): reference[str(s)] for s in range(11, 21)}
    resumed["11"], reference["11"] = 4.31, 4.29
    ev["steps"]["ref"] = {"kind": "run", "status": "ok", "harvest": {"run_json": {"losses": reference}}}
    ev["steps"]["leg2"]["harvest"]["run_json"] = {"losses": resumed}
    ev["values"].update(loss_rtol=1e-6, loss_atol=0)
    return ev


COMPARED = "allclose(let.leg, restrict(let.ref, keys(let.leg)), values.loss_rtol, values.loss_atol)"
SERIES_LETS = {"leg": "steps.leg2.harvest.run_json.losses", "ref": "steps.ref.harvest.run_json.losses"}


def test_a_failing_allclose_explains_the_first_differing_step_with_both_values():
    r = _one(COMPARED, evidence=_series_evidence(), let=SERIES_LETS)
    assert (r["outcome"], r["value"]) == ("FAIL", False)
    assert dict(r["explain"])[COMPARED] == (
        "false: first difference at step 11: 4.31 vs 4.29 (|d| 2.0e-02 > atol 0 + rtol 1e-06 x 4.29)"
    )


def test_a_failing_comparison_shows_its_series_around_the_difference_not_cut_at_the_start():
    ev = _series_evidence()
    ev["steps"]["leg2"]["harvest"]["run_json"]["losses"]["17"] = 9.0
    ev["steps"]["ref"]["harvest"]["run_json"]["losses"]["11"] = 4.31
    r = _one("allclose(let.leg, let.ref, `0`, `0.001`)", evidence=ev, let=SERIES_LETS)
    explain = dict(r["explain"])
    assert explain["allclose(let.leg, let.ref, `0`, `0.001`)"] == "false: first difference at step 1: only in b (6.4)"
    assert explain["let.leg"] == '{"11":4.31,"12":5.3,...} (10 entries)'
    assert explain["let.ref"] == '{"1":6.4,"2":6.3,"3":6.2,...} (20 entries)'
    r = _one("first_difference(let.leg, restrict(let.ref, keys(let.leg))) == `null`", evidence=ev, let=SERIES_LETS)
    explain = dict(r["explain"])
    assert explain["let.leg"] == '{...,"15":5.0,"16":4.9,"17":9.0,"18":4.7,"19":4.6,...} (10 entries)'
    assert (
        explain["restrict(let.ref, keys(let.leg))"]
        == '{...,"15":5.0,"16":4.9,"17":4.8,"18":4.7,"19":4.6,...} (10 entries)'
    )
    assert explain["first_difference(let.leg, restrict(let.ref, keys(let.leg)))"] == (
        '{"at":"17","a":9.0,"b":4.8,"why":"|d| 4.2e+00 > atol 0 + rtol 0 x 4.8"}'
    )


@pytest.mark.parametrize(
    "legs, shown",
    [
        ({"11": 4.31, "12": 5.3}, "2.00e-02 at step 11 (4.31 vs 4.29)"),
        ({"11": math.nan, "12": 5.3}, "NaN at step 11 (NaN vs 4.29)"),
        ({"11": 4.29, "12": math.inf}, "Infinity at step 12 (Infinity vs 5.3)"),
        ({"11": 4.29}, "null: first difference at step 12: only in b (5.3)"),
    ],
)
def test_max_abs_diff_explains_where_its_largest_difference_is(legs, shown):
    ev = _series_evidence()
    ev["steps"]["leg2"]["harvest"]["run_json"]["losses"] = legs
    expr = "max_abs_diff(let.leg, restrict(let.ref, ['11', '12'])) <= `1e-6`"
    r = _one(expr, evidence=ev, let=SERIES_LETS)
    assert r["outcome"] == "FAIL"
    assert dict(r["explain"])["max_abs_diff(let.leg, restrict(let.ref, ['11', '12']))"] == shown


def test_step_coverage_explains_missing_and_repeated_steps_as_ranges():
    ev = _series_evidence()
    ev["steps"]["leg1"]["harvest"]["run_json"]["losses"] = {str(s): 1.0 for s in range(1, 13)}
    expr = 'step_coverage([let.first, let.leg], `1`, `24`) == `{"missing": [], "repeated": [], "outside": []}`'
    r = _one(expr, evidence=ev, let={"first": "steps.leg1.harvest.run_json.losses", "leg": SERIES_LETS["leg"]})
    assert r["outcome"] == "FAIL"
    assert dict(r["explain"])["step_coverage([let.first, let.leg], `1`, `24`)"] == (
        "missing 21-24; repeated 11-12; outside none"
    )


def test_a_passing_comparison_shows_its_plain_value():
    ev = _series_evidence()
    ev["steps"]["ref"]["harvest"]["run_json"]["losses"]["11"] = 4.31
    r = _one(COMPARED, evidence=ev, let=SERIES_LETS)
    assert r["outcome"] == "PASS" and dict(r["explain"])[COMPARED] == "true"


def test_a_step_logged_twice_with_different_values_is_an_error_naming_both():
    ev = _evidence()
    ev["steps"]["leg2"]["harvest"]["steps"] = [
        {"step": 10, "loss": 4.31},
        {"step": 11, "loss": 4.2},
        {"step": 10, "loss": 4.29},
    ]
    r = _one("length(keys(by_step(steps.leg2.harvest.steps, 'loss'))) == `2`", evidence=ev)
    assert (r["outcome"], r["reason"]) == (
        "ERROR",
        "FunctionError: by_step(): step 10 is logged twice with different loss: 4.31 (records[0]) and 4.29 (records[2])",
    )


def test_trace_answers_an_absence_only_where_the_container_exists():
    # `absent` names a.b; with no `a` at all the lookup that failed was on nothing: still missing.
    value, missing, explain = trace("a.b == `null`", {"a": {}}, OPTIONS, absent={("a", "b")})
    assert (value, missing, explain) == (True, [], [["a.b", "<absent>"]])
    value, missing, _ = trace("a.b == `null`", {}, OPTIONS, absent={("a", "b")})
    assert (value, missing) == (True, ["a.b"])
