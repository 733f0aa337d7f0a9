"""The spec workflow: .github/workflows/specs.yml is a thin wrapper of .github/scripts/spec_review.py,
which runs here for real against a temp git repository (a clone with a PR branch) and a fake
pull_request event payload. Only the HTTP call to GitHub is replaced, by `GitHubApiMock`."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Mapping
from urllib.parse import parse_qs, urlsplit

import pytest
import yaml
from engine_helpers import git

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests" / "specs" / "review" / "specs"
WORKFLOW = ROOT / ".github" / "workflows" / "specs.yml"
SCRIPT = ROOT / ".github" / "scripts" / "spec_review.py"


def _load_script() -> Any:
    spec = importlib.util.spec_from_file_location("spec_review", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


spec_review = _load_script()


class GitHubApiMock:
    """Stands in for GitHub's REST API (issue comments only): it cannot run here. Keeps the comments in
    memory and records every call."""

    def __init__(self, existing: list[dict] | None = None, refuse: int | None = None):
        self.comments: list[dict] = list(existing or [])
        self.calls: list[tuple[str, str]] = []
        self.refuse = refuse

    def request(self, method: str, path: str, body: Mapping[str, Any] | None = None) -> Any:
        self.calls.append((method, path))
        if self.refuse:
            raise spec_review.ApiError(self.refuse, "Resource not accessible by integration")
        if method == "GET":
            page = int(parse_qs(urlsplit(path).query)["page"][0])
            return self.comments[(page - 1) * 100 : page * 100]
        if method == "POST":
            made = {"id": 1000 + len(self.comments), "body": body["body"], "user": {"type": "Bot"}}
            self.comments.append(made)
            return made
        if method == "PATCH":
            cid = int(path.rsplit("/", 1)[1])
            target = next(c for c in self.comments if c["id"] == cid)
            target["body"] = body["body"]
            return target
        raise AssertionError(f"unexpected {method} {path}")


@pytest.fixture(scope="module")
def clone(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Upstream main holds the probe, its last real run and the workflow; the clone's PR branch removes a
    gate."""
    tmp = tmp_path_factory.mktemp("wf")
    upstream, work = tmp / "upstream", tmp / "work"
    shutil.copytree(FIXTURE, upstream / "specs")
    shutil.copytree(ROOT / ".github", upstream / ".github")  # the workflow runs the PR checkout's script
    git(upstream, "init", "-q", "-b", "main")
    cwd = Path.cwd()
    os.chdir(upstream)
    try:
        from engine.cli import main as engine_main

        assert engine_main(["run", "specs/probe.yaml", "--run-dir", "evidence/probe"]) == 0
    finally:
        os.chdir(cwd)
    git(upstream, "add", "-A")
    git(upstream, "commit", "-q", "-m", "the probe and its last real run")
    git(tmp, "clone", "-q", str(upstream), str(work))
    git(work, "checkout", "-q", "-b", "pr")
    lib = work / "specs" / "lib" / "common.yaml"
    text = lib.read_text()
    lib.write_text(text[: text.index("  - name: leg2_exit_clean")])  # the last check: a gate removed
    git(work, "commit", "-q", "-am", "drop a gate")
    return work


def _event(tmp: Path, clone: Path, labels: list[str], fork: bool = False) -> Path:
    base_sha = git(clone, "rev-parse", "origin/main").strip()
    payload = {
        "action": "labeled" if labels else "opened",
        "number": 7,
        "repository": {"full_name": "lab/specprobe"},
        "pull_request": {
            "number": 7,
            "labels": [{"name": n} for n in labels],
            "base": {"sha": base_sha, "ref": "main", "repo": {"full_name": "lab/specprobe"}},
            "head": {
                "sha": git(clone, "rev-parse", "HEAD").strip(),
                "ref": "pr",
                "repo": {"full_name": "someone/specprobe" if fork else "lab/specprobe"},
            },
        },
    }
    path = tmp / "event.json"
    path.write_text(json.dumps(payload))
    return path


