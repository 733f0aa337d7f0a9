"""The README's recipe "write your own probe: two stops" (specs/examples/p4_two_stops.yaml): the file the
README shows, a library reused without disabling or copying anything, and a real run that passes on the
embedded default (CPU, 2 gloo ranks under torchrun, tiny model, local store)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from test_e2e_local import assert_every_check_passed, run_engine, workdir_with_specs

from engine.spec.load import load_spec
from engine.spec.plan import build_plan
from engine.spec.validate import findings

REPO_ROOT = Path(__file__).resolve().parents[2]
SPEC = REPO_ROOT / "specs" / "examples" / "p4_two_stops.yaml"


def test_the_readme_shows_the_spec_file_as_it_is() -> None:
    readme = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("## Write your own probe: two stops") :]
    block = re.search(r"```yaml\n(.*?)```", section, re.S)
    assert block is not None
    assert block.group(1) == SPEC.read_text(encoding="utf-8")


def test_two_stops_reuses_every_library_check_and_disables_none() -> None:
    spec = load_spec(SPEC)
    assert findings(spec, {}) == ([], [])
    assert "disable" not in spec.data
    plan = build_plan(spec, environ={})
    smoke = build_plan(load_spec(REPO_ROOT / "specs" / "p4_smoke.yaml"), environ={})
    mine = {c["name"]: c for c in plan.checks}
    assert {c["name"] for c in smoke.checks} <= set(mine)
    assert not any(c.get("disabled") for c in plan.checks)
    # The horizon checks read leg 3 and the store after it, written once in the library.
    assert mine["final_leg_reached_the_horizon"]["expr"] == "steps.leg3.harvest.run_json.final_step == values.steps"
    assert mine["final_leg_reached_the_horizon"]["file"] == "specs/lib/p4_common.yaml"
    assert mine["checkpoints_complete_at_horizon"]["let"]["store"] == "state.hub_after_leg3"
    # Leg 3 is leg 2's definition with the horizon's argv and its own timeout.
    steps = {s["name"]: s for s in plan.steps}
    assert steps["leg3"]["run"]["output"] == steps["leg2"]["run"]["output"]
    assert steps["leg2"]["run"]["argv"][-2:] == ["--stop-after-steps", "20"]
    assert steps["leg3"]["run"]["argv"][-2:] == ["--stop-after-steps", "0"]
    assert [s["name"] for s in plan.steps][-3:] == ["wipe_before_leg3", "leg3", "hub_after_leg3"]


@pytest.mark.slow
def test_two_stops_passes_end_to_end_on_the_embedded_default(tmp_path: Path) -> None:
    run = run_engine(workdir_with_specs(tmp_path / "work"), "specs/examples/p4_two_stops.yaml", timeout=600)
    assert_every_check_passed(run, "p4_two_stops", min_checks=31)
    assert "disabled" not in run.evidence["verdict"]
    legs = {leg: run.run_json(leg) for leg in ("leg1", "leg2", "leg3")}
    assert [(r["resumed_from_step"], r["final_step"], r["segment_stop"]) for r in legs.values()] == [
        (None, 10, True),
        (10, 20, True),
        (20, 30, False),
    ]
    state = run.evidence["state"]
    assert state["hub_after_leg2"]["pointer"]["step"] == 20
    assert state["hub_after_leg3"]["checkpoints"] == [10, 20, 30]
    assert state["hub_after_leg3"]["pointer"]["path_in_repo"] == "final"
