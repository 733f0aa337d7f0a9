"""End to end over HTTP: the Hub backend against tests/hubserver.py, driven by the unmodified huggingface_hub
client inside real subprocesses (the engine, torchrun and its gloo ranks, `python -m trainer.data.mix`).

(a) The whole P4 smoke probe, `engine run specs/p4_smoke.yaml` with the checkpoint repo and the mix repo on the
    test Hub, passes; the (fake) token reaches the server as the bearer but appears in no output: stdout,
    stderr, evidence.json, logs/*, torchrun's per-rank logs, the run's files, the server's request log, the
    files stored in the Hub repos.
(b) Nothing is lost: a run under injected faults (a lost commit answer, a 503, a 429 with Retry-After, a
    connection reset mid LFS upload, a truncated download during the resume), stopped mid-run and cold-resumed,
    ends with the same final weights as a fault-free run, and no commit was pushed twice.
(c) A missing Hub repo takes the fresh-start branch (`auto-resume: repo missing`).
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest
from hubserver import HUB_LFS_THRESHOLD, HUB_TOKEN, HubServer
from test_e2e_local import EngineRun, assert_every_check_passed, engine_env, run_engine, workdir_with_specs
from trainer_helpers import Run, explain, run_trainer, tiny_mix, torchrun_cmd, trainer_args

pytestmark = pytest.mark.slow

MARKER_SUFFIX = re.compile(r"\s*\[specprobe-commit [0-9a-f]+\]\s*$")
FAST_RETRIES = {"SPECPROBE_HUB_RETRIES": "6", "SPECPROBE_HUB_BACKOFF_S": "0.05"}


def hub_env(server: HubServer) -> dict[str, str]:
    env = server.env()
    assert env["HF_TOKEN"] == HUB_TOKEN and env["HF_HUB_DISABLE_XET"] == "1"
    env.update({"HF_HUB_DISABLE_PROGRESS_BARS": "1", "HF_HUB_DISABLE_TELEMETRY": "1", **FAST_RETRIES})
    return env


def titles(server: HubServer, repo_id: str) -> list[str]:
    """Commit titles on main, oldest first, without the per-commit unique marker and the writers' lease commits
    (a run of two legs takes and releases the lease twice)."""
    return [
        t for t in (MARKER_SUFFIX.sub("", c.title) for c in server.repo(repo_id).commits) if not t.startswith("lease ")
    ]


def stored_sha(server: HubServer, repo_id: str, path: str) -> str:
    """sha256 of the bytes the server holds for `path` at the head (not the recorded metadata)."""
    return hashlib.sha256(server.files(repo_id)[path]).hexdigest()


def settled_by_reading_back(server: HubServer, repo_id: str, start: int) -> int:
    """Index of the first lost commit answer at or after `start`, after checking that the client's next request
    to the repo read the commit history back (and did not push the commit again first)."""
    log = server.log
    i = next(i for i in range(start, len(log)) if log[i]["fault"] == "lost_response")
    nxt = next(r for r in log[i + 1 :] if f"/{repo_id}/" in r["path"] or r["path"].endswith(f"/{repo_id}"))
    assert nxt["method"] == "GET" and re.search(r"/commits/main", nxt["path"]), nxt
    return i


def assert_lost_answer_was_the_checkpoint_commit(
    server: HubServer, repo_id: str, start: int, step: int, dest: str, output: str
) -> None:
    """The second commit request at or after log index `start` (the first takes the lease) is the one whose answer
    was lost; it is the commit of checkpoint `step` (the history holds it once), and the trainer reported that
    commit's revision."""
    commit_posts = [
        r for r in server.log[start:] if r["method"] == "POST" and r["path"] == f"/api/datasets/{repo_id}/commit/main"
    ]
    assert [r["fault"] for r in commit_posts[:2]] == [None, "lost_response"], commit_posts[:3]
    title = f"checkpoint step {step} -> {dest}"
    landed = [c for c in server.repo(repo_id).commits if MARKER_SUFFIX.sub("", c.title) == title]
    assert len(landed) == 1, titles(server, repo_id)
    assert f"CKPT pushed step={step} revision={landed[0].oid} " in output, output[-3000:]


def fresh_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


# ------------------------------------------------------------------------------- (a) + (c): the smoke probe


