#!/usr/bin/env python3
"""The spec workflow's job logic (.github/workflows/specs.yml is a thin wrapper around this file).

    spec_review.py check   --out DIR   run `engine review` against the PR's merge base, write the
                                       job summary and DIR/comment.md; exit 1 on risky changes
                                       unless the PR carries the approval label, 2 on an invalid spec
    spec_review.py comment --out DIR   post DIR/comment.md as the PR's one sticky comment, or update
                                       the one posted before (needs a token with pull-requests: write)

Everything here runs in the test suite against a real git repository and a fake event payload;
only `GitHubApi.request` (the HTTP call to GitHub) is replaced there. The standard library only:
the job installs nothing for it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Mapping, Protocol

APPROVAL_LABEL = "spec-risk-accepted"
MARKER = "<!-- specprobe spec review -->"  # how the sticky comment is found again
COMMENT_LIMIT = 65536  # GitHub refuses a longer comment body
EXIT_SAFE, EXIT_RISKY, EXIT_INVALID = 0, 1, 2


class JobError(Exception):
    """The job cannot do its work (no merge base, no payload, an API refusal); exit 2 with the message."""


def _event(env: Mapping[str, str]) -> dict[str, Any]:
    path = env.get("GITHUB_EVENT_PATH")
    if not path:
        raise JobError("GITHUB_EVENT_PATH is not set: this runs inside a GitHub Actions job")
    try:
        event = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise JobError(f"{path}: cannot read the event payload: {exc}") from None
    if not isinstance(event.get("pull_request"), dict):
        raise JobError(f"{path}: not a pull_request event (no `pull_request` in the payload)")
    return event


def _labels(pr: Mapping[str, Any]) -> list[str]:
    return [label.get("name", "") for label in pr.get("labels") or [] if isinstance(label, dict)]


def _merge_base(base_sha: str) -> str:
    proc = subprocess.run(["git", "merge-base", base_sha, "HEAD"], capture_output=True, text=True)
    if proc.returncode != 0:
        raise JobError(
            f"no merge base between {base_sha} and HEAD (a shallow clone? checkout needs "
            f"fetch-depth: 0): {proc.stderr.strip()}"
        )
    return proc.stdout.strip()


def _append(env: Mapping[str, str], key: str, text: str) -> None:
    target = env.get(key)
    if target:
        with open(target, "a", encoding="utf-8") as f:
            f.write(text)


def comment_body(markdown: str, rc: int, accepted: bool) -> str:
    """The sticky comment: the marker, what the job decided and how to approve, then the review."""
    if rc == EXIT_INVALID:
        verdict = "**The spec check fails: a spec is invalid on one side (see below).**"
    elif rc == EXIT_RISKY:
        verdict = (
            f"**The spec check fails: risky changes need approval.** A maintainer approves them "
            f"by adding the label `{APPROVAL_LABEL}` to this PR (the check then re-runs)."
        )
    elif accepted:
        verdict = f"Risky changes approved by the label `{APPROVAL_LABEL}`."
    else:
        verdict = "Nothing risky in the spec change."
    body = f"{MARKER}\n{verdict}\n\n{markdown}"
    if len(body) > COMMENT_LIMIT:
        cut = "\n\n(cut short: GitHub takes 65,536 characters; the whole review is in the job summary)\n"
        body = body[: COMMENT_LIMIT - len(cut)] + cut
    return body


def check(out: Path, env: Mapping[str, str], engine: str = "engine") -> int:
    """Run `engine review` for the PR; the exit code is the job's."""
    event = _event(env)
    pr = event["pull_request"]
    base = _merge_base(pr["base"]["sha"])
    accepted = APPROVAL_LABEL in _labels(pr)
    out.mkdir(parents=True, exist_ok=True)
    review_md = out / "review.md"
    argv = [engine, "review", "--base", base, "--markdown", str(review_md)] + (["--accept-risk"] if accepted else [])
    print("+ " + " ".join(argv), flush=True)
    rc = subprocess.run(argv).returncode  # its text report goes to the job log as it is
    if rc not in (EXIT_SAFE, EXIT_RISKY, EXIT_INVALID) or not review_md.is_file():
        message = f"engine review exited {rc} without a review (see the log above)"
        print(f"::error::{message}", flush=True)
        markdown, rc = f"**{message}**\n", EXIT_INVALID
    else:
        markdown = review_md.read_text(encoding="utf-8")
    (out / "comment.md").write_text(comment_body(markdown, rc, accepted), encoding="utf-8")
    (out / "pr.json").write_text(
        json.dumps({"number": pr["number"], "repository": event["repository"]["full_name"], "fork": _is_fork(pr)}),
        encoding="utf-8",
    )
    _append(env, "GITHUB_STEP_SUMMARY", markdown + "\n")
    _append(env, "GITHUB_OUTPUT", f"review_rc={rc}\n")
    if rc == EXIT_RISKY:
        print(f"::error::risky spec changes need approval: add the label `{APPROVAL_LABEL}` to the PR", flush=True)
    elif rc == EXIT_INVALID:
        print("::error::a spec is invalid on one side of the change (see the review above)", flush=True)
    return rc


