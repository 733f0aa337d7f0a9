"""Custom JMESPath functions and the static checks run on expressions before anything executes."""

import json
import math
import re

import jmespath
import pytest

from engine.expr.functions import (
    OPTIONS,
    FunctionError,
    compile_expr,
    function_calls,
    functions_markdown,
    problems,
    root_paths,
    search,
)


def ev(expr, data=None):
    return search(compile_expr(expr), data or {})


@pytest.mark.parametrize(
    "expr,data,want",
    [
        ("add(a, `1`)", {"a": 10}, 11),
        ("sub(a, b)", {"a": 20, "b": 10}, 10),
        ("mul(steps, tps)", {"steps": 20, "tps": 262144}, 5242880),
        ("div(`7`, `2`)", {}, 3.5),
        ("div(`7`, `0`)", {}, None),
        ("floordiv(`7`, `2`)", {}, 3),
        ("mod(`7`, `2`)", {}, 1),
        ("range(`10`, add(`30`, `1`), `10`)", {}, [10, 20, 30]),
        ("range(`0`, `3`)", {}, [0, 1, 2]),
        ("range(`5`, `0`, `-2`)", {}, [5, 3, 1]),
        ("to_int('12')", {}, 12),
        ("to_int('12.7')", {}, 12),
        ("to_int(`3.9`)", {}, 3),
        ("to_int('twelve')", {}, None),
        ("suffix_int('checkpoint-120')", {}, 120),
        ("suffix_int('final')", {}, None),
        ("suffix_int(missing)", {}, None),
        ("sort_numeric(x)", {"x": [120, 60, 180]}, [60, 120, 180]),
        ("sort_numeric(x)", {"x": ["120", "60"]}, ["60", "120"]),
        ("unique(x)", {"x": [1, 1, 2, {"a": 1}, {"a": 1}]}, [1, 2, {"a": 1}]),
        ("split('ckpt/checkpoint-10/model', '/')", {}, ["ckpt", "checkpoint-10", "model"]),
        ("exp(`0`)", {}, 1.0),
        ("exp(x)", {"x": 4.462905265390873}, math.exp(4.462905265390873)),
        ("exp(`1000`)", {}, math.inf),
        ("ln(`512`)", {}, math.log(512)),
        ("ln(`0`)", {}, None),
        ("ln(`-1`)", {}, None),
        ("cos(`0`)", {}, 1.0),
        ("cos(`3.141592653589793`)", {}, -1.0),
        ("is_finite(`3.2`)", {}, True),
        ("is_finite(x)", {"x": math.nan}, False),
        ("is_finite(`true`)", {}, False),
        ("is_finite('1')", {}, False),
        ("all_finite(x)", {"x": [1.5, 2]}, True),
        ("all_finite(x)", {"x": [1.5, math.inf]}, False),
        ("all_finite(x)", {"x": []}, False),
        ("regex_match('final/model.safetensors', '^final/')", {}, True),
        ("regex_match('ckpt/x', '^final/')", {}, False),
        ("get(losses, to_string(`10`))", {"losses": {"10": 3.2}}, 3.2),
        ("get(x, `1`)", {"x": ["a", "b"]}, "b"),
        ("get(x, `5`)", {"x": ["a", "b"]}, None),
        ("startswith_any('final/a', ['ckpt/', 'final/'])", {}, True),
        ("startswith_any('latest.json', ['ckpt/', 'final/'])", {}, False),
        # The reference's own bug class: names sort as text ("checkpoint-120" < "checkpoint-60").
        (
            "sort_numeric(files[?starts_with(@, 'ckpt/')].suffix_int(split(@, '/')[1]))",
            {"files": ["ckpt/checkpoint-120/a", "ckpt/checkpoint-60/a", "latest.json"]},
            [60, 120],
        ),
    ],
)
def test_function_values(expr, data, want):
    assert ev(expr, data) == want


@pytest.mark.parametrize("expr", ["exp(x)", "ln(x)", "cos(x)", "cos(y)"])
def test_exp_ln_cos_of_nan_or_an_infinite_angle_is_nan_never_a_number(expr):
    assert math.isnan(ev(expr, {"x": math.nan, "y": math.inf}))


