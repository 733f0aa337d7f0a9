"""A trainer refusal under torchrun reads as the trainer's, first: torchrun exits 1 and buries the
rank's exit code 3 and its `refused: ...` line under its own traceback; the P4 specs' `child_exit` rule
brings both to the top of every report. The real engine runs the real `specs/p4_smoke.yaml` with real
torchrun and the real trainer, which refuses a horizon its data mix cannot feed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from p4_runs import SharedP4

pytestmark = pytest.mark.slow

REPO_ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent


def engine_run(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    """The installed `engine run` in `cwd`, on the embedded default (no probe or store settings inherited)."""
    env = {**os.environ, "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}", "OMP_NUM_THREADS": "1"}
    for name in ("P4_PROBE_MODE", "P4_PROBE_REPO", "SPECPROBE_TARGET", "SPECPROBE_STORE", "HF_TOKEN"):
        env.pop(name, None)
    return subprocess.run(
        [str(VENV_BIN / "engine"), "run", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600
    )


def smoke_with(cwd: Path, name: str, steps: str) -> None:
    """`cwd/name`: the shipped smoke with `steps` (YAML list items) in place of its steps of those names."""
    (cwd / "specs").symlink_to(REPO_ROOT / "specs", target_is_directory=True)
    (cwd / name).write_text(f"version: 1\nextends: specs/p4_smoke.yaml\nsteps:\n{steps}")


def test_a_refusal_under_torchrun_leads_every_report_with_the_trainer_s_code_and_line(
    tmp_path: Path, p4_shared: SharedP4
) -> None:
    (tmp_path / "specs").symlink_to(REPO_ROOT / "specs", target_is_directory=True)
    # 200,000 steps: far more tokens than the synthetic mix holds, so every rank refuses at setup (exit 3).
    # One rank: the refusal and torchrun's burying of it are the same with one, at half the imports.
    args = ["--set", "steps=200000", "--set", "nproc=1", "--run-dir", "r", "--junit", "j.xml", "--markdown", "m.md"]
    args += ["--html", "h.html"]
    args += [a for s in p4_shared.mix_sets() for a in ("--set", s)]
    proc = engine_run(tmp_path, "specs/p4_smoke.yaml", *args)
    assert proc.returncode == 5, proc.stdout[-3000:] + proc.stderr[-3000:]
    said = "leg1: the trainer exited 3: refused: data mix "
    doc = json.loads((tmp_path / "r" / "evidence.json").read_text())
    leg1 = doc["steps"]["leg1"]
    assert leg1["rc"] == 1  # torchrun's own code: the trainer's is only in its report
    child = leg1["child_exit"]
    assert child["name"] == "the trainer" and child["code"] == 3
    assert child["message"].startswith("refused: data mix ") and "but the 4 train shards hold" in child["message"]
    # The same line is one the leg's `fail_on` names; the report still leads with the child's own exit.
    assert leg1["fail_on"]["lines"][0] == {"line": child["line"], "text": child["message"], "pattern": "^refused: "}
    # Live: right after the leg, before torchrun's traceback in the failure lines.
    live = proc.stdout[proc.stdout.index("=== leg1") :]
    assert live.index(f"   {said}") < live.index("FAILURE LINES")
    # The terminal report: its first lines, before the table.
    report = proc.stdout[proc.stdout.index("leg2_vs_reference_RC") :].splitlines()[1:]
    assert report[0].startswith(said) and report[1].startswith("leg2: the trainer exited 3: refused: ")
    # The reference trains the same horizon, and is refused the same way.
    assert report[2].startswith("reference: the trainer exited 3: refused: data mix ")
    assert report[3].startswith("check ")
    failure = ET.parse(tmp_path / "j.xml").getroot().find("testcase[@name='leg1']/failure")
    assert failure is not None and failure.get("message", "").startswith("failed: the trainer exited 3: refused: ")
    assert failure.text.splitlines()[0] == f"the trainer exited 3: {child['message']}"
    markdown = (tmp_path / "m.md").read_text()
    assert markdown.index(f"- {said}") < markdown.index("Failed: ") < markdown.index("| step |")
    page = (tmp_path / "h.html").read_text()
    assert f'<p class="child"><strong>{said}' in page


def test_a_run_whose_repo_is_deleted_between_legs_fails_leg_2_and_is_not_started_afresh(
    tmp_path: Path, p4_shared: SharedP4
) -> None:
    """The shipped smoke's leg 2 runs `--resume must`: the store deleted after leg 1 is a refusal (exit 3) that
    names the repo, never `repo missing, created ..., fresh start` with exit 0."""
    smoke_with(
        tmp_path,
        "deleted.yaml",
        "  - name: wipe_before_leg2\n"
        "    override: true\n"
        "    remove:\n"
        '      paths: ["${train_out}", "${tlog}", "${store_root}/probe/ckpt-${run_id}"]\n'
        '      also_under: ["${store_root}"]\n',
    )
    shared = [a for s in p4_shared.sets("p4_smoke") for a in ("--set", s)]
    proc = engine_run(tmp_path, "deleted.yaml", "--run-dir", "r", *shared)
    assert proc.returncode == 5, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads((tmp_path / "r" / "evidence.json").read_text())
    repo = doc["values"]["repo"]
    assert doc["steps"]["leg1"]["status"] == "ok" and doc["steps"]["wipe_before_leg2"]["status"] == "ok"
    child = doc["steps"]["leg2"]["child_exit"]
    assert child["code"] == 3 and child["message"].startswith(f"refused: --resume must: repo {repo} does not exist")
    assert "fresh start" not in (tmp_path / "r" / doc["steps"]["leg2"]["log"]).read_text()
    assert doc["state"]["hub_after_leg2"]["exists"] is False  # nothing was created in its place
    assert f"leg2: the trainer exited 3: refused: --resume must: repo {repo} does not exist" in proc.stdout


def test_a_refusal_behind_a_launcher_that_exits_0_still_fails_the_leg_quoting_the_trainer_s_line(
    tmp_path: Path, p4_shared: SharedP4
) -> None:
    """A wrapper that swallows the launcher's exit code (`...; exit 0`) hides the trainer's refusal from the exit
    code; the P4 legs' `fail_on` still fails leg 1, quoting the trainer's `refused:` line and its number."""
    smoke_with(
        tmp_path,
        "wrapped.yaml",
        "  - name: leg1\n"
        "    override: true\n"
        "    run:\n"
        '      argv: ["sh", "-c", \'"$@"; exit 0\', "sh", "${torchrun}", "${train_args}", "--resume", "auto",'
        ' "--stop-after-steps", "${stop1}"]\n',
    )
    shared = [a for s in p4_shared.mix_sets() for a in ("--set", s)]
    proc = engine_run(tmp_path, "wrapped.yaml", "--set", "steps=200000", "--set", "nproc=1", "--run-dir", "r", *shared)
    assert proc.returncode == 5, proc.stdout[-3000:] + proc.stderr[-3000:]
    leg1 = json.loads((tmp_path / "r" / "evidence.json").read_text())["steps"]["leg1"]
    assert (leg1["rc"], leg1["status"]) == (0, "failed")
    (first, *_) = leg1["fail_on"]["lines"]
    assert first["text"].startswith("refused: data mix ") and first["pattern"] == "^refused: "
    report = proc.stdout[proc.stdout.index("leg2_vs_reference_RC") :].splitlines()[1:]
    # torchrun's own traceback of the failed child, and nothing else, is the other failure line.
    assert [hit["text"] for hit in leg1["fail_on"]["lines"][1:]] == ["Traceback (most recent call last):"]
    assert report[0] == (
        f"leg1: exited 0 but printed a failure line: {json.dumps(first['text'])} (line {first['line']}), "
        f"and 1 more failure line; the trainer exited 3: {first['text']}"
    )
