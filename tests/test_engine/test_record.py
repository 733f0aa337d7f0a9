"""engine/run/record.py: the one way out of a run. Every way out of a Record (a console line, the
evidence, a re-check's record, a leg's log and its cut line, the files legs wrote into the run dir)
leaves masked by the plan's secret filter, on real files."""

from __future__ import annotations

import json
from pathlib import Path

from legs.plan_stub import PlanStub

from engine import limits
from engine.run import evidence
from engine.run.record import Record

TOKEN = "hf_recordSECRETrecordSECRET0123"
PIECE = TOKEN[:8]  # the shortest piece of a secret the filter finds anywhere
CUT = TOKEN[:5]  # what a line cut inside the token leaves at its end: masked only as a cut


def files_holding(root: Path, needle: str) -> list[str]:
    return sorted(
        str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and needle.encode() in p.read_bytes()
    )


def test_every_way_out_of_a_record_masks_the_plans_secrets(tmp_path: Path) -> None:
    plan = PlanStub(steps=[], values={"hf_token": TOKEN}, secret_names=["hf_token"])
    said: list[str] = []
    record = Record.open(tmp_path, plan, {}, said.append)

    record.say(f"logging in with {TOKEN}")
    stored = record.save({"evidence_version": 1, "steps": {"leg": {"error": f"refused {TOKEN}"}}})
    written = record.write("check", {"verdict": {"message": f"judged {TOKEN}"}})
    log = record.leg_log("logs/leg.log")
    kept = log.lines(f"token={TOKEN}\n") + log.cut("x" * 20 + CUT)
    log.close()
    (tmp_path / "rank0.log").write_text(f"[default0]: env HF_TOKEN={TOKEN}\n")
    masked_in = record.mask_files()
    record.close()

    assert said[0] == "logging in with <redacted>"
    assert stored["steps"]["leg"]["error"] == "refused <redacted>"
    assert evidence.load(tmp_path)["steps"]["leg"]["error"] == "refused <redacted>"
    assert written.name.startswith("check-") and json.loads(written.read_text())["verdict"]["message"] == (
        "judged <redacted>"
    )
    assert kept == f"token=<redacted>\n{'x' * 20}<redacted>{limits.CUT_MARKER}\n"
    assert (tmp_path / "logs" / "leg.log").read_text() == kept
    # The leg log was written through the filter and vouched for: only the file a leg wrote is named.
    assert masked_in == ["rank0.log"] and "   masked a secret in rank0.log" in said
    assert files_holding(tmp_path, PIECE) == []
    assert [line for line in said if PIECE in line] == []


def test_a_record_masks_the_secrets_of_the_environment_it_is_opened_with(tmp_path: Path) -> None:
    """`engine check` and `engine replay` mask with the environment they run in, not the run's."""
    plan = PlanStub(steps=[])
    said: list[str] = []
    Record.open(tmp_path, plan, {"HF_TOKEN": TOKEN}, said.append).say(f"a raw log line: {TOKEN}")
    Record.open(tmp_path, plan, {}, said.append).say(f"a raw log line: {TOKEN}")
    assert said == ["a raw log line: <redacted>", f"a raw log line: {TOKEN}"]
