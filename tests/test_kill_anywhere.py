"""A crash at any phase of a checkpoint (save, push, pushed, verify, pointer move, prune, and the final
push) loses at most the unverified work: the next session, on a wiped disk, resumes from the newest
VERIFIED checkpoint (what latest.json names) and ends with the uninterrupted run's final weights.

Each case SIGKILLs torchrun and every rank at once when the phase line appears on stdout.
"""
from __future__ import annotations

import shutil

import pytest

from trainer_helpers import (BASELINE_PUSH_EVERY, BASELINE_STEPS, baseline, explain, pointer, run_trainer,
                             store_url, torchrun_cmd, trainer_args, weights_sha256)

pytestmark = pytest.mark.slow

# The kill lands on the second push (step 4), so an older verified checkpoint (step 2) exists; the last
# case kills the horizon's final/ push after ckpt/checkpoint-6 was pointed at.
PHASES = {
    "save": (r"^CKPT save step=4 ", (2,)),
    "push": (r"^CKPT push step=4 -> ckpt/checkpoint-4", (2, 4)),
    "pushed": (r"^CKPT pushed step=4 ", (2, 4)),
    "verify": (r"^CKPT verify step=4 ok", (2, 4)),
    "pointer": (r"^latest\.json -> step=4 ", (4,)),
    "prune": (r"^CKPT prune step=4 ", (4,)),
    "final_push": (r"^CKPT push step=6 -> final", (6,)),
}
RESULTS: dict[str, str] = {}


@pytest.mark.parametrize("phase", list(PHASES))
def test_kill_at_phase_then_cold_resume_finishes_identically(phase, tmp_path, tmp_path_factory):
    base = baseline(tmp_path_factory)
    regex, allowed = PHASES[phase]
    repo, out = store_url(tmp_path / "store"), tmp_path / "out"
    args = trainer_args(root=base.mix, out=out, repo=repo, steps=BASELINE_STEPS, push_every=BASELINE_PUSH_EVERY)

    killed = run_trainer(torchrun_cmd(args), kill_on=regex)
    RESULTS[phase] = "not killed"
    assert killed.killed_at is not None, "phase line never appeared:\n" + explain(killed)
    assert killed.rc != 0 and killed.run_json is None
    after_kill = pointer(repo)
    assert after_kill is not None and after_kill["terminal"] is False
    # A line is read a moment after it is printed, so the process may have finished that phase's commit.
    assert after_kill["step"] in allowed, (phase, after_kill)

    shutil.rmtree(out)                                     # cold: nothing local survives the crash
    resumed = run_trainer(torchrun_cmd(args))
    assert resumed.rc == 0, explain(resumed)
    step = after_kill["step"]
    assert resumed.starting(f"auto-resume: pointer step={step} path={after_kill['path_in_repo']}")
    assert resumed.run_json["resumed_from_step"] == step
    assert resumed.run_json["final_step"] == BASELINE_STEPS
    for s, loss in resumed.run_json["losses"].items():
        assert loss == base.run.run_json["losses"][s], s
    assert weights_sha256(repo) == base.final_sha
    assert pointer(repo)["terminal"] is True
    RESULTS[phase] = f"survived (resumed from step {step})"


def test_zz_report_kills(capsys):
    """Prints the tally (runs last in this module: pytest keeps definition order)."""
    with capsys.disabled():
        survived = sum(v.startswith("survived") for v in RESULTS.values())
        print(f"\nkill-anywhere: tried {len(RESULTS)}, survived {survived}: {RESULTS}")
    assert survived == len(RESULTS) == len(PHASES)
