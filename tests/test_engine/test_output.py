"""engine/run/output.py: per-line rules over real leg output (and directly over blocks)."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import pytest

from engine.run.console import Console, ProgressDisplay, progress_text
from engine.run.lines import Block
from engine.run.output import MISSING, Capture, ProgressState, compile_rules, reharvest
from engine.run.process import run_command

LEG = str(Path(__file__).parents[1] / "legs" / "leg.py")
TEE = r"^\[(?:default|rank|worker)\d*\]:\s*"


def capture_of(run: dict, *actions: str, out: io.StringIO | None = None, log: Path | None = None) -> Capture:
    rules = compile_rules(run)
    capture = Capture(rules, Console(out or io.StringIO(), is_tty=False))
    run_command(
        [sys.executable, LEG, *actions],
        on_block=capture.feed,
        strip_prefix=rules.strip_prefix,
        log_path=log,
        timeout_s=30,
    )
    return capture


def feed_lines(capture: Capture, lines: list[str]) -> None:
    capture.feed(Block.from_lines(lines, capture.lines + 1))


def test_prefix_is_stripped_once_before_harvest() -> None:
    run = {"output": {"strip_prefix": TEE, "harvest": {"run_json": {"marker": "RUN_JSON ", "pick": "last"}}}}
    capture = capture_of(
        run, "[default0]: hello", '[default0]: RUN_JSON {"final_step": 10}', "[default1]: [default1]: nested"
    )
    harvest, errors = capture.harvest_result()
    assert harvest == {"run_json": {"final_step": 10}}
    assert errors == []
    assert capture.tail_lines() == ["hello", 'RUN_JSON {"final_step": 10}', "[default1]: nested"]


def test_harvest_first_last_all() -> None:
    run = {
        "output": {
            "harvest": {
                "a": {"marker": "M ", "pick": "first"},
                "b": {"marker": "M ", "pick": "last"},
                "c": {"marker": "M ", "pick": "all"},
            }
        }
    }
    capture = capture_of(run, "M 1", "noise M 9", "M 2", "M 3")
    harvest, errors = capture.harvest_result()
    assert harvest == {"a": 1, "b": 3, "c": [1, 2, 3]}
    # first/last chose one of three different values: recorded as a conflict naming the lines;
    # `all` keeps every one of them by design.
    assert [(e["name"], e["kind"], e["lines"], e["line"]) for e in errors] == [
        ("a", "conflict", [1, 3, 4], 1),
        ("b", "conflict", [1, 3, 4], 4),
    ]


def test_malformed_marker_line_is_an_error_entry_not_a_crash() -> None:
    run = {"output": {"harvest": {"run_json": {"marker": "RUN_JSON ", "pick": "last"}}}}
    capture = capture_of(run, 'RUN_JSON {"step": 1}', "RUN_JSON {broken", "after")
    harvest, errors = capture.harvest_result()
    assert harvest == {"run_json": {"step": 1}}  # the last VALID one
    assert len(errors) == 1
    error = errors[0]
    assert error["name"] == "run_json" and error["marker"] == "RUN_JSON " and error["line"] == 2
    assert error["text"] == "RUN_JSON {broken"
    assert error["error"].startswith("invalid JSON:")


def test_missing_marker_leaves_the_value_absent_and_says_missing() -> None:
    run = {"output": {"harvest": {"run_json": {"marker": "RUN_JSON ", "pick": "last"}}}}
    capture = capture_of(run, "no marker here")
    harvest, errors = capture.harvest_result()
    assert "run_json" not in harvest
    assert errors == [
        {"name": "run_json", "marker": "RUN_JSON ", "line": None, "kind": "missing", "error": MISSING, "text": None}
    ]


def test_echo_prefixes_print_key_lines_truncated() -> None:
    out = io.StringIO()
    run = {"output": {"strip_prefix": TEE, "echo_prefixes": ["CKPT ", "resume from"]}}
    capture_of(run, "[default0]: CKPT push step=10", "CKPT-not", "resume from step 10", "CKPT " + "x" * 400, out=out)
    lines = out.getvalue().splitlines()
    assert lines[:2] == ["  KEY> CKPT push step=10", "  KEY> resume from step 10"]
    assert lines[2] == "  KEY> " + ("CKPT " + "x" * 400)[:300]
    assert len(lines) == 3


def test_failure_lines_come_from_the_whole_capture() -> None:
    """A traceback 200 lines before the end is still found; the tail alone would miss it."""
    run = {"output": {"failure_patterns": ["Traceback", "Error"], "failure_lines": 5, "tail_lines": 3}}
    capture = capture_of(
        run, "Traceback (most recent call last):", "ValueError: bad shard", "@repeat:200:torchrun summary {i}"
    )
    assert capture.failure_lines() == ["Traceback (most recent call last):", "ValueError: bad shard"]
    assert capture.failure_hits == 2
    assert capture.tail_lines() == ["torchrun summary 197", "torchrun summary 198", "torchrun summary 199"]
    assert capture.lines == 202


def test_failure_lines_keep_only_the_last_n_but_count_all() -> None:
    capture = Capture(compile_rules({"output": {"failure_patterns": ["E"], "failure_lines": 2}}))
    feed_lines(capture, ["E1", "x", "E2"])
    feed_lines(capture, ["E3", "y"])
    assert capture.failure_lines() == ["E2", "E3"]
    assert capture.failure_hits == 3


def test_block_scan_finds_marker_on_every_line_position() -> None:
    rules = compile_rules({"output": {"harvest": {"m": {"marker": "M ", "pick": "all"}}, "failure_patterns": []}})
    capture = Capture(rules)
    feed_lines(capture, ["M 1", "M 2", "z M 3", "", "M 4"])
    assert capture.harvest_result()[0] == {"m": [1, 2, 4]}


def test_progress_plain_lines_on_a_non_tty(monkeypatch) -> None:
    out = io.StringIO()
    rules = compile_rules({"progress": {"match": r"^step (?P<step>\d+)/(?P<total>\d+)", "every_s": 0.2}})
    console = Console(out, is_tty=False)
    capture = Capture(rules, console)
    display = ProgressDisplay("leg1", capture.progress, rules.progress.every_s, console)
    run_command(
        [sys.executable, LEG, "step 1/20", "@sleep:0.3", "step 2/20", "@sleep:0.3", "step 12/20", "@sleep:0.3"],
        on_block=capture.feed,
        on_tick=display.tick,
    )
    lines = [line for line in out.getvalue().splitlines() if line.startswith("  progress leg1")]
    assert len(lines) >= 3
    assert lines[-1].startswith("  progress leg1: step 12/20 (60%) ")
    assert "step/s ETA " in lines[-1]
    assert capture.progress.as_dict()["step"] == 12


def test_progress_on_a_tty_is_one_live_line() -> None:
    out = io.StringIO()
    rules = compile_rules({"progress": {"match": r"step (?P<step>\d+)/(?P<total>\d+)"}})
    console = Console(out, is_tty=True)
    capture = Capture(rules, console)
    display = ProgressDisplay("leg1", capture.progress, rules.progress.every_s, console)
    feed_lines(capture, ["step 3/10"])
    display.tick(1.0)
    console.line("KEY line")
    display.tick(2.0)
    display.close()
    text = out.getvalue()
    assert text.startswith("\rprogress leg1: step 3/10 (30%)")
    assert "KEY line\n" in text and text.endswith("\n")
    # The printed line wiped the live line; the next tick draws it again.
    assert text.split("KEY line\n")[1].startswith("\rprogress leg1: step 3/10")


def test_rate_and_eta_come_from_steps_seen_not_startup() -> None:
    state = ProgressState()
    state.observe(10, 20, at=100.0)  # a resumed leg starts at step 10 after a long model build
    state.observe(14, 20, at=104.0)
    assert state.rate() == pytest.approx(1.0)
    assert state.eta_s() == pytest.approx(6.0)
    assert progress_text("leg2", state, 50.0) == "  progress leg2: step 14/20 (70%) 1 step/s ETA 6s"


def test_bad_rules_name_the_field() -> None:
    with pytest.raises(ValueError, match="output.strip_prefix"):
        compile_rules({"output": {"strip_prefix": "("}})
    with pytest.raises(ValueError, match="pick"):
        compile_rules({"output": {"harvest": {"x": {"marker": "X", "pick": "middle"}}}})
    with pytest.raises(ValueError, match="lacks the named group 'step'"):
        compile_rules({"progress": {"match": r"(?P<total>\d+)"}})
    with pytest.raises(ValueError, match="progress.phases.pushing"):
        compile_rules({"progress": {"match": r"(?P<step>\d+)", "phases": {"pushing": "("}}})


def test_reharvest_uses_current_rules_on_the_raw_log(tmp_path: Path) -> None:
    log = tmp_path / "leg1.log"
    # The run had no strip rule, so the prefixed marker was not harvested at the time.
    capture = capture_of(
        {"output": {"harvest": {"rj": {"marker": "RUN_JSON "}}}},
        '[default0]: RUN_JSON {"final_step": 20}',
        "Traceback: x",
        log=log,
    )
    assert "rj" not in capture.harvest_result()[0]
    step = {
        "name": "leg1",
        "run": {
            "output": {
                "strip_prefix": TEE,
                "harvest": {"rj": {"marker": "RUN_JSON ", "pick": "last"}},
                "failure_patterns": ["Traceback"],
            }
        },
    }
    again = reharvest(step, log, tmp_path)
    assert again["harvest"] == {"rj": {"final_step": 20}}
    assert again["harvest_errors"] == []
    assert again["failure_lines"] == ["Traceback: x"]
    assert again["lines"] == 2


def test_match_rule_harvests_named_groups_of_every_matching_line() -> None:
    """Figures a leg prints only in its progress lines (tokens/s per logged step) become data."""
    run = {
        "output": {
            "strip_prefix": TEE,
            "harvest": {
                "progress": {
                    "match": r"^step (?P<step>\d+)/\d+ loss (?P<loss>\S+) tok/s (?P<tok_s>\S+)",
                    "pick": "all",
                },
                "first": {"match": r"^step (?P<step>\d+)/", "pick": "first"},
                "last": {"match": r"^step (?P<step>\d+)/"},
            },
        }
    }
    capture = capture_of(
        run,
        "[default0]:step 1/9 loss 6.25 tok/s 1500",
        "noise step 2/9",
        "[default0]:step 5/9 loss nan tok/s 2.5e3",
        "[default0]:step 9/9 loss NaN tok/s 7",
    )
    harvest, errors = capture.harvest_result()
    # Numbers as numbers; text that is no JSON number (nan, NaN) stays text, for a plot to show as a gap.
    assert harvest["progress"] == [
        {"step": 1, "loss": 6.25, "tok_s": 1500},
        {"step": 5, "loss": "nan", "tok_s": 2500.0},
        {"step": 9, "loss": "NaN", "tok_s": 7},
    ]
    assert harvest["first"] == {"step": 1} and harvest["last"] == {"step": 9}
    assert errors == []


def test_match_rule_that_never_matches_is_a_missing_harvest_error() -> None:
    run = {"output": {"harvest": {"progress": {"match": r"^step (?P<step>\d+)", "pick": "all"}}}}
    capture = capture_of(run, "hello", "world")
    harvest, errors = capture.harvest_result()
    assert "progress" not in harvest
    assert errors == [
        {
            "name": "progress",
            "marker": None,
            "line": None,
            "kind": "missing",
            "error": MISSING,
            "text": None,
            "match": r"^step (?P<step>\d+)",
        }
    ]


def test_match_rule_without_a_named_group_is_refused() -> None:
    with pytest.raises(ValueError, match=r"output.harvest.p.match .* has no named group"):
        compile_rules({"output": {"harvest": {"p": {"match": r"^step \d+"}}}})
    with pytest.raises(ValueError, match=r"output.harvest.p.match"):
        compile_rules({"output": {"harvest": {"p": {"match": "("}}}})


def test_replay_harvests_a_match_rule_from_the_raw_log(tmp_path: Path) -> None:
    log = tmp_path / "leg1.log"
    capture_of({}, "[default0]:step 1/2 rate 10", "[default0]:step 2/2 rate 12", log=log)
    step = {
        "name": "leg1",
        "run": {
            "output": {
                "strip_prefix": TEE,
                "harvest": {"rates": {"match": r"^step (?P<step>\d+)/\d+ rate (?P<rate>\d+)", "pick": "all"}},
            }
        },
    }
    assert reharvest(step, log, tmp_path)["harvest"] == {"rates": [{"step": 1, "rate": 10}, {"step": 2, "rate": 12}]}
