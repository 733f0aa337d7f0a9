"""Reference runs (engine/run/reference.py): a step run uninterrupted to the horizon whose evidence is reused
across runs while its definition and its inputs (code, package versions, files) are unchanged. Real engine runs
of real python legs, a real git repository for the code, a real distribution on sys.path for the package."""

from __future__ import annotations

import importlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from engine_runs import EngineRuns, dump

from engine.judge.verdict import Exit
from engine.run.digests import changes, input_digests
from engine.run.reference import reuse_key
from engine.spec.load import load_spec
from engine.spec.located import SpecErrors
from engine.spec.plan import build_plan
from engine.spec.validate import validate

ROOT = Path(__file__).resolve().parents[2]

# A leg: trains `steps` steps (one loss line each), leaves out/final.json, counts its runs, exits `rc`.
LEG = (
    "import json, os, sys\n"
    "out, count, steps, rc = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])\n"
    "open(count, 'a').write('ran\\n')\n"
    "for i in range(1, steps + 1):\n"
    "    print(f'step {i} loss {10 - i / 4}', flush=True)\n"
    "os.makedirs(out, exist_ok=True)\n"
    "json.dump({'step': steps}, open(os.path.join(out, 'final.json'), 'w'))\n"
    "sys.exit(rc)\n"
)
HARVEST = {"loss": {"match": r"^step (?P<step>\d+) loss (?P<loss>\S+)$", "pick": "all"}}


def spec_doc() -> dict:
    return {
        "version": 1,
        "name": "refprobe",
        "description": "a leg compared with the run that never stopped",
        "budget_s": 200,
        "values": {
            "ref_dir": "${work_dir}/runs/reference/refprobe",
            "steps": 3,
            "ref_rc": 0,
            "leg_rc": 0,
            "t_leg": 20,
            "leg_code": LEG,
        },
        "steps": [
            {
                "name": "reference",
                "reference": {
                    "dir": "${ref_dir}",
                    "keep": ["out"],
                    "inputs": {
                        "git": ["${work_dir}/repo/code"],
                        "packages": ["specprobe-fake-dist"],
                        "files": ["${work_dir}/manifest.json"],
                    },
                },
                "run": {
                    "argv": [
                        "${python}",
                        "-c",
                        "${leg_code}",
                        "${ref_dir}/out",
                        "${work_dir}/ref.count",
                        "${steps}",
                        "${ref_rc}",
                    ],
                    "timeout_s": 30,
                    "output": {"harvest": HARVEST},
                },
            },
            {
                "name": "reference_state",
                "reference": {"of": "reference"},
                "collect": {"collector": "json_file", "args": {"path": "${ref_dir}/out/final.json"}},
            },
            {
                "name": "leg",
                "run": {
                    "argv": [
                        "${python}",
                        "-c",
                        "${leg_code}",
                        "${run_dir}/out",
                        "${work_dir}/leg.count",
                        "${steps}",
                        "${leg_rc}",
                    ],
                    "timeout_s": "${t_leg}",
                    "output": {"harvest": HARVEST},
                },
            },
        ],
        "checks": [
            {
                "name": "leg_follows_the_reference",
                "why": "a leg that never stopped trains the reference's trajectory, step for step",
                "expr": "allclose(by_step(steps.leg.harvest.loss, 'loss'), by_step(steps.reference.harvest.loss, 'loss'), `0`, `0`)",
            },
            {
                "name": "reference_reached_the_horizon",
                "why": "the reference's final checkpoint is at the horizon",
                "expr": "state.reference_state.step == values.steps",
            },
        ],
    }


def git(repo: Path, *args: str) -> str:
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@t",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@t",
    }
    return subprocess.run(["git", *args], cwd=repo, env=env, check=True, capture_output=True, text=True).stdout


def fake_dist(site: Path, version: str) -> None:
    """An installed distribution `specprobe-fake-dist` of `version` on `site` (a folder on sys.path)."""
    for old in site.glob("specprobe_fake_dist-*.dist-info"):
        for f in old.iterdir():
            f.unlink()
        old.rmdir()
    info = site / f"specprobe_fake_dist-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: specprobe-fake-dist\nVersion: {version}\n")
    importlib.invalidate_caches()