def _env(tmp: Path, event: Path) -> dict[str, str]:
    shim = tmp / "bin"
    shim.mkdir(exist_ok=True)
    # `engine` is this venv's engine, whatever PATH the job's shell has.
    (shim / "engine").write_text(f'#!/bin/sh\nexec {sys.executable} -m engine.cli "$@"\n')
    (shim / "engine").chmod(0o755)
    (tmp / "runner").mkdir(exist_ok=True)
    return {
        **os.environ,
        "PATH": f"{shim}:{os.environ['PATH']}",
        "GITHUB_EVENT_PATH": str(event),
        "RUNNER_TEMP": str(tmp / "runner"),
        "GITHUB_STEP_SUMMARY": str(tmp / "summary.md"),
        "GITHUB_OUTPUT": str(tmp / "output"),
        "PYTHONPATH": str(ROOT),
    }


def _step(job: str, name: str) -> str:
    flow = yaml.safe_load(WORKFLOW.read_text())
    return next(s["run"] for s in flow["jobs"][job]["steps"] if s.get("name") == name)


def _run_step(clone: Path, env: Mapping[str, str], job: str, name: str) -> subprocess.CompletedProcess:
    """The workflow's own `run:` text, as Actions runs it (`bash -e`), in the PR's checkout."""
    return subprocess.run(["bash", "-e", "-c", _step(job, name)], cwd=clone, env=env, capture_output=True, text=True)


def test_a_risky_pr_fails_the_job_until_it_carries_the_label(clone: Path, tmp_path: Path) -> None:
    env = _env(tmp_path, _event(tmp_path, clone, labels=["docs"]))
    proc = _run_step(clone, env, "review", "Review the spec change")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "::error::risky spec changes need approval: add the label `spec-risk-accepted` to the PR" in proc.stdout
    out = tmp_path / "runner" / "spec-review"
    comment = (out / "comment.md").read_text()
    assert comment.startswith(spec_review.MARKER + "\n**The spec check fails: risky changes need approval.**")
    assert "- **gate removed** in `specs/probe.yaml` [mode smoke, soak]: gate `leg2_exit_clean` removed" in comment
    summary = (tmp_path / "summary.md").read_text()
    assert summary.startswith("## Spec review: RISKY: 1 risky change")
    assert (tmp_path / "output").read_text() == "review_rc=1\n"
    assert json.loads((out / "pr.json").read_text()) == {"number": 7, "repository": "lab/specprobe", "fork": False}

    env = _env(tmp_path, _event(tmp_path, clone, labels=["docs", "spec-risk-accepted"]))
    proc = _run_step(clone, env, "review", "Review the spec change")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    comment = (out / "comment.md").read_text()
    assert "Risky changes approved by the label `spec-risk-accepted`." in comment
    assert "## Spec review: 1 risky change, accepted (--accept-risk)" in comment


def test_a_safe_pr_passes_and_says_so(clone: Path, tmp_path: Path) -> None:
    safe = tmp_path / "safe"
    shutil.copytree(clone, safe)
    git(safe, "checkout", "-q", "-b", "safe", "origin/main")
    lib = safe / "specs" / "lib" / "common.yaml"
    lib.write_text(lib.read_text().replace("loss_max: 3.0", "loss_max: 2.5"))  # tightened
    git(safe, "commit", "-q", "-am", "tighten")
    env = _env(tmp_path, _event(tmp_path, safe, labels=[]))
    proc = _run_step(safe, env, "review", "Review the spec change")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    comment = (tmp_path / "runner" / "spec-review" / "comment.md").read_text()
    assert comment.startswith(
        spec_review.MARKER + "\nNothing risky in the spec change.\n\n## Spec review: nothing risky"
    )


def test_no_merge_base_is_a_loud_failure(clone: Path, tmp_path: Path) -> None:
    event = _event(tmp_path, clone, labels=[])
    payload = json.loads(event.read_text())
    payload["pull_request"]["base"]["sha"] = "0" * 40  # not in this clone (a shallow checkout)
    event.write_text(json.dumps(payload))
    proc = _run_step(clone, _env(tmp_path, event), "review", "Review the spec change")
    assert proc.returncode == 2
    assert "::error::no merge base between 0000000000000000000000000000000000000000 and HEAD" in proc.stdout