@dataclass
class HubSmoke:
    server: HubServer
    workdir: Path
    run: EngineRun
    ckpt_id: str
    mix_id: str
    existed_before: bool


@pytest.fixture(scope="module")
def hub_smoke(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HubSmoke]:
    server = HubServer(token=HUB_TOKEN, lfs_threshold=HUB_LFS_THRESHOLD).start()
    try:
        workdir = workdir_with_specs(tmp_path_factory.mktemp("e2e_hub"))
        ckpt_id, mix_id = f"probe/{fresh_id('ckpt')}", f"probe/{fresh_id('mix')}"
        existed = ("dataset", ckpt_id) in server.repos
        run = run_engine(
            workdir,
            "specs/p4_smoke.yaml",
            f"repo=hf://{ckpt_id}",
            f"mix_repo=hf://{mix_id}",
            env=engine_env(hub_env(server)),
            timeout=400,
        )
        yield HubSmoke(server, workdir, run, ckpt_id, mix_id, existed)
    finally:
        server.stop()


def test_p4_smoke_passes_over_http(hub_smoke: HubSmoke) -> None:
    run, server = hub_smoke.run, hub_smoke.server
    assert_every_check_passed(run, "p4_smoke", min_checks=27)
    ev = run.evidence
    assert ev["values"]["repo"] == f"hf://{hub_smoke.ckpt_id}" and ev["sources"]["repo"] == "--set"
    assert ev["values"]["mix_repo"] == f"hf://{hub_smoke.mix_id}"

    leg1, leg2 = ev["steps"]["leg1"]["harvest"]["run_json"], ev["steps"]["leg2"]["harvest"]["run_json"]
    assert leg1["final_step"] == 10 and leg1["hub_repo"] == f"hf://{hub_smoke.ckpt_id}"
    assert leg2["resumed_from_step"] == 10 and leg2["first_step"] == 11 and leg2["final_step"] == 20

    after1, after2 = ev["state"]["hub_after_leg1"], ev["state"]["hub_after_leg2"]
    assert after1["checkpoints"] == [10] and after1["pointer"]["step"] == 10
    assert after2["sha256_source"] == "hub-lfs", after2["sha256_source"]
    assert after2["checkpoints"] == [10, 20] and after2["has_final"] is True
    p2 = after2["pointer"]
    assert p2["step"] == 20 and p2["path_in_repo"] == "final" and p2["terminal"] is True

    # The state the collector reported is the state on the server: same file list, and the pointer's weights
    # hash is the sha256 of the bytes the server really stores.
    files = server.files(hub_smoke.ckpt_id)
    assert sorted(p for p in files if p != ".gitattributes") == sorted(after2["files"])
    assert hashlib.sha256(files["final/model.safetensors"]).hexdigest() == p2["files"]["model.safetensors"]
    assert json.loads(files["latest.json"])["step"] == 20
    # The mix went through the Hub too: published by fetch_mix (built on first use) in one commit.
    mix_files = server.files(hub_smoke.mix_id)
    assert "manifest.json" in mix_files and any(p.startswith("train/") for p in mix_files)
    # The checkpoint payloads took the LFS path (what the real Hub does with *.safetensors / *.pt).
    assert server.requests("PUT", r"^/__lfs__/upload/datasets/" + re.escape(hub_smoke.ckpt_id) + "/")
    # Each push is exactly one checkpoint commit; nothing was pushed twice.
    t = titles(server, hub_smoke.ckpt_id)
    ckpt_commits = [x for x in t if x.startswith("checkpoint step ")]
    assert ckpt_commits == [
        "checkpoint step 10 -> ckpt/checkpoint-10",
        "checkpoint step 20 -> ckpt/checkpoint-20",
        "checkpoint step 20 -> final",
    ], t


def _every_output_text(smoke: HubSmoke) -> dict[str, bytes]:
    out: dict[str, bytes] = {"<engine stdout>": smoke.run.stdout.encode(), "<engine stderr>": smoke.run.stderr.encode()}
    for p in sorted(smoke.workdir.rglob("*")):
        if p.is_file() and not p.is_symlink() and "specs" not in p.relative_to(smoke.workdir).parts[:1]:
            out[str(p.relative_to(smoke.workdir))] = p.read_bytes()
    out["<server request log>"] = json.dumps(smoke.server.log, default=str).encode()
    for repo_id in (smoke.ckpt_id, smoke.mix_id):
        for path, data in smoke.server.files(repo_id).items():
            out[f"<hub {repo_id}>/{path}"] = data
        out[f"<hub {repo_id} commits>"] = json.dumps(
            [[c.title, c.message] for c in smoke.server.repo(repo_id).commits]
        ).encode()
    return out


