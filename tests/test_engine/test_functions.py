"""Custom JMESPath functions and the static checks run on expressions before anything executes."""

import math

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
