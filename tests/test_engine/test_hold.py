"""Kill points that are not racy: a signal rule `hold_at: POINT` names the point in the leg's SPECPROBE_HOLD_AT; a
leg that supports the hold protocol prints its line there and stops itself, and the engine holds the rest of its
tree and signals it there. A rule with `hold: true` holds the tree at any line. Real legs that would otherwise
race: they write files right after the line."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from engine_runs import EngineRuns, dump

from engine.judge.verdict import Exit

# The leg side of the protocol, as a probe's emitter implements it: at a named point, when the
# environment names it, print the line, then stop itself. Then it writes 500 files as fast as it can
# (the save a kill should interrupt), in a child process too, which would run on if only the leg stopped.
LEG = """\
import os, signal, subprocess, sys, time
out = sys.argv[1]
os.makedirs(out, exist_ok=True)

def hold_at(point):
    if point in os.environ.get("SPECPROBE_HOLD_AT", "").split(","):
        print(f"SPECPROBE_HOLD {point} pid={os.getpid()}", flush=True)
        os.kill(os.getpid(), signal.SIGSTOP)

child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
open(os.path.join(out, "before"), "w").write("x")
print("save begins", flush=True)
hold_at("save-begin")
for i in range(500):
    open(os.path.join(out, f"part-{i}"), "w").write("x")
print("save done", flush=True)
"""


def spec(signal: str = "SIGKILL", rule: dict | None = None) -> dict:
    return {
        "version": 1,
        "name": "hold",
        "description": "a kill in the middle of a save, held there",
        "budget_s": 100,
        "values": {"leg": LEG},
        "steps": [
            {
                "name": "leg",
                "run": {
                    "argv": ["${python}", "-c", "${leg}", "${run_dir}/out"],
                    "timeout_s": 30,
                    "grace_s": 5,
                    "ok_exit_codes": [-9, -15],
                    "signals": [{**(rule or {"hold_at": "save-begin"}), "signal": signal}],
                },
            }
        ],
        "checks": [
            {"name": "signalled", "why": "the rule stopped the leg", "expr": "length(steps.leg.signals_sent) == `1`"}
        ],
    }


@pytest.fixture
def runs(tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> EngineRuns:
    return EngineRuns(capsys, monkeypatch, tmp_path)


def test_a_held_kill_lands_at_the_same_point_every_time(runs: EngineRuns) -> None:
    (runs.cwd / "s.yaml").write_text(dump(spec()))
    for n in range(5):
        runs("run", "s.yaml", "--run-dir", f"r{n}", expect=Exit.PASS)
        # Killed exactly at the start of the save: what it wrote before, nothing of the save.
        assert sorted(os.listdir(runs.cwd / f"r{n}" / "out")) == ["before"]
        leg = runs.evidence(f"r{n}")["steps"]["leg"]
        assert leg["rc"] == -9
        (sent,) = leg["signals_sent"]
        held = sent["held"]
        assert sent["signal"] == "SIGKILL" and sent["line"] == 2
        assert held["text"].startswith("SPECPROBE_HOLD save-begin pid=") and held["stopped"] is True
        assert 0 < held["at_s"] <= sent["at_s"]
        # Every process of its tree held: the leg and the child it started (whatever state each was in).
        names = sorted(p["name"] for p in held["processes"])
        assert len(held["processes"]) == 2 and all(name.startswith("python") for name in names), held
        leader = next(p for p in held["processes"] if f"pid={p['pid']}" in held["text"])
        assert leader["state"] in ("stopped", "running", "sleeping")


def test_a_held_leg_is_released_to_take_a_signal_other_than_sigkill(runs: EngineRuns) -> None:
    (runs.cwd / "s.yaml").write_text(dump(spec(signal="SIGTERM")))
    ran = runs("run", "s.yaml", "--run-dir", "r", expect=Exit.PASS)
    leg = runs.evidence("r")["steps"]["leg"]
    # A stopped process takes SIGTERM only once it runs again: released, it ends by it, not by the timeout.
    assert leg["rc"] == -15 and leg["timed_out"] is False, ran
    assert leg["signals_sent"][0]["held"]["stopped"] is True


def test_a_hold_on_a_line_of_a_leg_without_the_protocol_still_signals_the_whole_tree(runs: EngineRuns) -> None:
    doc = spec(rule={"match": "^save begins$", "hold": True})
    (runs.cwd / "s.yaml").write_text(dump(doc))
    runs("run", "s.yaml", "--run-dir", "r", expect=Exit.PASS)
    leg = runs.evidence("r")["steps"]["leg"]
    (sent,) = leg["signals_sent"]
    assert leg["rc"] == -9 and sent["line"] == 1 and sent["held"]["text"] == "save begins"
    assert len(sent["held"]["processes"]) == 2 and sent["held"]["stopped"] is True