def _is_fork(pr: Mapping[str, Any]) -> bool:
    head = ((pr.get("head") or {}).get("repo") or {}).get("full_name")
    base = ((pr.get("base") or {}).get("repo") or {}).get("full_name")
    return bool(head and base and head != base)


# ---------------------------------------------------------------- the sticky comment


class Api(Protocol):
    def request(self, method: str, path: str, body: Mapping[str, Any] | None = None) -> Any: ...


class ApiError(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(f"GitHub API {status}: {message}")
        self.status = status


class GitHubApi:
    """GitHub's REST API over urllib: the one part of this job the test suite cannot run."""

    def __init__(self, token: str, url: str = "https://api.github.com"):
        self.token, self.url = token, url.rstrip("/")

    def request(self, method: str, path: str, body: Mapping[str, Any] | None = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(
            f"{self.url}{path}",
            data=data,
            method=method,
            headers={
                "Authorization": f"Bearer {self.token}",
                "Accept": "application/vnd.github+json",
                "X-GitHub-Api-Version": "2022-11-28",
                "Content-Type": "application/json",
            },
        )
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                text = resp.read().decode()
        except urllib.error.HTTPError as exc:
            raise ApiError(exc.code, exc.read().decode(errors="replace")[:300]) from None
        except urllib.error.URLError as exc:
            raise ApiError(0, str(exc.reason)) from None
        return json.loads(text) if text else None


def _ours(comment: Mapping[str, Any]) -> bool:
    # Only a bot's comment with the marker: a human quoting the marker must not have theirs edited.
    user = comment.get("user") or {}
    return MARKER in (comment.get("body") or "") and user.get("type") == "Bot"


def find_sticky(api: Api, repo: str, number: int) -> int | None:
    """The id of the comment this job posted before on the PR, or None (every page is read)."""
    page = 1
    while True:
        comments = api.request("GET", f"/repos/{repo}/issues/{number}/comments?per_page=100&page={page}")
        for c in comments or []:
            if _ours(c):
                return int(c["id"])
        if not comments or len(comments) < 100:
            return None
        page += 1


def post_sticky(api: Api, repo: str, number: int, body: str) -> tuple[str, int]:
    """("updated"|"created", comment id): one comment per PR, edited in place on every run."""
    found = find_sticky(api, repo, number)
    if found is not None:
        api.request("PATCH", f"/repos/{repo}/issues/comments/{found}", {"body": body})
        return "updated", found
    made = api.request("POST", f"/repos/{repo}/issues/{number}/comments", {"body": body})
    return "created", int(made["id"])


def comment(out: Path, env: Mapping[str, str], api: Api | None = None) -> int:
    """Post or update the sticky comment from what `check` left in `out`."""
    try:
        body = (out / "comment.md").read_text(encoding="utf-8")
        pr = json.loads((out / "pr.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise JobError(f"{out}: the review job left no comment (did it run?): {exc}") from None
    if api is None:
        token = env.get("GH_TOKEN") or env.get("GITHUB_TOKEN")
        if not token:
            raise JobError("no GH_TOKEN in the environment: the comment job passes `github.token`")
        api = GitHubApi(token, env.get("GITHUB_API_URL", "https://api.github.com"))
    try:
        done, cid = post_sticky(api, pr["repository"], int(pr["number"]), body)
    except ApiError as exc:
        if exc.status == 403 and pr.get("fork"):
            # A fork's PR gets a read-only token: the review job's result and summary still stand.
            print(
                f"::warning::cannot comment on a PR from a fork ({exc}); the review is in the job summary", flush=True
            )
            return 0
        raise JobError(str(exc)) from None
    print(f"{done} the spec review comment {cid} on {pr['repository']}#{pr['number']}", flush=True)
    return 0


def main(argv: list[str] | None = None, env: Mapping[str, str] | None = None, api: Api | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="spec_review.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("command", choices=("check", "comment"))
    parser.add_argument("--out", required=True, type=Path, help="where the review and the comment are kept")
    parser.add_argument("--engine", default="engine", help="the engine command (default: engine)")
    args = parser.parse_args(argv)
    env = os.environ if env is None else env
    try:
        if args.command == "check":
            return check(args.out, env, args.engine)
        return comment(args.out, env, api)
    except JobError as exc:
        print(f"::error::{exc}", flush=True)
        return EXIT_INVALID


if __name__ == "__main__":
    sys.exit(main())