def test_token_appears_in_no_output(hub_smoke: HubSmoke) -> None:
    server, run = hub_smoke.server, hub_smoke.run
    assert run.rc == 0, run.explain()
    # The token was really in play: every write the server saw carried it as the bearer.
    writes = [
        r
        for r in server.log
        if r["method"] in ("POST", "PUT", "DELETE") and not r["path"].startswith(("/__lfs__/upload/", "/__control__/"))
    ]
    assert len(writes) >= 10, len(writes)
    assert all(r["authorized"] for r in writes), [r["path"] for r in writes if not r["authorized"]]
    assert all(r["status"] != 401 for r in server.log)

    texts = _every_output_text(hub_smoke)
    ev_dir = run.run_dir.relative_to(hub_smoke.workdir)
    expected = {
        f"{ev_dir}/evidence.json",
        f"{ev_dir}/logs/leg1.log",
        f"{ev_dir}/logs/leg2.log",
        f"{ev_dir}/logs/fetch_mix.log",
    }
    assert expected <= set(texts), sorted(texts)
    # leg 2's torchrun per-rank logs survive the run (leg 1's were wiped by the spec, checked for whatever is left)
    rank_logs = [k for k in texts if k.startswith(f"{ev_dir}/tlogs/") and k.endswith(("stdout.log", "stderr.log"))]
    assert len(rank_logs) >= 4, rank_logs
    assert any(b"RUN_JSON" in texts[k] for k in rank_logs)
    needle = HUB_TOKEN.encode()
    leaks = [name for name, data in texts.items() if needle in data]
    assert leaks == [], leaks
    # Nor its recognisable middle part (a token cut or re-encoded on the way out).
    assert [n for n, d in texts.items() if b"FAKE_SECRET_TOKEN" in d] == []


def test_missing_repo_takes_the_fresh_start_branch(hub_smoke: HubSmoke) -> None:
    server, run = hub_smoke.server, hub_smoke.run
    assert hub_smoke.existed_before is False
    url = f"hf://{hub_smoke.ckpt_id}"
    leg1_log = (run.run_dir / run.evidence["steps"]["leg1"]["log"]).read_text()
    assert f"auto-resume: repo missing, created {url}, fresh start" in leg1_log, leg1_log[-3000:]
    leg1 = run.evidence["steps"]["leg1"]["harvest"]["run_json"]
    assert leg1["resumed_from_step"] is None and leg1["first_step"] == 1
    assert sorted(map(int, leg1["losses"])) == list(range(1, 11))
    # Over HTTP: the server answered "repo not found" for this repo, then got the create request, before the
    # first commit; the created repo is private (a probe repo must not be public).
    api = "/api/datasets/" + hub_smoke.ckpt_id
    log = server.log
    first_404 = next(i for i, r in enumerate(log) if r["path"].startswith(api) and r["status"] == 404)
    create = next(
        i for i, r in enumerate(log) if r["path"] == "/api/repos/create" and r["status"] == 200 and i > first_404
    )
    first_commit = next(i for i, r in enumerate(log) if r["path"].startswith(api + "/commit/"))
    assert first_404 < create < first_commit
    assert server.repo(hub_smoke.ckpt_id).private is True


# ------------------------------------------------------------------- (b) nothing is lost under faults


STEPS, PUSH_EVERY, STOP = 6, 2, 4