def test_builtin_functions_still_work_alongside_custom_ones():
    assert ev("length(x)", {"x": [1, 2, 3]}) == 3
    assert ev("max(x)", {"x": [1, 5]}) == 5


@pytest.mark.parametrize(
    "expr,fragment",
    [
        ("range(`0`, `5`, `0`)", "step must not be 0"),
        ("range(`0`, `1.5`)", "expects integers"),
        ("range(`0`, `100000000`)", "elements (limit"),
        ("sort_numeric(['a', 'b'])", "cannot order"),
        ("regex_match('x', '(')", "bad pattern"),
    ],
)
def test_function_refuses_bad_input_with_a_named_error(expr, fragment):
    with pytest.raises(FunctionError, match=fragment.replace("(", r"\(")):
        ev(expr)


def test_optional_argument_arity_is_enforced_at_call_time():
    with pytest.raises(jmespath.exceptions.ArityError):
        ev("range(`1`)")
    with pytest.raises(jmespath.exceptions.ArityError):
        ev("range(`1`, `2`, `3`, `4`)")


def test_type_errors_come_from_jmespath():
    with pytest.raises(jmespath.exceptions.JMESPathTypeError):
        ev("add('a', `1`)")


@pytest.mark.parametrize(
    "expr,want",
    [
        ("add(a, `1`)", []),
        ("range(`1`, `2`)", []),
        ("add(a)", ["add() takes 2 argument(s), 1 given in 'add(a)'"]),
        ("range(`1`)", ["range() takes 2 to 3 argument(s), 1 given in 'range(`1`)'"]),
        ("not_null(a)", []),  # variadic built-in: at least 1
        ("not_null()", ["not_null() takes at least 1 argument(s), 0 given in 'not_null()'"]),
        ("sort_bye(a)", ["unknown function sort_bye() in 'sort_bye(a)'; did you mean sort_by, sort, sort_numeric?"]),
        ("zzz(a)", ["unknown function zzz() in 'zzz(a)'"]),
    ],
)
def test_problems_catch_unknown_functions_and_arity_before_running(expr, want):
    assert problems(expr) == want


def test_problems_report_syntax_errors():
    (msg,) = problems("a ==")
    assert msg.startswith("invalid JMESPath 'a ==': ")


def test_function_calls_lists_nested_calls():
    assert function_calls(compile_expr("range(a, add(b, `1`), c)")) == [("range", 3), ("add", 2)]


@pytest.mark.parametrize(
    "expr,want",
    [
        (
            "steps.leg1.harvest.run_json.final_step == values.stop1",
            [("steps", "leg1", "harvest", "run_json", "final_step"), ("values", "stop1")],
        ),
        ("length(state.hub.files[?starts_with(@, 'final/')]) > `0`", [("state", "hub", "files")]),
        ("steps.leg1.harvest.run_json.losses.* | max(@)", [("steps", "leg1", "harvest", "run_json", "losses")]),
        ("a[0].b", [("a",)]),
        ("sort_by(x, &y)", [("x",)]),
        ("`1` == `1`", []),
        ("mode == 'soak' || values.gate", [("mode",), ("values", "gate")]),
    ],
)
def test_root_paths_are_what_an_expression_reads_from_the_root(expr, want):
    assert root_paths(compile_expr(expr)) == want


def test_markdown_table_lists_every_custom_function_with_an_example():
    md = functions_markdown()
    lines = md.strip().splitlines()
    assert lines[0] == "| function | what it does | example |"
    names = [
        n for n in OPTIONS.custom_functions.FUNCTION_TABLE if f"_func_{n}" in type(OPTIONS.custom_functions).__dict__
    ]
    assert len(lines) == 2 + len(names)
    row = next(line for line in lines if line.startswith("| `suffix_int("))
    assert "``suffix_int('checkpoint-120')`` -> ``120``" in row
    # Pipes inside cells are escaped so the table keeps three columns.
    assert all(line.replace("\\|", "").count("|") == 4 for line in lines)


