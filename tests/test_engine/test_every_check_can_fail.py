"""Every check can fail: each check of the P4 specs is shown to FAIL when its fact is false.

The input is real evidence: `evidence/<spec stem>/` holds the `evidence.json` and raw `logs/` of a
real `engine run` of that spec on the embedded default (CPU, 2 gloo ranks, tiny model, local store).
For every check of p4_smoke, p4_soak and p4_preempt, a copy of that bundle is tampered (tests/tampers.py)
so that the check's fact is false. `engine check` is then run on the copy and must report exactly that
check as FAIL, every other check as in the untampered run, and a failing verdict (exit 5).

The check list is read from the specs themselves (load_spec + build_plan): a check added to a spec
without a tamper case makes `test_every_check_has_a_tamper_case` fail.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from bundles import (
    EVIDENCE_DIR,
    ROOT,
    SPECS,
    SPECS_DIR,
    check_names,
    copy_bundle,
    engine_check,
    read_evidence,
    run_json,
    write_evidence,
)
from engine_helpers import Engine
from tamper_legs import arm_peak_gate, leg1_one_step_late, leg2_restarted_from_random_weights
from tampers import TAMPERS, cases

from engine.judge.verdict import Exit

# ------------------------------------------------------------------ the bundles themselves


@pytest.mark.parametrize("stem", SPECS)
def test_saved_bundle_is_a_small_real_run(stem: str) -> None:
    bundle = EVIDENCE_DIR / stem
    doc = read_evidence(bundle)
    assert doc["spec"]["name"] == stem
    assert doc["spec"]["path"] == f"specs/{stem}.yaml"
    assert doc["verdict"]["outcome"] == "PASS" and doc["verdict"]["exit_code"] == 0
    # evidence.json and the raw logs only: no checkpoints, no train dirs, no re-check records.
    # (re-check records a local `engine check` leaves there are gitignored, not part of the bundle)
    kept = sorted(p.name for p in bundle.iterdir() if not re.match(r"(check|replay)-.*\.json$", p.name))
    assert kept == ["evidence.json", "logs"]
    logs = {doc["steps"][s]["log"] for s in doc["steps"] if doc["steps"][s].get("log")}
    assert logs and all((bundle / log).is_file() for log in logs), logs
    assert sorted(f"logs/{p.name}" for p in (bundle / "logs").iterdir()) == sorted(logs)
    size = sum(p.stat().st_size for p in bundle.rglob("*") if p.is_file())
    assert size < 1_000_000, f"{stem} bundle is {size} bytes"
    # Every run step really ran; every collect really collected: the store after each leg, the reference's
    # store, and the horizon's checkpoint against the reference's.
    assert {s: st["status"] for s, st in doc["steps"].items() if st["kind"] == "collect"} == {
        "hub_after_leg1": "ok",
        "hub_after_leg2": "ok",
        "reference_store": "ok",
        "leg2_vs_reference": "ok",
    }
    assert doc["steps"]["reference"]["status"] == "ok" and doc["state"]["leg2_vs_reference"]["equal"] is True


@pytest.mark.parametrize("stem", SPECS)
def test_untampered_bundle_passes(stem: str, tmp_path: Path, engine: Engine) -> None:
    bundle = copy_bundle(stem, tmp_path)
    got = engine_check(engine, stem, bundle)
    assert got.rc == Exit.PASS
    assert got.record["verdict"]["outcome"] == "PASS" and got.record["verdict"]["failed"] == []
    assert [r["name"] for r in got.record["checks"]] == check_names(stem)
    allowed = {"PASS"} | ({"SKIPPED"} if stem == "p4_soak" else set())
    assert set(got.outcomes.values()) <= allowed, got.outcomes
    assert f"VERDICT {stem} PASS" in got.out


def test_soak_peak_gate_is_skipped_on_the_local_target(baselines: dict) -> None:
    # The only SKIPPED check: the local soak has no device memory to gate.
    skipped = {(s, n) for s in SPECS for n, o in baselines[s].items() if o == "SKIPPED"}
    assert skipped == {("p4_soak", "peak_memory_during_training_below_gate")}


@pytest.mark.parametrize("stem", SPECS)
def test_replay_re_harvests_the_saved_logs(stem: str, tmp_path: Path, engine: Engine) -> None:
    """The logs/ kept in the bundle are enough for `engine replay` to re-derive every harvest."""
    bundle = copy_bundle(stem, tmp_path)
    saved = read_evidence(bundle)
    engine("replay", str(SPECS_DIR / f"{stem}.yaml"), "--evidence", str(bundle), expect=Exit.PASS)
    record = json.loads(next(bundle.glob("replay-*.json")).read_text(encoding="utf-8"))
    harvested = [n for n, st in saved["steps"].items() if st["kind"] == "run" and "harvest" in st]
    assert {"leg1", "leg2"} <= set(harvested)
    for name in harvested:
        step = saved["steps"][name]
        if step["kind"] == "run":
            assert record["steps"][name]["harvest"] == step["harvest"], name


@pytest.mark.parametrize("stem", SPECS)
def test_bundle_checks_from_another_checkout(
    stem: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, engine: Engine
) -> None:
    """The evidence records this machine's absolute paths (run_dir, work_dir, python); a clone
    elsewhere (CI) must still re-check it with relative paths from its own root."""
    clone = tmp_path / "elsewhere" / "clone"
    shutil.copytree(SPECS_DIR, clone / "specs")
    shutil.copytree(EVIDENCE_DIR / stem, clone / "evidence" / stem)
    ran = engine("check", f"specs/{stem}.yaml", "--evidence", f"evidence/{stem}", cwd=clone, expect=Exit.PASS)
    assert f"VERDICT {stem} PASS" in ran.out
    assert len(list((clone / "evidence" / stem).glob("check-*.json"))) == 1


def test_bundles_check_like_ci_without_torch_or_trainer(tmp_path: Path) -> None:
    """CI installs only the engine's pure-Python dependencies: `engine check` on a clone elsewhere
    must pass with torch and trainer unimportable."""
    clone = tmp_path / "ci" / "checkout"
    shutil.copytree(SPECS_DIR, clone / "specs")
    shutil.copytree(EVIDENCE_DIR, clone / "evidence")
    script = (
        "import sys\n"
        "for m in ('torch', 'trainer', 'safetensors', 'huggingface_hub', 'numpy'):\n"
        "    sys.modules[m] = None\n"
        "from engine.cli import main\n"
        f"rcs = [main(['check', f'specs/{{s}}.yaml', '--evidence', f'evidence/{{s}}']) for s in {list(SPECS)!r}]\n"
        "print('RCS', rcs)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script],
        cwd=clone,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.returncode == 0, proc.stderr
    assert "RCS [0, 0, 0]" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-2000:]
    for stem in SPECS:
        assert f"VERDICT {stem} PASS" in proc.stdout


# ------------------------------------------------------------------ every check can fail


def test_every_check_has_a_tamper_case() -> None:
    """A new check without a tamper case (or a stale case for a removed check) fails here."""
    in_specs: set[str] = set()
    for stem in SPECS:
        names = check_names(stem)
        assert len(names) == len(set(names)), f"{stem}: duplicate check names"
        missing = [n for n in names if n not in TAMPERS]
        assert not missing, f"{stem}: checks without a tamper case: {missing}"
        in_specs.update(names)
    assert set(TAMPERS) == in_specs
    assert all(TAMPERS[n] for n in TAMPERS), "every check needs at least one tamper"


@pytest.mark.parametrize("stem,name,index", cases())
def test_tampered_fact_fails_exactly_its_check(
    stem: str, name: str, index: int, tmp_path: Path, engine: Engine, baselines: dict
) -> None:
    tamper = TAMPERS[name][index]
    bundle = copy_bundle(stem, tmp_path)
    doc = read_evidence(bundle)
    before = copy.deepcopy(doc)
    more = tamper.apply(doc) or {}
    assert doc != before, f"tamper {tamper.fact!r} changed nothing"
    write_evidence(bundle, doc)

    got = engine_check(engine, stem, bundle)

    expected = {name: "FAIL", **{n: o for n, o in {**tamper.also, **more}.items() if n in check_names(stem)}}
    expected_fail = set(expected)
    flipped = {n: o for n, o in got.outcomes.items() if o != baselines[stem][n]}
    assert flipped == expected, f"{tamper.fact}: expected {expected} to flip, got {flipped}"
    for failed in expected_fail:
        result = got.result(failed)
        assert (result["missing"] == []) == (expected[failed] != "NO_DATA"), result["missing"]
    # The intended check says what it saw: a false (or non-true) value, with its operands.
    mine = got.result(name)
    assert mine["value"] is not True
    assert mine["explain"], "a failing check must explain its operands"
    assert got.rc == Exit.FAILED
    verdict = got.record["verdict"]
    assert verdict["outcome"] == "FAIL" and verdict["exit_code"] == Exit.FAILED
    failed_steps = {f"step:{n}" for n, s in doc["steps"].items() if s.get("status") == "failed"}
    assert sorted(verdict["failed"]) == sorted(expected_fail | failed_steps)
    assert f"VERDICT {stem} FAIL" in got.out and name in got.out


def test_soak_peak_gate_passes_at_and_below_the_gate(tmp_path: Path, engine: Engine) -> None:
    """The control for the 13.7 GB case: the gate is `<=`, so 13.6 and 12.25 pass once armed."""
    for peak in (13.6, 12.25):
        bundle = copy_bundle("p4_soak", tmp_path / str(peak))
        doc = read_evidence(bundle)
        arm_peak_gate(doc)
        run_json(doc, "leg1").update(
            peak_reserved_gb_max_rank=peak, peak_reserved_gb_by_rank=[peak, peak - 0.5], peak_gpu_gb_max_rank=peak - 1
        )
        write_evidence(bundle, doc)
        got = engine_check(engine, "p4_soak", bundle)
        assert got.result("peak_memory_during_training_below_gate")["outcome"] == "PASS", peak
        assert got.rc == Exit.PASS


def test_soak_peak_gate_armed_on_a_cpu_run_fails(tmp_path: Path, engine: Engine) -> None:
    """Armed on a run that measured nothing (peak null on CPU): a FAIL, not a silent pass."""
    bundle = copy_bundle("p4_soak", tmp_path)
    doc = read_evidence(bundle)
    assert run_json(doc, "leg1")["peak_reserved_gb_max_rank"] is None
    arm_peak_gate(doc)
    write_evidence(bundle, doc)
    got = engine_check(engine, "p4_soak", bundle)
    result = got.result("peak_memory_during_training_below_gate")
    assert result["outcome"] == "FAIL" and result["value"] is None
    assert got.rc == Exit.FAILED


def test_restart_from_random_weights_is_caught_by_the_trajectory_check_in_soak(
    tmp_path: Path, engine: Engine, baselines: dict
) -> None:
    """The check's own scenario (`why`): a restart from random weights jumps back up (and leaves the run that
    never stopped)."""
    bundle = copy_bundle("p4_soak", tmp_path)
    doc = read_evidence(bundle)
    leg2_restarted_from_random_weights(doc)
    write_evidence(bundle, doc)
    got = engine_check(engine, "p4_soak", bundle)
    flipped = {n for n, o in got.outcomes.items() if o != baselines["p4_soak"][n]}
    assert flipped == {"next_leg_continues_the_trajectory[leg=leg1]", "losses_match_the_reference[leg=leg2]"}


def test_restart_from_random_weights_is_caught_by_the_trajectory_check_in_smoke(tmp_path: Path, engine: Engine) -> None:
    bundle = copy_bundle("p4_smoke", tmp_path)
    doc = read_evidence(bundle)
    leg2_restarted_from_random_weights(doc)
    write_evidence(bundle, doc)
    got = engine_check(engine, "p4_smoke", bundle)
    assert got.result("next_leg_continues_the_trajectory[leg=leg1]")["outcome"] == "FAIL"


def test_a_tampered_copy_leaves_the_saved_bundle_untouched(tmp_path: Path, engine: Engine) -> None:
    def snapshot() -> dict[str, str]:
        return {
            str(p.relative_to(EVIDENCE_DIR)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(EVIDENCE_DIR.rglob("*"))
            if p.is_file()
        }

    before = snapshot()
    bundle = copy_bundle("p4_smoke", tmp_path)
    doc = read_evidence(bundle)
    leg1_one_step_late(doc)
    write_evidence(bundle, doc)
    assert engine_check(engine, "p4_smoke", bundle).rc == Exit.FAILED
    assert snapshot() == before
    assert read_evidence(EVIDENCE_DIR / "p4_smoke") != doc
