"""A crash at any line of the checkpoint protocol (save, push, pushed, verify, pointer, prune), at the very
first push and at later ones, the horizon's final/ push included, loses at most the unverified work: the
next session, on a wiped disk, resumes (or recovers, when the first pointer never landed) and the run ends
with the uninterrupted run's final weights, bit for bit. On the local store and on the Hub test server.

Each trial SIGKILLs a one-process session (tiny geometry, 6 steps, a push every 2) when its first phase
line appears at the first push (step 2); the next session, cold, is killed the same way at a later push; a
third session finishes. Every kill is checked: what the store holds right after it, and which decision the
next session takes from that (resume from the pointer, recover the newest verified checkpoint, or start
fresh). One process, because the protocol is rank 0's alone and a session costs mostly its imports: the
matrix's sessions at half the cost of 2-rank ones. A SIGKILL of torchrun and both ranks of a 2-rank
session inside a push is test_e2e_local's preempt run.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from pathlib import Path

import pytest
from hubserver import HUB_LFS_THRESHOLD, HUB_TOKEN, HubServer
from trainer_helpers import (
    BASELINE_PUSH_EVERY,
    BASELINE_STEPS,
    Run,
    baseline,
    explain,
    open_repo,
    run_trainer,
    single_cmd,
    store_url,
)

pytestmark = pytest.mark.slow

LAST = BASELINE_STEPS  # 6: pushes at 2 (the first), 4, 6 (ckpt/checkpoint-6, then final/)


def line(phase: str, step: int) -> str:
    """The regex of a protocol line of the ckpt/ push of ``step``."""
    return {
        "save": rf"^CKPT save step={step} ",
        "push": rf"^CKPT push step={step} -> ckpt/",
        "pushed": rf"^CKPT pushed step={step} ",
        "verify": rf"^CKPT verify step={step} ok",
        "pointer": rf"^latest\.json -> step={step} path=ckpt/",
        "prune": rf"^CKPT prune step={step} ",
    }[phase]


FINAL_PUSH = rf"^CKPT push step={LAST} -> final"
PHASES = ("save", "push", "pushed", "verify", "pointer", "prune")
# (name, kill_on, kill_after): the second kill of each trial, at a later push; the final/ push's own lines are
# told from the ckpt/checkpoint-6 ones by arming the kill only after its "-> final" line.
LATER = {
    "local": [
        ("save@4", line("save", 4), None),
        ("pushed@4", line("pushed", 4), None),
        ("verify@4", line("verify", 4), None),
        ("pointer@4", line("pointer", 4), None),
        ("prune@4", line("prune", 4), None),
        ("push@final", FINAL_PUSH, None),
    ],
    "hub": [
        ("push@4", line("push", 4), None),
        ("pushed@6", line("pushed", 6), None),
        ("verify@6", line("verify", 6), None),
        ("pointer@6", line("pointer", 6), None),
        ("pushed@final", line("pushed", LAST), FINAL_PUSH),
        ("verify@final", line("verify", LAST), FINAL_PUSH),
    ],
}
# A trial pairs a phase of the first push with a later kill. Three pairs are left out: every phase is still
# killed at the first push and at a later one on one backend at least (push and verify at the first push on
# the Hub, pushed and pointer at a later push on the Hub, verify at a later push locally), and each backend
# still meets all three decisions below; a trial costs three trainer sessions.
LEFT_OUT = {("local", "push"), ("local", "verify"), ("hub", "pushed")}
TRIALS = [
    (backend, first, *LATER[backend][i])
    for backend in ("local", "hub")
    for i, first in enumerate(PHASES)
    if (backend, first) not in LEFT_OUT
]
# What a kill at each phase of the first push can leave for the next session: nothing pushed (a fresh start), a
# checkpoint without a pointer (recovered) or a pointer (resumed). A line is read a moment after it is printed,
# so a kill may land after the phase's next commit; after the pointer's own line only the pointer can be there.
FIRST_BRANCHES = {
    "save": {"fresh", "recovered"},
    "push": {"fresh", "recovered"},
    "pushed": {"recovered", "pointer"},
    "verify": {"recovered", "pointer"},
    "pointer": {"pointer"},
    "prune": {"pointer"},
}


class Backend:
    """Where a trial's store lives, and how the test reads it (the bytes stored, not metadata)."""

    def __init__(self, kind: str, tmp_path: Path, server: HubServer | None, name: str):
        self.kind, self.server = kind, server
        self.repo_id = f"probe/kill-{name}"
        self.url = store_url(tmp_path / "store") if kind == "local" else f"hf://{self.repo_id}"
        self.env = (
            {}
            if server is None
            else {
                **server.env(),
                "HF_HUB_DISABLE_PROGRESS_BARS": "1",
                "SPECPROBE_HUB_RETRIES": "6",
                "SPECPROBE_HUB_BACKOFF_S": "0.05",
            }
        )

    def files(self) -> dict[str, bytes]:
        if self.server is not None:
            if ("dataset", self.repo_id) not in self.server.repos:
                return {}
            return {p: b for p, b in self.server.files(self.repo_id).items() if p != ".gitattributes"}
        store = open_repo(self.url)
        return {p: store.read_bytes(p) for p in store.list_files()} if store.exists() else {}

    def pointer(self) -> dict | None:
        raw = self.files().get("latest.json")
        return None if raw is None else json.loads(raw)

    def final_sha(self) -> str:
        return hashlib.sha256(self.files()["final/model.safetensors"]).hexdigest()