def test_every_example_that_reads_no_data_evaluates_to_what_the_table_says():
    """The functions table is the manual: an example that needs no evidence is run, and must give
    the value it shows (a JSON value, or a JMESPath literal such as ['60', '120'])."""
    checked = []
    for name in OPTIONS.custom_functions.FUNCTION_TABLE:
        method = type(OPTIONS.custom_functions).__dict__.get(f"_func_{name}")
        example = " ".join((method.__doc__ or "").split()).partition("Example: ")[2] if method else ""
        found = re.fullmatch(r"``(.+)`` -> ``(.+)``\.", example)
        if not found or root_paths(compile_expr(found[1])):
            continue
        try:
            want = json.loads(found[2])
        except ValueError:
            want = ev(found[2])
        assert ev(found[1]) == want, name
        checked.append(name)
    assert {"allclose", "first_difference", "max_abs_diff", "overlap", "restrict", "step_coverage", "by_step"} <= set(
        checked
    )


# ---------------------------------------------------------------- series: allclose and its kin

NAN, INF = math.nan, math.inf


@pytest.mark.parametrize(
    "a, b, rtol, atol, want",
    [
        (4.31, 4.29, 0, 0.05, True),  # numbers
        (4.31, 4.29, 0, 0.01, False),
        (2, 2, 0, 0, True),  # exact
        (1.5, 1.0, 0.5, 0, True),  # b is the reference: |d| 0.5 <= 0.5 x |1.0|
        (2.0, 1.0, 0.5, 0, False),  # |d| 1 > 0.5 x |1.0| ...
        (1.0, 2.0, 0.5, 0, True),  # ... but <= 0.5 x |2.0|
        ([1.0, 2.0], [1.0, 2.0], 0, 0, True),  # lists
        ([1.0, 2.0], [1.0, 2.5], 0, 0.1, False),
        ([1.0, 2.0], [1.0], 0, 1, False),  # a position only one side has
        ({"10": 2.0, "2": 1.0}, {"2": 1.0, "10": 2.0}, 0, 0, True),  # step-keyed, any key order
        ({"1": 1.0, "2": 2.0}, {"1": 1.0}, 0, 1, False),  # a step only one side has
        ({"1": 1.0}, {"1": 1.0, "2": 2.0}, 0, 1, False),
        (NAN, NAN, 0, 1, False),  # NaN is close to nothing, not even NaN
        ([1.0, NAN], [1.0, NAN], 1, 1, False),
        ({"1": NAN}, {"1": 1.0}, 1, 10, False),
        (INF, INF, 0, 0, True),  # an infinity only to the same infinity
        (-INF, -INF, 0, 0, True),
        (INF, -INF, 1, 1, False),
        (INF, 1e308, 1, 1e308, False),
        ({"1": INF}, {"1": INF}, 0, 0, True),
        ([1.0], {"0": 1.0}, 1, 1, False),  # a list against an object
        (1.0, [1.0], 1, 1, False),  # a number against a list
        (["4.3"], [4.3], 1, 1, False),  # a string is not a number
        ([None], [None], 1, 1, False),  # nor a null (how a trainer may write NaN)
        ([True], [1], 1, 1, False),  # nor a boolean
        ({"1": ["9f2c"], "2": [3, 5]}, {"1": ["9f2c"], "2": [3, 5]}, 0, 0, True),  # equal digests and ids
        ({"1": [3, 5]}, {"1": [3, 6]}, 1, 10, False),  # ids that differ: no tolerance makes them close
        (["a"], [None], 1, 1, False),
        ([], [], 1, 1, False),  # two empty series: nothing compared is not a pass
        ({}, {}, 1, 1, False),
    ],
)
def test_allclose(a, b, rtol, atol, want):
    got = ev("allclose(a, b, rtol, atol)", {"a": a, "b": b, "rtol": rtol, "atol": atol})
    assert got is want
    # first_difference with the same tolerances agrees: null exactly when allclose holds.
    assert (ev("first_difference(a, b, rtol, atol)", {"a": a, "b": b, "rtol": rtol, "atol": atol}) is None) is want


@pytest.mark.parametrize("rtol, atol", [(-1e-6, 0), (0, -1), (NAN, 0), (0, INF)])
def test_allclose_refuses_a_tolerance_that_is_not_a_finite_number_at_least_zero(rtol, atol):
    with pytest.raises(FunctionError, match=r"allclose\(\): (rtol|atol) must be a finite number >= 0"):
        ev("allclose(`1`, `1`, rtol, atol)", {"rtol": rtol, "atol": atol})


