"""Missing data is NO_DATA: deleting data from a saved P4 bundle (a harvested field, a collected state, a whole
step, a value), the checks that read it say NO_DATA (never FAIL, never PASS) and name the missing path."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Mapping

import pytest
from bundles import (
    SPECS,
    SPECS_DIR,
    check_names,
    copy_bundle,
    engine_check,
    read_evidence,
    run_json,
    spec_checks,
    write_evidence,
)
from engine_helpers import Engine

from engine.judge.verdict import Exit

# ------------------------------------------------------------------ missing data is NO_DATA

_PATH = re.compile(r"\b((?:steps|state|values)(?:\.[A-Za-z_][A-Za-z0-9_]*)+)")


def _paths(expr: str | None) -> set[str]:
    return set(_PATH.findall(expr or ""))


def _read_paths(check: Mapping[str, Any], key: str) -> set[str]:
    """Evidence paths `check[key]` reads, through its lets: `let.store.files` with `store:
    "state.hub_after_leg1"` reads state.hub_after_leg1.files."""
    lets = dict(check.get("let") or {})
    plain = {n: t for n, t in lets.items() if re.fullmatch(r"[A-Za-z_][\w.]*", t)}

    def expand(text: str | None) -> str:
        for name, target in plain.items():
            text = re.sub(rf"\blet\.{name}\b", target, text or "")
        return text or ""

    texts = [check.get(key)] + (list(lets.values()) if key == "expr" else [])
    return set().union(*(_paths(expand(t)) for t in texts))


def _reads(path: str, deleted: str) -> bool:
    return path == deleted or path.startswith(deleted + ".")


def _deletions(stem: str) -> list[str]:
    """Every evidence path a check reads, plus its containers (the step, the collected state,
    the harvested RUN_JSON): each is deleted in turn."""
    out: set[str] = set()
    for check in spec_checks(stem):
        for path in _read_paths(check, "expr") | _read_paths(check, "when"):
            parts = path.split(".")
            if parts[0] == "values":
                continue  # `engine check` reads values from the spec, not from the evidence
            out.add(path)
            if parts[0] in ("steps", "state"):
                out.add(".".join(parts[:2]))
            if len(parts) > 3 and parts[2] == "harvest":
                out.add(".".join(parts[:4]))
    return sorted(out)


def _delete(doc: dict, dotted: str) -> None:
    *head, last = dotted.split(".")
    node = doc
    for key in head:
        node = node[key]
    assert last in node, f"{dotted} is not in the saved evidence"
    del node[last]


# Checks that pass a possibly-missing value into a typed function (length(), keys(), sub(), add(),
# mul()): jmespath raises a type error on the null, and the engine must still report the missing
# path as NO_DATA, not an ERROR about types. Each such check, with one deletion that shows it.
ERROR_ON_MISSING = {
    "next_leg_continues_the_trajectory[leg=leg1]": "steps.leg1.harvest.run_json.final_loss",  # sub()
    "loss_at_horizon_below_step_one": "steps.leg1.harvest.run_json.losses",  # mul(get(..))
    "leg1_was_killed_mid_push": "steps.leg1.signals_sent",  # length()
    "leg1_left_no_run_json": "steps.leg1.harvest_errors",  # length()
    "resumed_leg_logged_each_step_after_the_resume_once[leg=leg1]": "steps.leg2.harvest.run_json.losses",  # keys()
}


def _missing_outcome_ok(name: str, result: dict) -> bool:
    """Missing data is NO_DATA, whatever function it was fed to."""
    return result["outcome"] == "NO_DATA"


def _missing_cases() -> list:
    cases = []
    for stem in SPECS:
        for deleted in _deletions(stem):
            cases.append(pytest.param(stem, deleted, id=f"{stem}-del-{deleted}"))
    return cases


@pytest.mark.parametrize("stem,deleted", _missing_cases())
def test_missing_data_is_no_data(stem: str, deleted: str, tmp_path: Path, engine: Engine, baselines: dict) -> None:
    bundle = copy_bundle(stem, tmp_path)
    doc = read_evidence(bundle)
    _delete(doc, deleted)
    write_evidence(bundle, doc)

    got = engine_check(engine, stem, bundle)

    affected = set()
    for check in spec_checks(stem):
        name = check["name"]
        base = baselines[stem][name]
        result = got.result(name)
        in_when = any(_reads(p, deleted) for p in _read_paths(check, "when"))
        in_expr = any(_reads(p, deleted) for p in _read_paths(check, "expr"))
        if in_when:
            # A `when` that cannot be read does not skip the gate: its data is missing.
            affected.add(name)
            assert result["outcome"] == "NO_DATA", (name, result)
            assert result["reason"] == f"when `{check['when']}`: no data: {result['missing'][0]} is missing"
            assert all(_reads(m, deleted) for m in result["missing"]), result["missing"]
        elif base == "SKIPPED":
            assert result["outcome"] == "SKIPPED", (name, result)  # `when` false: nothing is read
        elif in_expr:
            affected.add(name)
            assert _missing_outcome_ok(name, result), (name, result["outcome"], result["reason"])
            if result["outcome"] == "NO_DATA":
                assert result["missing"] and all(_reads(m, deleted) for m in result["missing"]), (
                    name,
                    result["missing"],
                )
                assert result["reason"].startswith(f"no data: {result['missing'][0]} is missing")
        else:
            assert result["outcome"] == base, (name, result["outcome"], result["reason"])
    if affected:
        assert got.rc == Exit.FAILED
        assert got.record["verdict"]["outcome"] == "FAIL"
        assert sorted(got.record["verdict"]["failed"]) == sorted(affected)
    else:
        assert got.rc == Exit.PASS


def test_null_is_data_absent_is_not(tmp_path: Path, engine: Engine) -> None:
    """Leg 1's val_ppl is a real `null` (validation skipped): reading it PASSes. Deleting the key
    turns the same check into NO_DATA, not a PASS and not a FAIL."""
    bundle = copy_bundle("p4_smoke", tmp_path / "null")
    assert run_json(read_evidence(bundle), "leg1")["val_ppl"] is None
    got = engine_check(engine, "p4_smoke", bundle)
    assert got.result("skipped_validation_by_design[leg=leg1]")["outcome"] == "PASS"

    bundle = copy_bundle("p4_smoke", tmp_path / "absent")
    doc = read_evidence(bundle)
    del run_json(doc, "leg1")["val_ppl"]
    write_evidence(bundle, doc)
    got = engine_check(engine, "p4_smoke", bundle)
    result = got.result("skipped_validation_by_design[leg=leg1]")
    assert result["outcome"] == "NO_DATA"
    assert result["missing"] == ["steps.leg1.harvest.run_json.val_ppl"]
    assert result["reason"] == "no data: steps.leg1.harvest.run_json.val_ppl is missing"
    assert got.rc == Exit.FAILED


def test_leg_without_run_json_is_no_data_for_every_reader(tmp_path: Path, engine: Engine, baselines: dict) -> None:
    """What the engine records when leg 2 printed no RUN_JSON line at all (a crash after the last
    step): every check that reads leg 2's RUN_JSON is NO_DATA and names it."""
    bundle = copy_bundle("p4_smoke", tmp_path)
    doc = read_evidence(bundle)
    del doc["steps"]["leg2"]["harvest"]["run_json"]  # its progress lines stay: they were printed
    doc["steps"]["leg2"]["harvest_errors"] = [
        {"name": "run_json", "marker": "RUN_JSON ", "line": None, "error": "missing", "text": None}
    ]
    write_evidence(bundle, doc)
    got = engine_check(engine, "p4_smoke", bundle)
    readers = {
        c["name"]
        for c in spec_checks("p4_smoke")
        if any(_reads(p, "steps.leg2.harvest.run_json") for p in _read_paths(c, "expr"))
    }
    assert readers >= {
        "final_leg_reached_the_horizon",
        "horizon_tokens_match_the_arithmetic",
        "final_leg_validation_actually_ran",
        "loss_at_horizon_below_step_one",
        "no_nonfinite_loss[leg=leg2]",
        "next_leg_continues_the_trajectory[leg=leg1]",
    }
    not_pass = {n: o for n, o in got.outcomes.items() if o != baselines["p4_smoke"][n]}
    assert set(not_pass) == readers
    for name in readers:
        result = got.result(name)
        assert _missing_outcome_ok(name, result), (name, result["outcome"], result["reason"])
        if result["outcome"] == "NO_DATA":
            assert result["missing"][0].startswith("steps.leg2.harvest.run_json"), name
    assert set(not_pass.values()) == {"NO_DATA"}, not_pass
    assert got.rc == Exit.FAILED
    assert sorted(got.record["verdict"]["failed"]) == sorted(readers)