@pytest.fixture
def probe(tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> EngineRuns:
    """A work dir with the spec, a git repository whose `code/` is the reference's code, a manifest, and
    version 1.0 of the fake distribution on sys.path."""
    (tmp_path / "s.yaml").write_text(dump(spec_doc()))
    repo = tmp_path / "repo"
    (repo / "code").mkdir(parents=True)
    (repo / "code" / "train.py").write_text("lr = 0.01\n")
    (repo / "README").write_text("a repo\n")
    git(repo, "init", "-q")
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "first")
    (tmp_path / "manifest.json").write_text('{"shards": 1}\n')
    site = tmp_path / "site"
    site.mkdir()
    monkeypatch.syspath_prepend(str(site))
    fake_dist(site, "1.0")
    return EngineRuns(capsys, monkeypatch, tmp_path)


def runs_of(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def test_second_run_reuses_the_reference_and_says_from_where(probe: EngineRuns) -> None:
    first = probe("run", "s.yaml", "--run-dir", "r1", expect=Exit.PASS)
    assert "no reference saved in" in first.out and "saved the reference in" in first.out
    second = probe("run", "s.yaml", "--run-dir", "r2", expect=Exit.PASS)
    r1 = str(probe.cwd / "r1")
    assert f"reusing reference from {r1} (same definition)" in second.out
    assert runs_of(probe.cwd / "ref.count") == 1 and runs_of(probe.cwd / "leg.count") == 2
    made, reused = probe.evidence("r1")["steps"]["reference"], probe.evidence("r2")["steps"]["reference"]
    assert made["reference"]["reused_from"] is None and made["reference"]["saved"] is True
    assert reused["reference"]["reused_from"] == r1
    assert reused["reference"]["key"] == made["reference"]["key"]
    assert reused["reference"]["inputs"]["packages"] == {"specprobe-fake-dist": "1.0"}
    assert reused["reference"]["inputs"]["git"][str(probe.cwd / "repo" / "code")]["dirty"] is None
    assert reused["harvest"] == made["harvest"] and len(reused["harvest"]["loss"]) == 3
    assert reused["rc"] == 0 and reused["seconds"] == made["seconds"]
    # The run dir holds the reference's log, so that `engine replay` re-harvests it like any leg's.
    assert (probe.cwd / "r2" / reused["log"]).read_text() == (probe.cwd / "r1" / made["log"]).read_text()
    # The member collect step is reused with it: the state of the run that made the reference.
    doc = probe.evidence("r2")
    assert doc["state"]["reference_state"] == {"step": 3}
    assert doc["steps"]["reference_state"]["reference"] == {"of": "reference", "reused_from": r1}
    assert re.search(rf"^step:reference +ok +reused reference from {re.escape(r1)}, rc 0, ", second.out, re.M)


def test_a_changed_definition_makes_a_new_reference_naming_the_field(probe: EngineRuns) -> None:
    probe("run", "s.yaml", "--run-dir", "r1", expect=Exit.PASS)
    ran = probe("run", "s.yaml", "--run-dir", "r2", "--set", "steps=4", expect=Exit.PASS)
    assert "not reusing the reference in" in ran.out
    assert "definition: run.argv: `3` -> `4`; making a new one" in ran.out
    assert runs_of(probe.cwd / "ref.count") == 2
    assert len(probe.evidence("r2")["steps"]["reference"]["harvest"]["loss"]) == 4


def test_a_code_change_makes_a_new_reference_naming_the_revision(probe: EngineRuns) -> None:
    repo, code = probe.cwd / "repo", probe.cwd / "repo" / "code"
    probe("run", "s.yaml", "--run-dir", "r1", expect=Exit.PASS)
    # A commit elsewhere in the repository leaves the code's tree as it was: still reused.
    (repo / "README").write_text("a repo, explained\n")
    git(repo, "commit", "-q", "-am", "docs")
    probe("run", "s.yaml", "--run-dir", "r2", expect=Exit.PASS)
    assert runs_of(probe.cwd / "ref.count") == 1
    # Editing the code without committing is a change.
    (code / "train.py").write_text("lr = 0.02\n")
    ran = probe("run", "s.yaml", "--run-dir", "r3", expect=Exit.PASS)
    assert f"code {code}: no uncommitted changes -> uncommitted changes " in ran.out
    assert runs_of(probe.cwd / "ref.count") == 2
    # Committing it is one too: another tree, and no uncommitted change any more.
    before = git(repo, "rev-parse", "HEAD").strip()
    git(repo, "commit", "-q", "-am", "lr")
    after = git(repo, "rev-parse", "HEAD").strip()
    ran = probe("run", "s.yaml", "--run-dir", "r4", expect=Exit.PASS)
    assert f"code {code}: revision {before[:12]} -> {after[:12]} (its tree " in ran.out
    assert runs_of(probe.cwd / "ref.count") == 3


def test_a_new_module_not_yet_added_to_git_is_a_code_change_and_so_is_its_edit(probe: EngineRuns) -> None:
    code = probe.cwd / "repo" / "code"
    probe("run", "s.yaml", "--run-dir", "r1", expect=Exit.PASS)
    (code / "resume.py").write_text("skip = 0\n")  # untracked: `git diff HEAD` does not show it
    ran = probe("run", "s.yaml", "--run-dir", "r2", expect=Exit.PASS)
    assert f"code {code}: no uncommitted changes -> uncommitted changes " in ran.out
    assert runs_of(probe.cwd / "ref.count") == 2
    (code / "resume.py").write_text("skip = 1\n")
    ran = probe("run", "s.yaml", "--run-dir", "r3", expect=Exit.PASS)
    assert re.search(rf"code {re.escape(str(code))}: uncommitted changes \w+ -> uncommitted changes \w+", ran.out)
    assert runs_of(probe.cwd / "ref.count") == 3
    # Bytecode and what .gitignore names are not code: the reference made with resume.py at 1 is reused.
    (code / "__pycache__").mkdir()
    (code / "__pycache__" / "resume.cpython-311.pyc").write_bytes(b"\x00")
    (probe.cwd / "repo" / ".git" / "info" / "exclude").write_text("*.log\n")
    (code / "train.log").write_text("noise\n")
    probe("run", "s.yaml", "--run-dir", "r4", expect=Exit.PASS)
    assert runs_of(probe.cwd / "ref.count") == 3


def test_a_package_version_change_makes_a_new_reference(probe: EngineRuns) -> None:
    probe("run", "s.yaml", "--run-dir", "r1", expect=Exit.PASS)
    fake_dist(probe.cwd / "site", "2.0")
    ran = probe("run", "s.yaml", "--run-dir", "r2", expect=Exit.PASS)
    assert "package specprobe-fake-dist: 1.0 -> 2.0; making a new one" in ran.out
    (probe.cwd / "manifest.json").write_text('{"shards": 2}\n')
    ran = probe("run", "s.yaml", "--run-dir", "r3", expect=Exit.PASS)
    assert f"file {probe.cwd / 'manifest.json'}: sha256 " in ran.out
    assert runs_of(probe.cwd / "ref.count") == 3


def test_fresh_reference_makes_it_anew(probe: EngineRuns) -> None:
    probe("run", "s.yaml", "--run-dir", "r1", expect=Exit.PASS)
    ran = probe("run", "s.yaml", "--run-dir", "r2", "--fresh-reference", expect=Exit.PASS)
    assert "not reusing the reference in" in ran.out and ": --fresh-reference; making a new one" in ran.out
    assert runs_of(probe.cwd / "ref.count") == 2
    ran = probe("run", "s.yaml", "--run-dir", "r3", expect=Exit.PASS)
    assert f"reusing reference from {probe.cwd / 'r2'} (same definition)" in ran.out


def test_a_failed_reference_is_never_reused(probe: EngineRuns) -> None:
    probe("run", "s.yaml", "--run-dir", "r1", expect=Exit.PASS)
    # A new reference that fails: the one before it is gone (its directory was emptied), and nothing is saved.
    ran = probe("run", "s.yaml", "--run-dir", "r2", "--set", "ref_rc=1", expect=Exit.FAILED)
    assert "the reference reference did not end ok: nothing kept for later runs" in ran.out
    assert probe.evidence("r2")["steps"]["reference"]["reference"]["saved"] is False
    ran = probe("run", "s.yaml", "--run-dir", "r3", expect=Exit.PASS)
    assert "no reference saved in" in ran.out and "reusing" not in ran.out
    assert runs_of(probe.cwd / "ref.count") == 3


def test_a_reference_keyed_on_a_code_folder_that_is_not_there_says_so(probe: EngineRuns) -> None:
    # Keyed as "missing", no change of that code would make a new reference: the run says so, every time.
    (probe.cwd / "repo" / "code").rename(probe.cwd / "repo" / "elsewhere")
    ran = probe("run", "s.yaml", "--run-dir", "r1", expect=Exit.PASS)
    warning = f"WARNING: reference input {probe.cwd / 'repo' / 'code'} is not there: no change of that code makes"
    assert warning in ran.out
    ran = probe("run", "s.yaml", "--run-dir", "r2", expect=Exit.PASS)
    assert warning in ran.out and "reusing reference" in ran.out


def test_a_kept_folder_changed_since_is_not_reused(probe: EngineRuns) -> None:
    probe("run", "s.yaml", "--run-dir", "r1", expect=Exit.PASS)
    (probe.cwd / "runs" / "reference" / "refprobe" / "out" / "final.json").write_text('{"step": 99}')
    ran = probe("run", "s.yaml", "--run-dir", "r2", expect=Exit.PASS)
    assert "not reusing the reference in" in ran.out and "kept out changed since it was made" in ran.out
    assert runs_of(probe.cwd / "ref.count") == 2


def test_a_resumed_run_takes_over_the_reference_only_while_it_is_unchanged(probe: EngineRuns) -> None:
    probe("run", "s.yaml", "--run-dir", "r1", "--set", "leg_rc=1", expect=Exit.FAILED)
    ran = probe("run", "s.yaml", "--run-dir", "r1", "--from", "leg", "--set", "leg_rc=0", expect=Exit.PASS)
    assert "=== reference: reused (ok) from the run of" in ran.out and runs_of(probe.cwd / "ref.count") == 1
    # Another run replaced what the reference keeps: the reference the run recorded is no longer there.
    (probe.cwd / "runs" / "reference" / "refprobe" / "out" / "final.json").write_text('{"step": 99}')
    ran = probe("run", "s.yaml", "--run-dir", "r1", "--from", "leg", "--set", "leg_rc=0", expect=Exit.FAILED)
    assert "changed since the run it is reused from (out): another run made a new one; resume at reference" in ran.out
    assert probe.evidence("r1")["steps"]["reference"]["status"] == "failed"


def test_check_and_replay_read_a_reused_reference(probe: EngineRuns) -> None:
    probe("run", "s.yaml", "--run-dir", "r1", expect=Exit.PASS)
    probe("run", "s.yaml", "--run-dir", "r2", expect=Exit.PASS)
    probe("check", "s.yaml", "--evidence", "r2", expect=Exit.PASS)
    ran = probe("replay", "s.yaml", "--evidence", "r2", expect=Exit.PASS)
    assert "missing" not in ran.err  # the reference's raw log is in the run dir, re-harvested


def test_check_refuses_a_run_whose_reference_definition_changed(probe: EngineRuns) -> None:
    probe("run", "s.yaml", "--run-dir", "r1", expect=Exit.PASS)
    probe("run", "s.yaml", "--run-dir", "r2", expect=Exit.PASS)
    doc = spec_doc()
    doc["values"]["steps"] = 4
    (probe.cwd / "s.yaml").write_text(dump(doc))
    ran = probe("check", "s.yaml", "--evidence", "r2", expect=Exit.USAGE)
    assert "refusing to re-check" in ran.err
    assert "step reference: definition changed (run.argv: `3` -> `4`)" in ran.err


def test_a_reused_reference_costs_nothing_in_the_budget(probe: EngineRuns) -> None:
    # Budget 200: the reference's worst case (30 + 30 grace) and the leg's (t_leg + 30) together.
    over = probe("run", "s.yaml", "--run-dir", "r0", "--set", "t_leg=130", expect=Exit.USAGE)
    assert "exceeds budget_s 200" in over.err
    probe("run", "s.yaml", "--run-dir", "r1", expect=Exit.PASS)
    probe("run", "s.yaml", "--run-dir", "r2", "--set", "t_leg=130", expect=Exit.PASS)


def test_a_directory_the_engine_did_not_make_is_never_emptied(probe: EngineRuns) -> None:
    mine = probe.cwd / "runs" / "reference" / "refprobe"
    mine.mkdir(parents=True)
    (mine / "notes.txt").write_text("mine\n")
    ran = probe("run", "s.yaml", "--run-dir", "r1", expect=Exit.FAILED)
    assert "holds files and no .specprobe/" in ran.out
    assert (mine / "notes.txt").read_text() == "mine\n" and runs_of(probe.cwd / "ref.count") == 0


def test_two_runs_at_once_make_one_reference(probe: EngineRuns) -> None:
    doc = spec_doc()
    doc["values"]["leg_code"] = "import time; time.sleep(1.5)\n" + LEG
    (probe.cwd / "s.yaml").write_text(dump(doc))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(probe.cwd / "site"), str(ROOT)])}
    both = [
        subprocess.Popen(
            [sys.executable, "-m", "engine.cli", "run", "s.yaml", "--run-dir", name],
            cwd=probe.cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )  # fmt: skip
        for name in ("a", "b")
    ]
    outs = [p.communicate(timeout=120)[0] for p in both]
    assert [p.returncode for p in both] == [0, 0], outs
    assert runs_of(probe.cwd / "ref.count") == 1
    assert sum("reusing reference from" in out for out in outs) == 1, outs
    saved = json.loads((probe.cwd / "runs" / "reference" / "refprobe" / ".specprobe" / "reference.json").read_text())
    assert saved["made_in"] in (str(probe.cwd / "a"), str(probe.cwd / "b"))