@pytest.mark.parametrize(
    "a, b, want",
    [
        # Steps in numeric order: "2" comes before "10" (as text, "10" would be first).
        (
            {"10": 5.0, "2": 1.0},
            {"2": 2.0, "10": 6.0},
            {"at": "2", "a": 1.0, "b": 2.0, "why": "|d| 1.0e+00 > atol 0 + rtol 0 x 2"},
        ),
        ({"11": 4.31}, {"1": 6.4, "11": 4.29}, {"at": "1", "b": 6.4, "why": "only in b"}),
        ({"1": 6.4, "2": 6.3}, {"1": 6.4}, {"at": "2", "a": 6.3, "why": "only in a"}),
        ([1, 2, 3], [1, 2], {"at": 2, "a": 3, "why": "only in a"}),
        ([1, 2], [1, 5], {"at": 1, "a": 2, "b": 5, "why": "|d| 3.0e+00 > atol 0 + rtol 0 x 5"}),
        (4.31, 4.29, {"at": None, "a": 4.31, "b": 4.29, "why": "|d| 2.0e-02 > atol 0 + rtol 0 x 4.29"}),
        ({"1": 1.0, "2": 2.0}, {"1": 1.0, "2": 2.0}, None),
        (
            [1.0],
            {"0": 1.0},
            {"at": None, "why": "a is a list, b is an object: not two numbers, two lists or two objects"},
        ),
        ([], [], {"at": None, "why": "both are empty: nothing to compare"}),
        ({"3": "nan"}, {"3": 1.0}, {"at": "3", "a": "nan", "b": 1.0, "why": "a is not a number"}),
        (
            {"1": ["9f2c"], "2": ["a0c4"]},
            {"1": ["9f2c"], "2": ["41f4"]},
            {"at": "2", "a": ["a0c4"], "b": ["41f4"], "why": "not the same value"},
        ),
        ({"1": None}, {"1": None}, {"at": "1", "a": None, "b": None, "why": "null is close to nothing"}),
        (
            {"1": INF},
            {"1": 1.0},
            {"at": "1", "a": INF, "b": 1.0, "why": "an infinity is close only to the same infinity"},
        ),
        (
            {"x": 1, "2": 1, "10": 2},
            {"x": 0, "2": 1, "10": 2},
            {"at": "x", "a": 1, "b": 0, "why": "|d| 1.0e+00 > atol 0 + rtol 0 x 0"},
        ),
    ],
)
def test_first_difference_names_the_first_step_that_differs_with_both_values(a, b, want):
    assert ev("first_difference(a, b)", {"a": a, "b": b}) == want


def test_first_difference_of_a_nan_says_nan_is_close_to_nothing():
    got = ev("first_difference(a, b, `1`, `1`)", {"a": {"1": 1.0, "2": NAN}, "b": {"1": 1.0, "2": NAN}})
    assert (got["at"], got["why"]) == ("2", "NaN is close to nothing")
    assert math.isnan(got["a"]) and math.isnan(got["b"])


def test_first_difference_takes_the_tolerances_of_allclose():
    data = {"a": {"1": 1.0, "2": 2.001, "3": 3.5}, "b": {"1": 1.0, "2": 2.0, "3": 3.0}}
    assert ev("first_difference(a, b)", data)["at"] == "2"  # exact without tolerances
    assert ev("first_difference(a, b, `0.01`)", data)["at"] == "3"  # rtol alone: atol 0
    assert ev("first_difference(a, b, `0`, `1`)", data) is None


@pytest.mark.parametrize(
    "a, b, want",
    [
        (4.5, 4.0, 0.5),
        ([1.0, 2.5, 3.0], [1.0, 2.0, 3.25], 0.5),
        ({"10": 1.0, "2": 5.0}, {"2": 4.0, "10": 1.0}, 1.0),
        (INF, INF, 0.0),  # the same infinity: no difference
        ([1.0, INF], [1.0, 5.0], INF),  # an infinity against a finite number
        ([-INF], [INF], INF),
        ({"1": 1.0, "2": 2.0}, {"1": 1.0}, None),  # a step only one side has: no single number
        ([1.0], [1.0, 2.0], None),
        (["1.0"], [1.0], None),  # a non-number
        ([1.0], {"0": 1.0}, None),
        ([], [], None),  # nothing to compare
    ],
)
def test_max_abs_diff(a, b, want):
    assert ev("max_abs_diff(a, b)", {"a": a, "b": b}) == want