def test_nothing_is_lost_under_faults_same_final_weights_as_a_clean_run(
    hub_server: HubServer, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    mix = tiny_mix(tmp_path_factory)
    env = engine_env(hub_env(hub_server))

    # One rank under torchrun: the Hub traffic is rank 0's, and a session costs mostly its imports.
    def train(repo_id: str, out: Path, stop: int, log_dir: Path) -> Run:
        args = trainer_args(
            root=mix, out=out, repo=f"hf://{repo_id}", steps=STEPS, push_every=PUSH_EVERY, stop=stop, nproc=1
        )
        return run_trainer(torchrun_cmd(args, nproc=1, log_dir=log_dir), env=env, cwd=tmp_path, timeout=240)

    # -- the fault-free reference: one session to the horizon.
    clean_id = f"probe/{fresh_id('clean')}"
    clean = train(clean_id, tmp_path / "clean-out", 0, tmp_path / "clean-tlogs")
    assert clean.rc == 0 and clean.run_json is not None, explain(clean)
    assert clean.run_json["final_step"] == STEPS and clean.run_json["resumed_from_step"] is None
    clean_final = stored_sha(hub_server, clean_id, "final/model.safetensors")
    clean_titles = titles(hub_server, clean_id)
    assert not any(r["fault"] for r in hub_server.log)

    # -- the faulted run: leg 1 to the stop under faults, the local run dir wiped, leg 2 cold-resumes.
    faulted_id = f"probe/{fresh_id('faulted')}"
    repo_path = re.escape(faulted_id)
    commit = rf"^/api/datasets/{repo_path}/commit/main$"
    n_log = len(hub_server.log)
    # Faults are matched in the order they are armed; a request taken by one is not counted by the later ones.
    # The first commit takes the lease; the second is checkpoint-2's: it lands, its answer is lost.
    lost = hub_server.inject("lost_response", commit, method="POST", nth=2)
    s503 = hub_server.inject("status", commit, method="POST", status=503, nth=2)
    s429 = hub_server.inject("status", commit, method="POST", status=429, retry_after=1, nth=3)
    reset = hub_server.inject("reset", rf"^/__lfs__/upload/datasets/{repo_path}/", method="PUT", nth=4)
    leg1 = train(faulted_id, tmp_path / "out", STOP, tmp_path / "tlogs1")
    assert leg1.rc == 0 and leg1.run_json is not None, explain(leg1)
    assert leg1.run_json["final_step"] == STOP and leg1.run_json["segment_stop"] is True
    assert leg1.run_json["push_steps"] == [2, 4]
    # The Hub client's retries are diagnostics through `logging`, each with its time and the rank it ran on.
    retries = [line for line in leg1.lines if "trainer.hub: hub: " in line and "; retrying in " in line]
    assert len(retries) >= 2, explain(leg1)  # the 503 and the 429
    stamp = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} rank 0 WARNING trainer\.hub: hub: ")
    assert all(stamp.match(line) for line in retries), retries
    assert [(f.kind, f.fired) for f in (lost, s503, s429, reset)] == [
        ("lost_response", 1),
        ("status", 1),
        ("status", 1),
        ("reset", 1),
    ], hub_server.faults
    # The first checkpoint commit is the one whose answer was lost: settled by reading the history back, it is
    # on the server exactly once and the trainer carried on with its revision.
    lost_req = hub_server.log[settled_by_reading_back(hub_server, faulted_id, n_log)]
    assert lost_req["status"] == -1
    assert_lost_answer_was_the_checkpoint_commit(hub_server, faulted_id, n_log, 2, "ckpt/checkpoint-2", leg1.text)
    # The 429 carried Retry-After: 1 and the client waited at least that long before its next commit try.
    i429 = next(i for i, r in enumerate(hub_server.log) if r["fault"] == "status" and r["status"] == 429)
    nxt = next(r for r in hub_server.log[i429 + 1 :] if re.search(commit, r["path"]))
    assert nxt["time"] - hub_server.log[i429]["time"] >= 0.95

    shutil.rmtree(tmp_path / "out")  # cold: leg 2 has nothing but the Hub
    n_log = len(hub_server.log)
    trunc = hub_server.inject(
        "truncate", rf"/datasets/{repo_path}/resolve/[^/]+/ckpt/checkpoint-4/model\.safetensors", method="GET", nth=1
    )
    lost2 = hub_server.inject("lost_response", commit, method="POST", nth=2)  # checkpoint-6's (after the lease)
    leg2 = train(faulted_id, tmp_path / "out", 0, tmp_path / "tlogs2")
    assert leg2.rc == 0 and leg2.run_json is not None, explain(leg2)
    assert leg2.run_json["resumed_from_step"] == STOP and leg2.run_json["first_step"] == STOP + 1
    assert leg2.run_json["final_step"] == STEPS and leg2.run_json["segment_stop"] is False
    assert f"auto-resume: pointer step={STOP} path=ckpt/checkpoint-{STOP}" in leg2.text
    assert (trunc.fired, lost2.fired) == (1, 1), hub_server.faults
    settled_by_reading_back(hub_server, faulted_id, n_log)
    assert_lost_answer_was_the_checkpoint_commit(hub_server, faulted_id, n_log, 6, "ckpt/checkpoint-6", leg2.text)
    # The truncated transfer happened during the resume and was fetched again in full.
    gets = [
        r
        for r in hub_server.log[n_log:]
        if r["method"] == "GET" and re.search(r"/ckpt/checkpoint-4/model\.safetensors$", r["path"])
    ]
    assert [g["fault"] for g in gets][:1] == ["truncate"] and len(gets) >= 2, gets

    # -- nothing lost: the same final weights (and every checkpoint's weights) as the fault-free run.
    assert stored_sha(hub_server, faulted_id, "final/model.safetensors") == clean_final
    for step in range(PUSH_EVERY, STEPS + 1, PUSH_EVERY):
        path = f"ckpt/checkpoint-{step}/model.safetensors"
        assert stored_sha(hub_server, faulted_id, path) == stored_sha(hub_server, clean_id, path), path
    # The retries' jittered backoff never touched the training RNG: every rank's RNG state is the clean run's.
    for path in (f"ckpt/checkpoint-{STEPS}/rng.pt", "final/rng.pt"):
        assert stored_sha(hub_server, faulted_id, path) == stored_sha(hub_server, clean_id, path), path
    pointer = json.loads(hub_server.files(faulted_id)["latest.json"])
    assert pointer["step"] == STEPS and pointer["terminal"] is True and pointer["path_in_repo"] == "final"
    assert pointer["files"]["model.safetensors"] == clean_final

    # -- no duplicate commit: the faulted repo's history is the clean one's, commit for commit.
    faulted_titles = titles(hub_server, faulted_id)
    ckpt = [t for t in faulted_titles if t.startswith("checkpoint step ")]
    assert len(ckpt) == len(set(ckpt)) == STEPS // PUSH_EVERY + 1, faulted_titles
    assert faulted_titles == clean_titles, (faulted_titles, clean_titles)
    # And the token stayed out of both legs' output.
    assert HUB_TOKEN not in leg1.text + leg2.text + clean.text