def expected_decision(files: dict[str, bytes], url: str) -> str:
    """The line the next session must log, from what the store holds after a kill."""
    if "latest.json" in files:
        p = json.loads(files["latest.json"])
        return f"auto-resume: pointer step={p['step']} path={p['path_in_repo']}"
    steps = sorted({int(m.group(1)) for f in files if (m := re.match(r"^ckpt/checkpoint-(\d+)/", f))})
    if steps:  # the first push landed, its pointer did not: the checkpoint is recovered
        return f"latest.json -> step={steps[-1]} path=ckpt/checkpoint-{steps[-1]} (recovered)"
    return f"auto-resume: no pointer in {url}, fresh start"


def branch(decision: str) -> str:
    return "recovered" if "(recovered)" in decision else "fresh" if "fresh start" in decision else "pointer"


def allowed_after(phase: str, step: int, previous: int | None) -> set:
    """Pointer steps a kill at ``phase`` of the push of ``step`` may leave (a line is read a moment after it
    is printed, so the process may have finished that phase's next commit)."""
    if phase in ("pointer", "prune"):
        return {step}
    return {previous} if phase == "save" else {previous, step}


def kill_and_check(backend: Backend, args: list[str], kill_on: str, kill_after: str | None, what: str) -> Run:
    run = run_trainer(single_cmd(args), kill_on=kill_on, kill_after=kill_after, env=backend.env, timeout=240)
    assert run.killed_at is not None, f"{what}: the line never appeared:\n" + explain(run)
    assert run.rc != 0 and run.run_json is None, explain(run)
    return run


@pytest.fixture
def server_for(request):
    """A Hub test server for the hub trials (none for the local ones)."""

    def make(kind: str) -> HubServer | None:
        if kind != "hub":
            return None
        server = HubServer(token=HUB_TOKEN, lfs_threshold=HUB_LFS_THRESHOLD).start()
        request.addfinalizer(server.stop)
        return server

    return make


@pytest.mark.parametrize(
    "backend_kind,first,later,later_on,later_after", TRIALS, ids=[f"{b}-{f}@2-{n}" for b, f, n, _, _ in TRIALS]
)
def test_killed_at_two_protocol_lines_then_cold_resumed_ends_bit_identical(
    backend_kind, first, later, later_on, later_after, tmp_path, tmp_path_factory, server_for
):
    base = baseline(tmp_path_factory, nproc=1)
    trial = f"{backend_kind}-{first}@2-{later}"
    backend = Backend(backend_kind, tmp_path, server_for(backend_kind), f"{first}-{later}".replace("@", "-"))
    out = tmp_path / "out"
    args = base.args(out, backend.url, nproc=1)

    # Kill 1: the very first push (step 2); no pointer can exist before it.
    kill_and_check(backend, args, line(first, 2), None, trial)
    ptr = backend.pointer()
    assert (ptr["step"] if ptr else None) in allowed_after(first, 2, None), (trial, ptr)
    decision = expected_decision(backend.files(), backend.url)
    assert branch(decision) in FIRST_BRANCHES[first], (trial, decision)
    shutil.rmtree(out, ignore_errors=True)  # cold: nothing local survives the crash

    # Kill 2: the next session, at a later push.
    later_phase, _, at = later.partition("@")
    run = kill_and_check(backend, args, later_on, later_after, trial)
    assert decision in run.lines, (decision, explain(run))
    ptr = backend.pointer()
    if at == "final":  # the non-terminal pointer at 6 stays until final/ is pointed at
        assert ptr["step"] == LAST and ptr["path_in_repo"] in (f"ckpt/checkpoint-{LAST}", "final"), (trial, ptr)
    else:
        step = int(at)
        assert ptr["step"] in allowed_after(later_phase, step, step - BASELINE_PUSH_EVERY), (trial, ptr)
    decision = expected_decision(backend.files(), backend.url)
    shutil.rmtree(out, ignore_errors=True)

    # The third session finishes the run (or, if the kill landed after the terminal pointer, nothing is left).
    if not ptr["terminal"]:
        done = run_trainer(single_cmd(args), env=backend.env, timeout=240)
        assert done.rc == 0 and done.run_json is not None, explain(done)
        assert decision in done.lines, (decision, explain(done))
        assert done.run_json["final_step"] == BASELINE_STEPS
        for s, loss in done.run_json["losses"].items():
            assert loss == base.run.run_json["losses"][s], (trial, s)
        assert "lease.json" not in backend.files()  # the session that finished released the store
    final = backend.pointer()
    assert final["terminal"] is True and final["step"] == LAST
    assert backend.final_sha() == base.final_sha, trial  # bit-identical to the uninterrupted run