# --- validation: each bad block named at its file:line ------------------------------------------------


def problems(tmp_path: Path, doc: dict) -> list[str]:
    path = tmp_path / "v.yaml"
    path.write_text(dump(doc))
    return [str(e) for e in validate(load_spec(path), environ={})]


def test_a_reference_that_reads_the_run_is_refused(tmp_path: Path) -> None:
    doc = spec_doc()
    doc["steps"][0]["run"]["argv"].append("${run_id}")
    (err,) = problems(tmp_path, doc)
    assert err.startswith(f"{tmp_path / 'v.yaml'}:")
    assert "step 'reference' is a reference, but its definition changes from run to run (run.argv: " in err
    assert "it reads run_dir or run_id, so no run could reuse it" in err


def test_bad_reference_and_snapshot_blocks_are_refused_with_their_place(tmp_path: Path) -> None:
    doc = spec_doc()
    doc["steps"][1]["reference"] = {"of": "leg"}
    doc["steps"][2]["snapshot"] = "${run_dir}/.."
    doc["steps"][0]["reference"]["keep"] = ["../elsewhere"]
    doc["steps"].append({"name": "wipe", "remove": ["x"], "reference": {"of": "reference"}})
    doc["steps"].append(
        {"name": "more", "collect": {"collector": "json_file", "args": {"path": "x"}}, "snapshot": ["x"]}
    )
    found = problems(tmp_path, doc)
    text = "\n".join(found)
    assert "reference.of names 'leg': no earlier step is named 'leg'; the references before it: reference" in text
    assert "kept path" in text and "is not under the reference dir" in text
    assert "holds the run dir" in text
    assert "a remove step cannot be part of a reference" in text
    assert "step 'more' is a collect step: only a run step takes a snapshot" in text
    assert all(e.startswith(f"{tmp_path / 'v.yaml'}:") for e in found), found