def test_a_push_whose_answer_never_comes_and_a_409_on_its_pointer_both_settle_with_the_timeout_main_read(
    hub_server: HubServer, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    mix = tiny_mix(tmp_path_factory)
    env = engine_env({**hub_env(hub_server), "SPECPROBE_HUB_READ_TIMEOUT_S": "1"})
    repo_id = f"probe/{fresh_id('stall')}"
    commit = rf"^/api/datasets/{re.escape(repo_id)}/commit/main$"
    # Commits: the lease (1st), checkpoint-2 (2nd: it lands and its answer never comes), the pointer (3rd: 409).
    stall = hub_server.inject("stall", commit, method="POST", nth=2)
    conflict = hub_server.inject("status", commit, method="POST", status=409, nth=2)
    args = trainer_args(root=mix, out=tmp_path / "out", repo=f"hf://{repo_id}", steps=4, push_every=2, stop=2, nproc=1)
    leg = run_trainer(torchrun_cmd(args, nproc=1, log_dir=tmp_path / "tlogs"), env=env, cwd=tmp_path, timeout=240)
    assert leg.rc == 0 and leg.run_json is not None and leg.run_json["final_step"] == 2, explain(leg)
    # The knob was read once, by main, and said.
    assert leg.text.count("hub client: 6 tries, backoff 0.05s doubling up to 1.6s, timeouts connect 30s read 1s") == 1
    assert (stall.fired, conflict.fired) == (1, 1), hub_server.faults
    assert any("landed although its answer was lost" in line and "ReadTimeout" in line for line in leg.lines)
    # The checkpoint landed once and got its pointer: the next session resumes at step 2, not 0.
    t = titles(hub_server, repo_id)
    assert (
        t.count("checkpoint step 2 -> ckpt/checkpoint-2") == 1
        and t.count("latest.json -> step 2 ckpt/checkpoint-2") == 1
    )
    pointer = json.loads(hub_server.files(repo_id)["latest.json"])
    assert (pointer["step"], pointer["path_in_repo"]) == (2, "ckpt/checkpoint-2")