def _function_gap_cases() -> list:
    return [
        pytest.param(stem, name, ERROR_ON_MISSING[name], id=f"{stem}-{name}")
        for stem in SPECS
        for name in check_names(stem)
        if name in ERROR_ON_MISSING
    ]


def test_error_on_missing_names_real_checks() -> None:
    every = {n for stem in SPECS for n in check_names(stem)}
    assert set(ERROR_ON_MISSING) <= every


@pytest.mark.parametrize("stem,name,deleted", _function_gap_cases())
def test_missing_value_in_a_function_is_no_data(
    stem: str, name: str, deleted: str, tmp_path: Path, engine: Engine
) -> None:
    bundle = copy_bundle(stem, tmp_path)
    doc = read_evidence(bundle)
    _delete(doc, deleted)
    write_evidence(bundle, doc)
    got = engine_check(engine, stem, bundle)
    assert got.rc == Exit.FAILED and name in got.record["verdict"]["failed"]
    result = got.result(name)
    assert result["outcome"] == "NO_DATA", (result["outcome"], result["reason"])
    assert result["reason"] == f"no data: {deleted} is missing" or result["reason"].startswith(f"no data: {deleted}")


# ------------------------------------------------------------------ absence asked with `null`

NO_RUN_JSON = """\
version: 1
name: p4_preempt
extends: {parent}
checks:
  - name: leg1_printed_no_run_json
    why: A SIGKILLed trainer cannot have reported; a RUN_JSON here would mean the kill landed after the run ended.
    expr: "steps.leg1.harvest.run_json == `null`"
"""