def test_max_abs_diff_is_nan_when_any_value_is_nan_whatever_the_others():
    assert math.isnan(ev("max_abs_diff(a, b)", {"a": [NAN, 1.0], "b": [1.0, 9.0]}))
    assert math.isnan(ev("max_abs_diff(a, b)", {"a": [1.0, INF], "b": [1.0, NAN]}))
    # A NaN difference passes no bound: `<=` over NaN is false.
    assert ev("max_abs_diff(a, b) <= `100`", {"a": [NAN], "b": [NAN]}) is False


@pytest.mark.parametrize(
    "a, b, want",
    [
        ({"10": 1, "11": 2, "9": 0}, {"11": 2, "2": 0, "10": 1, "9": 5}, ["9", "10", "11"]),
        ({"1": 1}, {"2": 2}, []),
        ([1, 2, 3], [4, 5], [0, 1]),
        ([1], {"0": 1}, []),
    ],
)
def test_overlap_is_the_positions_both_have_in_step_order(a, b, want):
    assert ev("overlap(a, b)", {"a": a, "b": b}) == want


def test_restrict_limits_an_object_to_keys_given_as_strings_or_step_numbers():
    losses = {"1": 6.2, "12": 4.2, "11": 4.3, "2": 6.1}
    assert ev("restrict(a, ['11', '12', '13'])", {"a": losses}) == {"11": 4.3, "12": 4.2}
    got = ev("restrict(a, range(`2`, `13`, `10`))", {"a": losses})
    assert list(got.items()) == [("2", 6.1), ("12", 4.2)]  # step order, not text order
    with pytest.raises(FunctionError, match=r"restrict\(\): a key is a string or an integer, got 1.5"):
        ev("restrict(a, [`1.5`])", {"a": losses})


def test_a_resumed_leg_is_compared_with_a_reference_on_the_steps_it_trained():
    reference = {str(s): 6.0 - s / 10 for s in range(1, 21)}
    resumed = {str(s): reference[str(s)] for s in range(11, 21)}
    data = {"leg2": resumed, "ref": reference}
    assert ev("allclose(leg2, restrict(ref, keys(leg2)), `0`, `0`)", data) is True
    assert ev("allclose(restrict(leg2, overlap(leg2, ref)), restrict(ref, overlap(leg2, ref)), `0`, `0`)", data)
    resumed["15"] += 1e-3
    assert ev("first_difference(leg2, restrict(ref, keys(leg2)))", data)["at"] == "15"


@pytest.mark.parametrize(
    "legs, first, last, want",
    [
        ([{"1": 6.2, "2": 6.1}, {"3": 6.0, "4": 5.9}], 1, 4, {"missing": [], "repeated": [], "outside": []}),
        ([{"1": 6.2, "2": 6.1}, {"2": 6.1, "4": 5.9}], 1, 4, {"missing": [3], "repeated": [2], "outside": []}),
        (
            [{"1": 1, "10": 1}, {"2": 1, "11": 1}],
            1,
            10,
            {"missing": list(range(3, 10)), "repeated": [], "outside": [11]},
        ),
        ([{"0": 1, "1": 1}, {}], 1, 1, {"missing": [], "repeated": [], "outside": [0]}),
        ([{"1": 1}, {"1": 1}, {"1": 1}], 1, 1, {"missing": [], "repeated": [1], "outside": []}),
    ],
)
def test_step_coverage_finds_missing_repeated_and_outside_steps(legs, first, last, want):
    assert ev("step_coverage(legs, first, last)", {"legs": legs, "first": first, "last": last}) == want