@pytest.mark.parametrize(
    "rule, message",
    [
        ({"match": "^step 2 ", "signal": "SIGKILL", "hold": "yes"}, "$.steps[2].run.signals[0].hold: 'yes' is not"),
        (
            {"match": "^step 2 ", "hold_at": "save-begin", "signal": "SIGKILL"},
            "$.steps[2].run.signals[0]: a signal rule has a match (a regex over the leg's lines) or a hold_at",
        ),
        ({"hold_at": "save begin", "signal": "SIGKILL"}, "$.steps[2].run.signals[0].hold_at: a hold point is letters"),
    ],
)
def test_a_bad_hold_is_refused_with_its_place(tmp_path: Path, rule: dict, message: str) -> None:
    doc = spec_doc()
    doc["steps"][2]["run"]["signals"] = [rule]
    path = tmp_path / "v.yaml"
    path.write_text(dump(doc))
    with pytest.raises(SpecErrors) as caught:
        load_spec(path)
    assert f"{path}:" in str(caught.value) and message in str(caught.value), str(caught.value)


@pytest.mark.parametrize(
    "spec", ["p4_smoke", "p4_soak", "p4_preempt", "examples/p4_two_stops", "examples/p4_three_stops"]
)
def test_the_p4_reference_is_keyed_by_the_trainer_code_the_packages_and_the_mix_manifest(
    spec: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every P4 spec's reference (specs/lib/p4_common.yaml) is reused only while the trainer's code (found from
    where the spec lies, never `missing`), the installed specprobe and torch and the data mix's manifest are
    those it was made with: another manifest is another key, and the reason names the file."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mix").mkdir()
    manifest = tmp_path / "mix" / "manifest.json"
    manifest.write_text('{"shards": 2}')
    plan = build_plan(load_spec(ROOT / "specs" / f"{spec}.yaml"), sets=[f"mix_root={tmp_path / 'mix'}"], environ={})
    step = next(s for s in plan.steps if s["name"] == "reference")
    inputs = step["reference"]["inputs"]
    assert inputs["packages"] == ["specprobe", "torch"] and inputs["files"] == [str(manifest)]
    (code,) = inputs["git"]
    assert Path(code).resolve() == ROOT / "trainer"
    digests = input_digests(inputs)
    assert "missing" not in digests["git"][code] and digests["packages"]["torch"] is not None
    assert not str(step["reference"]["dir"]).startswith(str(plan.values["run_dir"]))
    key = reuse_key(step, digests)
    manifest.write_text('{"shards": 3}')
    changed = input_digests(inputs)
    assert reuse_key(step, changed) != key
    (said,) = changes(digests, changed)
    assert said.startswith(f"file {manifest}: sha256 ")
