"""`engine diff --evidence` with numbers: each changed check judged old (with the old spec's values)
and new (with the new spec's) on a real saved run, classified tightened / loosened / unchanged on this
run / cannot tell (with the reason); and a diff that reads: token deltas, a reason said once."""

from __future__ import annotations

import argparse
import io
import shutil
from pathlib import Path

import pytest

from engine.cli import main as engine_main
from engine.diff import command as diff
from engine.diff.phrases import expr_delta, prose_delta
from engine.diff.strictness import LOOSENED, TIGHTENED, UNCHANGED, UNKNOWN, shift

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests" / "specs" / "review" / "specs"


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real `engine run` of the review fixture's probe (two `python -c` legs)."""
    run_dir = tmp_path_factory.mktemp("runs") / "probe-smoke"
    assert engine_main(["run", str(FIXTURE / "probe.yaml"), "--run-dir", str(run_dir)]) == 0
    return run_dir


@pytest.fixture
def specs(tmp_path: Path) -> Path:
    """A copy of the fixture's specs/ to edit into the NEW side."""
    shutil.copytree(FIXTURE, tmp_path / "specs")
    return tmp_path / "specs"


def changed(specs: Path, path: str, old: str, new: str) -> None:
    f = specs / path
    text = f.read_text()
    assert old in text
    f.write_text(text.replace(old, new, 1))


def diff_text(new: Path, run: Path, old: Path = FIXTURE / "probe.yaml") -> str:
    args = argparse.Namespace(old=str(old), new=str(new), base=None, evidence=str(run), markdown=None, mode=None)
    out, err = io.StringIO(), io.StringIO()
    assert diff.diff_main(args, out, err) == 1, err.getvalue()
    return out.getvalue()


def reviewed(new: Path, run: Path) -> dict:
    report = diff.build_report(str(FIXTURE / "probe.yaml"), str(new), None, str(run))
    return {r.name: r for r in report.evidence.checks}


def test_a_value_threshold_loosened_shows_both_outcomes_values_and_margins(specs: Path, run: Path) -> None:
    # The value a gate compares with moved, and nothing else: the run answers for both sides.
    changed(specs, "lib/common.yaml", "loss_max: 3.0", "loss_max: 4.5")
    text = diff_text(specs / "probe.yaml", run)
    assert "    ~ check loss_below_max (unchanged; reads a changed value) on run " in text
    assert "(smoke): loosened  (" in text
    assert "        on this run: 2.25 < 3 PASS (margin 0.75) -> 2.25 < 4.5 PASS (margin 2.25)\n" in text
    assert "cannot say how it fares" not in text
    r = reviewed(specs / "probe.yaml", run)["loss_below_max"]
    assert (r.shift.verdict, r.old["outcome"], r.new["outcome"]) == (LOOSENED, "PASS", "PASS")


def test_a_literal_threshold_tightened_past_the_run_fails_it_and_says_so(specs: Path, run: Path) -> None:
    changed(specs, "lib/common.yaml", "<= `13.6`", "<= `12`")
    text = diff_text(specs / "probe.yaml", run)
    assert "    ~ changed check peak_below_gate on run " in text and "(smoke): tightened  (" in text
    assert "on this run: 12.5 <= 13.6 PASS (margin 1.1) -> 12.5 <= 12 FAIL (margin -0.5)" in text


@pytest.fixture
def self_bound(specs: Path) -> Path:
    """The OLD side, beside `specs`: the loss checked against 1.5 x itself, a bound that reads the run."""
    changed(
        specs,
        "lib/common.yaml",
        "final_loss < values.loss_max",
        "final_loss < mul(steps.leg2.harvest.run_json.final_loss, `1.5`)",
    )
    base = specs.parent / "base"
    shutil.copytree(specs, base)
    return base / "probe.yaml"


def test_a_bound_that_reads_the_run_is_placed_by_the_runs_numbers(specs: Path, run: Path, self_bound: Path) -> None:
    # `mul(loss, 1.5)` -> `mul(loss, 2)`: which way it moved depends on the loss; the run gives it.
    changed(specs, "lib/common.yaml", "`1.5`)", "`2`)")
    text = diff_text(specs / "probe.yaml", run, old=self_bound)
    assert "on this run: 2.25 < 3.375 PASS (margin 1.125) -> 2.25 < 4.5 PASS (margin 2.25)" in text
    assert ": loosened  (" in text


def test_a_let_rewrite_is_unchanged_on_this_run_and_a_new_shape_cannot_be_told(specs: Path, run: Path) -> None:
    changed(
        specs,
        "lib/common.yaml",
        'expr: "steps.leg2.harvest.run_json.final_loss < values.loss_max"',
        'expr: "let.loss < values.loss_max"\n    let:\n      loss: steps.leg2.harvest.run_json.final_loss',
    )
    changed(specs, "lib/common.yaml", 'expr: "steps.leg2.rc == `0`"', 'expr: "contains([`0`, `1`], steps.leg2.rc)"')
    text = diff_text(specs / "probe.yaml", run)
    assert (
        "changed check loss_below_max on run" in text
        and ": unchanged on this run (the same expression once its `let:` names are written out)" in text
    )
    by_name = reviewed(specs / "probe.yaml", run)
    assert by_name["loss_below_max"].shift.verdict == UNCHANGED
    exit_clean = by_name["leg2_exit_clean"].shift
    assert exit_clean.verdict == UNKNOWN
    assert exit_clean.why == "PASS on this run before and after; the expression changed shape, not only its bounds"
    assert ": cannot tell: PASS on this run before and after; the expression changed shape" in text