def _check_no_run_json(engine: Engine, tmp_path: Path, bundle: Path) -> dict:
    spec = tmp_path / "no_run_json.yaml"
    spec.write_text(NO_RUN_JSON.format(parent=SPECS_DIR / "p4_preempt.yaml"))
    before = set(bundle.glob("check-*.json"))
    ran = engine("check", str(spec), "--evidence", str(bundle))
    assert ran.code != Exit.USAGE, ran
    (new,) = set(bundle.glob("check-*.json")) - before
    record = json.loads(new.read_text(encoding="utf-8"))
    return next(r for r in record["checks"] if r["name"] == "leg1_printed_no_run_json")


def test_a_killed_leg_that_printed_no_run_json_is_asserted_with_null(tmp_path: Path, engine: Engine):
    """The saved preempt run: leg 1 was SIGKILLed mid-push, its harvest rule matched no line, and the
    evidence records that (`harvest_errors`, kind missing). `== `null`` asks exactly that."""
    bundle = copy_bundle("p4_preempt", tmp_path / "as_saved")
    doc = read_evidence(bundle)
    assert "run_json" not in doc["steps"]["leg1"]["harvest"]
    result = _check_no_run_json(engine, tmp_path, bundle)
    assert (result["outcome"], result["missing"]) == ("PASS", [])
    assert result["explain"] == [["steps.leg1.harvest.run_json", "<absent>"]]

    # The kill landed after the trainer reported: leg 1 has a RUN_JSON, and the check fails on it.
    bundle = copy_bundle("p4_preempt", tmp_path / "reported")
    doc = read_evidence(bundle)
    doc["steps"]["leg1"]["harvest"]["run_json"] = {"final_step": 20}
    doc["steps"]["leg1"]["harvest_errors"] = []
    write_evidence(bundle, doc)
    result = _check_no_run_json(engine, tmp_path, bundle)
    assert (result["outcome"], result["explain"]) == ("FAIL", [["steps.leg1.harvest.run_json", '{"final_step":20}']])

    # Evidence that does not record the absence (its harvest_errors deleted) answers nothing: NO_DATA.
    bundle = copy_bundle("p4_preempt", tmp_path / "unrecorded")
    doc = read_evidence(bundle)
    del doc["steps"]["leg1"]["harvest_errors"]
    write_evidence(bundle, doc)
    result = _check_no_run_json(engine, tmp_path, bundle)
    assert (result["outcome"], result["missing"]) == ("NO_DATA", ["steps.leg1.harvest.run_json"])


@pytest.mark.parametrize("stem", SPECS)
def test_a_store_listing_that_failed_passes_no_check_that_reads_it(stem: str, tmp_path: Path, engine: Engine) -> None:
    # The hub collector never raises: a listing that failed is its `error` beside an empty store, and an
    # empty store holds no final/ and no stale optimizer state either. That is no data, never a PASS.
    bundle = copy_bundle(stem, tmp_path)
    doc = read_evidence(bundle)
    state = doc["state"]["hub_after_leg1"]
    state.update(error="HfHubHTTPError: 503 Service Unavailable", files=[], sha256={}, checkpoints=[], pointer=None)
    state.update(has_final=False)
    for key in ("pointer_target_sha256", "pointer_target_sha256_stored"):
        state.pop(key, None)
    write_evidence(bundle, doc)

    got = engine_check(engine, stem, bundle)

    outcomes = {r["name"]: r["outcome"] for r in got.record["checks"]}
    readers = {
        c["name"]
        for c in spec_checks(stem)
        if any(p.startswith("state.hub_after_leg1") for p in _read_paths(c, "expr"))
    }
    assert {"no_final_before_the_horizon[leg=leg1]", "old_optimizer_states_pruned_after[leg=leg1]"} <= readers
    assert {n: outcomes[n] for n in readers if outcomes[n] == "PASS"} == {}
    assert got.rc == Exit.FAILED
