"""engine/run/evidence.py: evidence.json is standard JSON; non-finite numbers are stored as
{"$nonfinite": ...} and load back as the floats the live run's checks saw."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from engine_helpers import leg, write_spec

from engine.judge.verdict import Exit
from engine.run import evidence

# Python's json (the trainer's) writes NaN and Infinity as bare tokens; the harvest reads them so.
DIVERGED = 'RUN_JSON {"final_loss": NaN, "peak": Infinity, "low": -Infinity, "ok": 1.5}'
RUN_JSON = {"harvest": {"run_json": {"marker": "RUN_JSON ", "pick": "last"}}}
NONFINITE_CHECKS = [
    ("loss_is_finite", "a NaN loss is a diverged run", "is_finite(steps.leg1.harvest.run_json.final_loss)"),
    ("loss_below_ceiling", "NaN never passes a comparison", "steps.leg1.harvest.run_json.final_loss < `6`"),
    ("loss_not_above_ceiling", "nor its negation", "!(steps.leg1.harvest.run_json.final_loss >= `6`)"),
    ("peak_is_finite", "an infinite peak is no measurement", "is_finite(steps.leg1.harvest.run_json.peak)"),
    ("low_below_zero", "minus infinity still compares", "steps.leg1.harvest.run_json.low < `0`"),
]


def strict_loads(text: str) -> object:
    """A reader that refuses NaN/Infinity tokens, as jq and JavaScript do."""

    def refuse(token: str) -> None:
        raise ValueError(f"non-standard JSON token {token}")

    return json.loads(text, parse_constant=refuse)


def test_nonfinite_numbers_are_stored_as_standard_json_and_judged_alike(engine, tmp_path: Path) -> None:
    checks = [{"name": name, "why": why, "expr": expr} for name, why, expr in NONFINITE_CHECKS]
    steps = [leg(DIVERGED, name="leg1", timeout_s=30, output=RUN_JSON)]
    spec = write_spec(tmp_path / "n.yaml", steps, name="nonfinite", budget_s=100, checks=checks)
    engine("run", str(spec), "--run-dir", "r", cwd=tmp_path, expect=Exit.FAILED)
    text = (tmp_path / "r" / "evidence.json").read_text()
    stored = strict_loads(text)["steps"]["leg1"]["harvest"]["run_json"]
    assert stored == {
        "final_loss": {"$nonfinite": "NaN"},
        "peak": {"$nonfinite": "Infinity"},
        "low": {"$nonfinite": "-Infinity"},
        "ok": 1.5,
    }
    live = {c["name"]: c["outcome"] for c in strict_loads(text)["checks"]}
    assert live == {
        "loss_is_finite": "FAIL",
        "loss_below_ceiling": "FAIL",
        "loss_not_above_ceiling": "PASS",
        "peak_is_finite": "FAIL",
        "low_below_zero": "PASS",
    }
    engine("check", str(spec), "--evidence", "r", cwd=tmp_path)
    (record,) = (tmp_path / "r").glob("check-*.json")
    rechecked = {c["name"]: c["outcome"] for c in strict_loads(record.read_text())["checks"]}
    assert rechecked == live
    loaded = evidence.load(tmp_path / "r")["steps"]["leg1"]["harvest"]["run_json"]
    assert math.isnan(loaded["final_loss"]) and loaded["peak"] == math.inf and loaded["low"] == -math.inf


def test_dumps_and_loads_round_trip_every_nonfinite_value() -> None:
    doc = {"a": [math.nan, 1.0, (math.inf, -math.inf)], "b": {"c": math.nan}, "d": "NaN"}
    text = evidence.dumps(doc)
    strict_loads(text)
    back = evidence.loads(text)
    assert math.isnan(back["a"][0]) and back["a"][1:] == [1.0, [math.inf, -math.inf]]
    assert math.isnan(back["b"]["c"]) and back["d"] == "NaN"
    assert evidence.loads('{"x": NaN}')["x"] != evidence.loads('{"x": NaN}')["x"]  # old files still load


def test_a_malformed_nonfinite_form_is_an_error_naming_the_file(tmp_path: Path) -> None:
    (tmp_path / "evidence.json").write_text('{"evidence_version": 1, "v": {"$nonfinite": "nan"}}')
    with pytest.raises(evidence.EvidenceError, match=r"evidence.json: .*\"nan\".*NaN, Infinity, -Infinity"):
        evidence.load(tmp_path)