def test_a_changed_leg_is_said_once_for_every_check_it_voids(specs: Path, run: Path) -> None:
    changed(specs, "lib/common.yaml", '"--resume-from", "${stop1}"', '"--resume-from", "${stop1}", "--log-every", "1"')
    text = diff_text(specs / "probe.yaml", run)
    reason = "leg `leg2` changed since the run (argv added `--log-every 1` after `${stop1}`)"
    lines = text.splitlines()
    assert sum(reason.replace("${stop1}", "10") in line for line in lines) == 1, text
    assert (
        "    ! 3 checks this run cannot say how they fare (leg2_finished, loss_below_max, leg2_exit_clean), "
        "because" in lines
    )


def test_expression_and_prose_deltas_show_only_the_changed_tokens() -> None:
    old = "is_finite(let.first2) && let.jump < mul(let.last1, `0.25`) && let.jump < abs(sub(let.first2, let.first1))"
    assert (
        expr_delta(old, old.replace("0.25", "0.5")) == "…mul(let.last1, [-`0.25`-]{+`0.5`+}) && let.jump <…"
    )  # six tokens either side
    assert expr_delta("a==b", "a == b") == "a == b"  # the same tokens: nothing marked
    assert (
        prose_delta("Leg 2 must reach the horizon.", "Leg 2 must reach the end.")
        == "Leg 2 must reach the [-horizon.-]{+end.+}"
    )


@pytest.mark.parametrize(
    "old, new, verdict",
    [
        ("a.x <= `13.6`", "a.x <= `20`", LOOSENED),
        ("a.x <= `13.6`", "a.x < `13.6`", TIGHTENED),
        ("`13.6` >= a.x", "`20` >= a.x", LOOSENED),  # written the other way round
        ("a.x > `1`", "a.x > `2`", TIGHTENED),  # a floor raised
        ("!(a.x > `1`)", "!(a.x > `2`)", LOOSENED),  # under `!` the other way round
        ("a.x < `1`", "a.x < `1` && a.y", TIGHTENED),  # a condition added
        ("a.x < `1`", "a.x < `1` || a.y", LOOSENED),  # an alternative added
        ("a.x < `1`", "a.x < `1`", UNCHANGED),
        ("a.x == `1`", "a.x == `2`", UNKNOWN),  # an equality asks for another value
        ("a.x < `1`", "a.y < `1`", UNKNOWN),  # what it compares changed
        ("length(a[?x < `1`]) == `0`", "length(a[?x < `2`]) == `0`", UNKNOWN),  # inside a filter
    ],
)
def test_strictness_of_a_rewritten_comparison(old: str, new: str, verdict: str) -> None:
    assert shift({"expr": old}, {"expr": new}, {}, {}).verdict == verdict


def test_a_comparison_of_another_quantity_is_not_read_as_a_moved_bound() -> None:
    # On a run a.x = 0.5 and a.y = 0.7: `1` did not move, what it is compared with did.
    old = {"outcome": "PASS", "explain": [["a.x", "0.5"]]}
    new = {"outcome": "PASS", "explain": [["a.y", "0.7"]]}
    s = shift({"expr": "a.x < `1`"}, {"expr": "a.y < `1`"}, {}, {}, old, new)
    assert s.verdict == UNKNOWN and "what it compares with changed (`a.x` -> `a.y`)" in s.why


def test_a_bound_moved_inside_a_let_rewrite_keeps_the_runs_numbers(specs: Path, run: Path, self_bound: Path) -> None:
    # Old: the loss against 1.5 x itself, written out; new: the same through `let:`, with 2 x.
    changed(
        specs,
        "lib/common.yaml",
        'expr: "steps.leg2.harvest.run_json.final_loss < mul(steps.leg2.harvest.run_json.final_loss, `1.5`)"',
        'expr: "let.loss < mul(let.loss, `2`)"\n    let:\n      loss: steps.leg2.harvest.run_json.final_loss',
    )
    text = diff_text(specs / "probe.yaml", run, old=self_bound)
    assert "changed check loss_below_max on run " in text and ": loosened  (" in text
    assert "on this run: 2.25 < 3.375 PASS (margin 1.125) -> 2.25 < 4.5 PASS (margin 2.25)" in text


def test_a_when_added_loosens_and_dropped_tightens() -> None:
    assert shift({"expr": "a < `1`"}, {"expr": "a < `1`", "when": "b"}, {}, {}).verdict == LOOSENED
    assert shift({"expr": "a < `1`", "when": "b"}, {"expr": "a < `1`"}, {}, {}).verdict == TIGHTENED


def test_markdown_numbers_are_code_spans(specs: Path, run: Path, tmp_path: Path, monkeypatch) -> None:
    changed(specs, "lib/common.yaml", "loss_max: 3.0", "loss_max: 4.5")
    md = tmp_path / "d.md"
    monkeypatch.delenv("NO_COLOR", raising=False)
    assert (
        engine_main(
            [
                "diff",
                str(FIXTURE / "probe.yaml"),
                str(specs / "probe.yaml"),
                "--evidence",
                str(run),
                "--markdown",
                str(md),
            ]
        )
        == 1
    )
    text = md.read_text()
    assert "- check `loss_below_max` (unchanged; reads a changed value) on run " in text
    assert "  - on this run: 2.25 < 3 PASS (margin 0.75) -> 2.25 < 4.5 PASS (margin 2.25)" in text