@pytest.mark.parametrize(
    "legs, first, last, fragment",
    [
        ([{"1": 1, "loss": 2}], 1, 2, 'series [0] has the key "loss", which is not a step'),
        ([{"1": 1}, None], 1, 2, "series [1] is null, not a step-keyed object"),
        ([[1, 2]], 1, 2, "series [0] is a list, not a step-keyed object"),
        ([{"1": 1}], 5, 2, "first step 5 is after last step 2"),
        ([{"1": 1}], 1.5, 2, "first must be an integer, got 1.5"),
        ([{"1": 1}], 0, 10**7, "10,000,001 steps from 0 to 10000000 (limit 1,000,000)"),
    ],
)
def test_step_coverage_refuses_what_is_not_a_step_series(legs, first, last, fragment):
    with pytest.raises(FunctionError, match=re.escape(f"step_coverage(): {fragment}")):
        ev("step_coverage(legs, first, last)", {"legs": legs, "first": first, "last": last})


def test_by_step_makes_a_step_keyed_series_from_per_step_records():
    records = [{"step": 10, "loss": 4.3, "lr": 0.01}, {"step": 2, "loss": 6.1}, {"step": 1, "loss": 6.2}]
    got = ev("by_step(r, 'loss')", {"r": records})
    assert list(got.items()) == [("1", 6.2), ("2", 6.1), ("10", 4.3)]
    # A record without the field is a step that did not log it.
    assert ev("by_step(r, 'lr')", {"r": records}) == {"10": 0.01}
    # Another step key, and no records at all.
    assert ev("by_step(r, 'loss', 'it')", {"r": [{"it": 3, "loss": 1.0}]}) == {"3": 1.0}
    assert ev("by_step(r, 'loss')", {"r": []}) == {}


def test_by_step_keeps_a_step_logged_twice_with_the_same_value_once():
    records = [{"step": 1, "loss": 6.2}, {"step": 2, "loss": NAN}, {"step": 1, "loss": 6.2}, {"step": 2, "loss": NAN}]
    got = ev("by_step(r, 'loss')", {"r": records})
    assert list(got) == ["1", "2"] and got["1"] == 6.2 and math.isnan(got["2"])


@pytest.mark.parametrize(
    "records, fragment",
    [
        (
            [{"step": 10, "loss": 4.31}, {"step": 11, "loss": 4.2}, {"step": 10, "loss": 4.29}],
            "step 10 is logged twice with different loss: 4.31 (records[0]) and 4.29 (records[2])",
        ),
        ([{"step": 1, "loss": 1.0}, {"loss": 2.0}], "records[1] has no 'step'"),
        ([{"step": 1.5, "loss": 1.0}], "records[0].step must be an integer, got 1.5"),
        ([{"step": "1", "loss": 1.0}], 'records[0].step must be an integer, got "1"'),
        ([{"step": 1, "loss": 1.0}, 7], "records[1] is a number, not an object"),
        ([{"step": 1, "los": 1.0}], "no record has 'loss' (records[0] has 'step', 'los')"),
    ],
)
def test_by_step_refuses_a_step_logged_twice_with_different_values_naming_both(records, fragment):
    with pytest.raises(FunctionError, match=re.escape(f"by_step(): {fragment}")):
        ev("by_step(r, 'loss')", {"r": records})


@pytest.mark.parametrize(
    "expr, want",
    [
        (
            "steps.leg1.harvest.run_json == null",
            "bare null is a JMESPath field name (it reads a field called null), not the literal: "
            "write `null` in backticks: steps.leg1.harvest.run_json == `null`",
        ),
        (
            "a == true ||  b[?c ==false]",  # the fix keeps the expression as written, spacing and all
            "bare true and false are JMESPath field names, not literals: "
            "write `true` and `false` in backticks: a == `true` ||  b[?c ==`false`]",
        ),
        (
            "null",
            "bare null is a JMESPath field name (it reads a field called null), not the literal: write `null` in backticks: `null`",
        ),
    ],
)
def test_a_bare_null_true_or_false_is_a_problem_whose_message_shows_the_fix(expr, want):
    assert problems(expr) == [want]


@pytest.mark.parametrize(
    "expr",
    ["a == `null`", "a.null == `1`", "{null: a}.null == `1`", '"true" == `1`', "a == 'false'", "nullable == `1`"],
)
def test_null_true_and_false_as_field_names_on_purpose_are_no_problem(expr):
    assert problems(expr) == []
