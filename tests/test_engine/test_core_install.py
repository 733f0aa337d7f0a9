"""The engine installs alone: `pip install .` into a fresh venv brings the core dependencies only (no torch, no
huggingface_hub), and that venv validates, plans, checks, diffs and reviews the shipped specs and saved runs,
a check calling `regex_match()` included. This is what the spec workflow installs on a PR."""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest
from engine_helpers import Engine, git

ROOT = Path(__file__).resolve().parents[2]
SPECS = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "specs").glob("*.yaml"))
REGEX_CHECK = """
checks:
  - name: horizon_pointer_names_the_final_folder
    why: A check that calls regex_match(), which needs the core's `regex` package.
    expr: "regex_match(state.hub_after_leg2.pointer.path_in_repo, '^final$')"
"""


def run(cmd: list[str], cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=600, env=env)


@pytest.fixture(scope="module")
def core(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv holding `pip install .` of a copy of this checkout, and nothing else."""
    base = tmp_path_factory.mktemp("core")
    src = base / "src"
    shutil.copytree(
        ROOT, src, ignore=shutil.ignore_patterns(".venv*", ".git", "*.egg-info", "build", "runs", "__pycache__")
    )
    venv.create(base / "venv", with_pip=True)
    py = base / "venv" / "bin" / "python"
    proc = run([str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check", str(src)], cwd=base)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return base / "venv" / "bin"


def clean_env(core: Path) -> dict[str, str]:
    """No PYTHONPATH pointing back at this checkout: only the venv's install is seen."""
    return {"PATH": f"{core}:/usr/bin:/bin", "HOME": os.environ.get("HOME", "/tmp"), "LANG": "C.UTF-8"}


@pytest.fixture
def core_engine(core: Path, engine_process: Engine) -> Engine:
    """`engine ARGS` as the core install's program, in a clean environment (`clean_env`)."""
    return functools.partial(engine_process, command=(str(core / "engine"),), environ=clean_env(core), cwd=ROOT)


@pytest.mark.slow
def test_a_core_install_brings_no_torch_and_no_hub_client(core: Path) -> None:
    proc = run([str(core / "python"), "-m", "pip", "list", "--format=freeze"], cwd=ROOT)
    installed = {line.split("==")[0].lower() for line in proc.stdout.splitlines()}
    assert {"pyyaml", "jsonschema", "jmespath", "psutil", "regex", "specprobe"} <= installed
    assert installed & {"torch", "huggingface-hub", "huggingface_hub", "safetensors", "numpy"} == set()
    proc = run([str(core / "python"), "-c", "import torch"], cwd=Path("/"))
    assert proc.returncode == 1 and "No module named 'torch'" in proc.stderr


@pytest.mark.slow
def test_a_core_install_validates_plans_and_checks_the_shipped_specs(core_engine: Engine, tmp_path: Path) -> None:
    proc = core_engine("validate", *SPECS, expect=0)
    assert [line for line in proc.out.splitlines() if line.startswith("OK ")] == [f"OK {s}" for s in SPECS]
    proc = core_engine("plan", "specs/p4_soak.yaml", expect=0)
    assert "leg2" in proc.out
    for stem in ("p4_smoke", "p4_soak", "p4_preempt"):
        run = shutil.copytree(ROOT / "evidence" / stem, tmp_path / stem)  # a check leaves its record beside the run
        proc = core_engine("check", f"specs/{stem}.yaml", "--evidence", str(run), expect=0)
        assert f"VERDICT {stem} PASS" in proc.out


@pytest.mark.slow
def test_a_core_install_reviews_a_change_with_a_regex_check_against_the_saved_run(
    core_engine: Engine, tmp_path: Path
) -> None:
    repo = tmp_path / "repo"
    shutil.copytree(ROOT, repo, ignore=shutil.ignore_patterns(".venv*", ".git", "*.egg-info", "runs", "__pycache__"))
    for cmd in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "base"]):
        git(repo, *cmd)
    smoke = repo / "specs" / "p4_smoke.yaml"
    assert "\nchecks:" not in smoke.read_text()  # the check below is the spec's own, after the library's
    smoke.write_text(smoke.read_text() + REGEX_CHECK)

    proc = core_engine("check", "specs/p4_smoke.yaml", "--evidence", "evidence/p4_smoke", cwd=repo, expect=0)
    row = next(line for line in proc.out.splitlines() if line.startswith("horizon_pointer_names_the_final_folder"))
    assert row.split()[1:] == ["ok", "true"]

    proc = core_engine("diff", "specs/p4_smoke.yaml", "--base", "HEAD", cwd=repo, expect=1)
    assert "horizon_pointer_names_the_final_folder" in proc.out

    proc = core_engine("review", "--base", "HEAD", cwd=repo)
    out = proc.out + proc.err
    assert proc.code == 0, out[-3000:]
    assert re.search(r"specs/p4_smoke\.yaml +checks: 1 added\n +saved run: PASS \((\d+)/\1 gates pass\)", out), out
    assert "+ new check horizon_pointer_names_the_final_folder would PASS on run" in out
    assert "ERROR" not in out and "No module named" not in out


@pytest.mark.slow
def test_a_core_install_says_in_one_line_what_the_trainer_needs(
    core: Path, core_engine: Engine, tmp_path: Path
) -> None:
    """The trainer's commands, and `engine run` of a P4 spec, name the missing dependencies and the install
    command in one line: no import traceback blamed on the data mix."""
    src = core.parent.parent / "src"  # the copy the venv installed: a run writes under its folder, not ours
    hint = (
        "needs the trainer's dependencies, missing here: huggingface_hub, torch, safetensors, numpy. Install "
        "them: pip install '.[trainer]' (from the specprobe checkout)"
    )
    py, repo, mix = str(core / "python"), f"file://{tmp_path}/store/o/x", str(tmp_path / "mix")
    fetch = ["trainer.data.mix", "fetch", "--repo", repo, "--out", mix]
    train = ["trainer.train", "--root", mix, "--out", str(tmp_path / "out"), "--hub-repo", repo, "--tokens", "1024"]
    preflight = ["trainer.preflight", "--gpus", "0", "--repo", repo]
    prefixes = ("error: python -m trainer.data.mix", "error: python -m trainer.train", "preflight: this run")
    for argv, said in zip((fetch, train, preflight), prefixes):
        proc = run([py, "-m", *argv], cwd=src, env=clean_env(core))
        assert (proc.returncode, proc.stdout, proc.stderr.splitlines()) == (3, "", [f"{said} {hint}"]), proc.stderr
    proc = core_engine("run", "specs/p4_smoke.yaml", "--run-dir", str(tmp_path / "run"), cwd=src, expect=3)
    out = proc.out + proc.err
    assert "VERDICT p4_smoke PRECONDITION" in out, out[-3000:]
    assert f"! error: python -m trainer.data.mix {hint}" in out and "Traceback" not in out


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