def test_the_comment_is_one_sticky_comment_created_then_updated(clone: Path, tmp_path: Path) -> None:
    env = _env(tmp_path, _event(tmp_path, clone, labels=[]))
    out = tmp_path / "runner" / "spec-review"
    assert _run_step(clone, env, "review", "Review the spec change").returncode == 1
    # Someone's own comment quoting the marker, and 120 others: the job's comment is on page 2.
    others = [{"id": i, "body": f"comment {i}", "user": {"type": "User"}} for i in range(120)]
    others[5]["body"] = f"quoting {spec_review.MARKER}"
    api = GitHubApiMock(others)
    assert spec_review.main(["comment", "--out", str(out)], env, api) == 0
    assert api.calls[-1] == ("POST", "/repos/lab/specprobe/issues/7/comments")
    ours = [c for c in api.comments if spec_review.MARKER in c["body"] and c["user"]["type"] == "Bot"]
    assert len(ours) == 1 and "gate `leg2_exit_clean` removed" in ours[0]["body"]
    # The next run (the label added) edits that comment; the PR still has exactly one.
    env = _env(tmp_path, _event(tmp_path, clone, labels=["spec-risk-accepted"]))
    assert _run_step(clone, env, "review", "Review the spec change").returncode == 0
    assert spec_review.main(["comment", "--out", str(out)], env, api) == 0
    assert api.calls[-1] == ("PATCH", f"/repos/lab/specprobe/issues/comments/{ours[0]['id']}")
    assert [c["id"] for c in api.comments if spec_review.MARKER in c["body"] and c["user"]["type"] == "Bot"] == [
        ours[0]["id"]
    ]
    assert "approved by the label" in ours[0]["body"]
    assert others[5]["body"] == f"quoting {spec_review.MARKER}"  # a human's comment is never edited


def test_a_fork_without_write_access_warns_and_anything_else_fails(clone: Path, tmp_path: Path) -> None:
    env = _env(tmp_path, _event(tmp_path, clone, labels=[], fork=True))
    out = tmp_path / "runner" / "spec-review"
    _run_step(clone, env, "review", "Review the spec change")
    assert spec_review.main(["comment", "--out", str(out)], env, GitHubApiMock(refuse=403)) == 0
    env = _env(tmp_path, _event(tmp_path, clone, labels=[]))
    _run_step(clone, env, "review", "Review the spec change")
    assert spec_review.main(["comment", "--out", str(out)], env, GitHubApiMock(refuse=403)) == 2
    assert spec_review.main(["comment", "--out", str(tmp_path / "nothing")], env, GitHubApiMock()) == 2


def test_a_comment_too_long_for_github_is_cut_and_says_where_the_rest_is() -> None:
    body = spec_review.comment_body("x" * 70000, 1, False)
    assert len(body) <= spec_review.COMMENT_LIMIT
    assert body.endswith("the whole review is in the job summary)\n")


def test_the_workflow_is_a_thin_wrapper_with_one_writing_job() -> None:
    flow = yaml.safe_load(WORKFLOW.read_text())
    trigger = flow[True] if True in flow else flow["on"]  # YAML 1.1 reads `on:` as true
    pr = trigger["pull_request"]
    assert {"labeled", "unlabeled", "synchronize"} <= set(pr["types"])  # a label re-runs the check
    assert {"specs/**", "evidence/**", ".github/scripts/spec_review.py"} <= set(pr["paths"])
    assert flow["permissions"] == {"contents": "read"}
    review, comment = flow["jobs"]["review"], flow["jobs"]["comment"]
    assert "permissions" not in review
    assert comment["permissions"] == {"pull-requests": "write"} and comment["needs"] == "review"
    assert comment["if"] == "${{ !cancelled() }}"  # a failed review is when the comment matters most
    for job in (review, comment):
        for step in job["steps"]:
            assert step.get("uses", "actions/").startswith("actions/"), step  # GitHub's own actions only
            run = step.get("run", "")
            assert len(run.splitlines()) <= 3, f"job logic belongs in the script: {run}"
    assert next(s for s in review["steps"] if s.get("uses", "").startswith("actions/checkout"))["with"] == {
        "fetch-depth": 0
    }
    assert "spec_review.py check" in _step("review", "Review the spec change")
    assert "spec_review.py comment" in _step("comment", "Post or update the review comment")
    text = WORKFLOW.read_text()
    assert "${{ secrets." not in text and "HF_TOKEN" not in text
    install = _step("review", "Install the engine (no torch, no trainer dependencies)")
    # The pyproject is the one list of what the engine needs: the job installs the package's core, no extra.
    assert [line.split() for line in install.splitlines()][0] == ["python", "-m", "pip", "install", "--quiet", "."]
