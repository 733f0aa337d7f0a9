"""Snapshots (engine/run/snapshot.py): a run step's `snapshot:` folders are copied into the run dir before it
runs, and `engine run --from STEP` puts them back first, so that a step that failed after it had pushed resumes
from what it started from, not from its own half-done work. Real runs of python legs on a real local store."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from engine_runs import EngineRuns, dump

from engine.judge.verdict import Exit

# leg 1 leaves checkpoint 10 in the store; leg 2 lists the store, pushes checkpoint 20, rewrites
# checkpoint 10 in place (a leg may), then exits with `leg2_rc`.
LEG1 = "import os, sys; os.makedirs(sys.argv[1], exist_ok=True); open(sys.argv[1] + '/ckpt-10', 'w').write('10')"
LEG2 = (
    "import os, sys\n"
    "store, rc = sys.argv[1], int(sys.argv[2])\n"
    "print('store holds ' + ' '.join(f'{n}={open(os.path.join(store, n)).read()}' for n in sorted(os.listdir(store))))\n"
    "open(os.path.join(store, 'ckpt-20'), 'w').write('20')\n"
    "open(os.path.join(store, 'ckpt-10'), 'w').write('rewritten')\n"
    "sys.exit(rc)\n"
)


def spec_doc(**leg2: object) -> dict:
    return {
        "version": 1,
        "name": "snapprobe",
        "description": "leg 2 pushes, then fails",
        "budget_s": 100,
        "values": {
            "store": "${work_dir}/store",
            "leg2_rc": 3,
            "leg1": LEG1,
            "leg2": LEG2,
            "secret_token": "tok-0123456789abcdef",
        },
        "steps": [
            {"name": "leg1", "run": {"argv": ["${python}", "-c", "${leg1}", "${store}"], "timeout_s": 20}},
            {
                "name": "leg2",
                "snapshot": ["${store}", "${work_dir}/later"],
                "run": {"argv": ["${python}", "-c", "${leg2}", "${store}", "${leg2_rc}"], "timeout_s": 20},
                **leg2,
            },
        ],
        "checks": [{"name": "leg2_ok", "why": "leg 2 ends well", "expr": "steps.leg2.rc == `0`"}],
    }


@pytest.fixture
def failed(tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> EngineRuns:
    """The spec, and its first run in `r`, in which leg 2 pushed checkpoint 20, rewrote 10 and failed."""
    (tmp_path / "s.yaml").write_text(dump(spec_doc()))
    runs = EngineRuns(capsys, monkeypatch, tmp_path)
    ran = runs("run", "s.yaml", "--run-dir", "r", expect=Exit.FAILED)
    assert f"snapshot before leg2: {tmp_path / 'store'} (1 files, 2 bytes) -> snapshots/leg2/0" in ran.out
    assert f"snapshot before leg2: {tmp_path / 'later'} is absent" in ran.out
    assert sorted(p.name for p in (tmp_path / "store").iterdir()) == ["ckpt-10", "ckpt-20"]
    return runs


def test_from_restores_the_snapshot_taken_before_the_step(failed: EngineRuns) -> None:
    store = failed.cwd / "store"
    (failed.cwd / "later").mkdir()  # written since by the failed attempt, absent before leg 2
    ran = failed("run", "s.yaml", "--run-dir", "r", "--from", "leg2", "--set", "leg2_rc=0", expect=Exit.PASS)
    assert f"restored {store} from the snapshot taken before leg2 (1 files, 2 bytes)" in ran.out
    assert f"restored {failed.cwd / 'later'} as absent, as it was before leg2" in ran.out
    # Leg 2 started again from what it first found: checkpoint 10 as leg 1 left it, no checkpoint 20.
    assert (failed.cwd / "r" / "logs" / "leg2.log").read_text() == "store holds ckpt-10=10\n"
    entries = failed.evidence("r")["steps"]["leg2"]["snapshot"]
    assert entries[0]["path"] == str(store) and entries[0]["files"] == 1 and entries[0]["bytes"] == 2
    assert entries[0]["stored"] == "snapshots/leg2/0" and entries[0]["masked"] == [] and len(entries[0]["sha256"]) == 64
    assert entries[1] == {"path": str(failed.cwd / "later"), "stored": "snapshots/leg2/1", "absent": True}


def test_from_refuses_a_missing_snapshot_naming_it(failed: EngineRuns) -> None:
    shutil.rmtree(failed.cwd / "r" / "snapshots" / "leg2" / "0")
    before = sorted(p.name for p in (failed.cwd / "r").iterdir())
    ran = failed("run", "s.yaml", "--run-dir", "r", "--from", "leg2", "--set", "leg2_rc=0", expect=Exit.USAGE)
    assert f"refusing --from leg2: the snapshot of {failed.cwd / 'store'} taken before leg2 is missing" in ran.err
    # Nothing moved: the run dir and the store are as the failed attempt left them.
    assert sorted(p.name for p in (failed.cwd / "r").iterdir()) == before
    assert (failed.cwd / "store" / "ckpt-10").read_text() == "rewritten"


def test_from_refuses_a_snapshot_changed_since_it_was_taken(failed: EngineRuns) -> None:
    (failed.cwd / "r" / "snapshots" / "leg2" / "0" / "ckpt-10").write_text("11")
    ran = failed("run", "s.yaml", "--run-dir", "r", "--from", "leg2", expect=Exit.USAGE)
    assert "taken before leg2 changed since it was taken" in ran.err


def test_from_refuses_a_step_that_ran_without_a_snapshot(tmp_path: Path, capsys, monkeypatch) -> None:
    doc = spec_doc()
    del doc["steps"][1]["snapshot"]
    (tmp_path / "s.yaml").write_text(dump(doc))
    runs = EngineRuns(capsys, monkeypatch, tmp_path)
    runs("run", "s.yaml", "--run-dir", "r", expect=Exit.FAILED)
    (tmp_path / "s.yaml").write_text(dump(spec_doc()))
    ran = runs("run", "s.yaml", "--run-dir", "r", "--from", "leg2", expect=Exit.USAGE)
    assert f"refusing --from leg2: leg2 ran in that attempt without a snapshot of {tmp_path / 'store'}" in ran.err


def test_a_snapshot_over_its_limit_fails_the_step_before_it_runs(tmp_path: Path, capsys, monkeypatch) -> None:
    doc = spec_doc(snapshot={"paths": ["${store}"], "max_bytes": 1})
    (tmp_path / "s.yaml").write_text(dump(doc))
    runs = EngineRuns(capsys, monkeypatch, tmp_path)
    ran = runs("run", "s.yaml", "--run-dir", "r", "--set", "leg2_rc=0", expect=Exit.FAILED)
    assert "SNAPSHOT FAILED: the snapshot before leg2 would copy 2 bytes, over its limit of 1 bytes" in ran.out
    leg2 = runs.evidence("r")["steps"]["leg2"]
    assert leg2["status"] == "failed" and leg2["rc"] is None and leg2["error"].startswith("snapshot: ")
    assert sorted(p.name for p in (tmp_path / "store").iterdir()) == ["ckpt-10"]  # leg 2 never ran


def test_a_snapshot_holding_a_secret_is_masked_and_never_restored(tmp_path: Path, capsys, monkeypatch) -> None:
    doc = spec_doc()
    doc["steps"][0]["run"]["argv"][2] = LEG1.replace("write('10')", "write('key tok-0123456789abcdef')")
    (tmp_path / "s.yaml").write_text(dump(doc))
    runs = EngineRuns(capsys, monkeypatch, tmp_path)
    ran = runs("run", "s.yaml", "--run-dir", "r", expect=Exit.FAILED)
    assert "WARNING: the snapshot of" in ran.out and "held a secret, masked in ckpt-10" in ran.out
    copy = tmp_path / "r" / "snapshots" / "leg2" / "0" / "ckpt-10"
    assert "tok-0123456789abcdef" not in copy.read_text()  # the run dir keeps no secret
    ran = runs("run", "s.yaml", "--run-dir", "r", "--from", "leg2", expect=Exit.USAGE)
    assert "holds files the secret filter masked (ckpt-10): restored, they would not be what leg2 found" in ran.err
