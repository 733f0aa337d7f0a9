"""A session releases the store's lease on every exit path, once: a refused resume, an exception after the
lease was taken, torchrun's SIGTERM to rank 0 when rank 1 exited first, and a release the Hub refuses (said
once). Real trainers (torchrun with 2 gloo ranks, or one process) on copies of real stores; real signals.

A store on a slow link (``?link_mb_s=``) holds rank 0 inside a commit, outside any collective, for seconds
after it took the lease: the window a signal lands in."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import psutil
import pytest
from trainer_helpers import (
    BASELINE_STEPS,
    baseline,
    copy_repo,
    explain,
    open_repo,
    rank_exit_codes,
    run_trainer,
    single_cmd,
    torchrun_cmd,
    trainer_args,
)

from trainer import sigterm
from trainer.store.lease import LEASE_PATH

pytestmark = pytest.mark.slow

SLOW_LINK = "?link_mb_s=0.0001"  # 100 bytes/s: a pointer commit (~900 bytes) lasts about 9 s


def lease_lines(run) -> tuple[list[str], list[str]]:
    """(the lines that took the lease, the lines that released it)."""
    held = [line for line in run.lines if line.startswith("lease: ") and " holds " in line]
    released = [line for line in run.lines if line.startswith("lease: ") and " released " in line]
    return held, released


def assert_released_once(run, url: str) -> None:
    """``url``: the store URL the trainer was given (the lines name it so)."""
    held, released = lease_lines(run)
    assert len(held) == 1 and len(released) == 1, explain(run)
    writer = held[0].split()[1]
    assert released[0] == f"lease: {writer} released {url}", released
    assert not any("release FAILED" in line for line in run.lines), explain(run)
    assert LEASE_PATH not in open_repo(url.split("?")[0]).list_files()


def unpointed_copy(tmp_path_factory, tmp_path: Path) -> tuple[Path, str]:
    """A copy of the baseline store without latest.json: the resume recovers the pointer, one commit that a
    slow link stretches out."""
    base = baseline(tmp_path_factory)
    repo = copy_repo(base.repo, tmp_path)
    open_repo(repo).commit({}, delete=["latest.json"], message="lose the pointer")
    return base.mix, repo


def test_a_refused_resume_releases_the_lease_it_took(tmp_path, tmp_path_factory):
    base = baseline(tmp_path_factory)
    repo = copy_repo(base.repo, tmp_path)
    args = trainer_args(root=base.mix, out=tmp_path / "out", repo=repo, steps=BASELINE_STEPS + 2, push_every=2)
    run = run_trainer(torchrun_cmd(args), timeout=90)
    codes = rank_exit_codes(run)
    assert 3 in codes.values() and set(codes.values()) <= {3, -15}, explain(run)
    assert len(run.starting("refused: ")) == 1 and "is terminal" in run.starting("refused: ")[0]
    assert_released_once(run, repo)


def test_a_refusal_after_the_decision_releases_the_lease(tmp_path, tmp_path_factory):
    """Refused in the fetch-and-load part of the resume (a stale stop step), after the scan took the lease."""
    mix, repo = unpointed_copy(tmp_path_factory, tmp_path)
    args = trainer_args(root=mix, out=tmp_path / "out", repo=repo, steps=BASELINE_STEPS, push_every=2, stop=4)
    run = run_trainer(torchrun_cmd(args), timeout=90)
    codes = rank_exit_codes(run)
    assert 3 in codes.values() and set(codes.values()) <= {3, -15}, explain(run)
    assert "nothing to train: resumed at step 6" in run.starting("refused: ")[0]
    assert_released_once(run, repo)


def interrupt(line: str) -> None:
    """An on_line hook: a real SIGINT to the trainer as soon as it says it holds the lease."""
    if line.startswith("lease: ") and " holds " in line:
        os.kill(int(line.split()[1].split(":")[1]), signal.SIGINT)  # the writer id is host:pid:token


def test_an_exception_after_the_lease_is_taken_releases_it(tmp_path, tmp_path_factory):
    """A KeyboardInterrupt (a real SIGINT) inside the resume's recovery: its checks, or the pointer commit the
    slow link stretches to seconds; the lease was taken before."""
    mix, repo = unpointed_copy(tmp_path_factory, tmp_path)
    args = trainer_args(
        root=mix, out=tmp_path / "out", repo=repo + SLOW_LINK, steps=BASELINE_STEPS, push_every=2, nproc=1
    )
    run = run_trainer(single_cmd(args), on_line=interrupt, timeout=120)
    assert run.rc == -signal.SIGINT and "KeyboardInterrupt" in run.text, explain(run)
    assert not run.starting("latest.json -> "), explain(run)  # it stopped inside the recovery
    assert_released_once(run, repo + SLOW_LINK)


def test_a_ctrl_c_during_a_shielded_cleanup_waits_for_its_end():
    """The lease's release runs shielded: a real SIGINT to this process in the middle of it is held back until
    the cleanup ends, then raised as a Ctrl-C is (KeyboardInterrupt), and the handler before it is back."""
    before = signal.getsignal(signal.SIGINT)
    steps = []
    with pytest.raises(KeyboardInterrupt):
        with sigterm.shielded():
            steps.append("started")
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)  # Python runs the handler here, between bytecodes
            steps.append("finished")
    assert steps == ["started", "finished"]
    assert signal.getsignal(signal.SIGINT) is before


def test_a_shielded_cleanup_without_a_ctrl_c_raises_nothing():
    before = signal.getsignal(signal.SIGINT)
    with sigterm.shielded():
        time.sleep(0.01)
    assert signal.getsignal(signal.SIGINT) is before


def test_torchrun_stopping_rank_0_because_rank_1_exited_releases_the_lease(tmp_path, tmp_path_factory):
    """Rank 1 dies (SIGKILL) while rank 0, holding the lease, is inside a commit; torchrun's agent SIGTERMs
    rank 0. Rank 0 releases the lease, says so, and still ends by SIGTERM (-15), not with a success."""
    mix, repo = unpointed_copy(tmp_path_factory, tmp_path)
    args = trainer_args(root=mix, out=tmp_path / "out", repo=repo + SLOW_LINK, steps=BASELINE_STEPS, push_every=2)
    killed: list[int] = []

    def kill_rank_1(line: str) -> None:
        if line.startswith("lease: ") and " holds " in line and not killed:
            rank0 = int(line.split()[1].split(":")[1])
            siblings = psutil.Process(rank0).parent().children()
            rank1 = [p.pid for p in siblings if p.pid != rank0 and p.environ().get("RANK") == "1"]
            assert len(rank1) == 1, rank1
            os.kill(rank1[0], signal.SIGKILL)
            killed.append(rank1[0])

    run = run_trainer(torchrun_cmd(args), on_line=kill_rank_1, timeout=120)
    assert killed, explain(run)
    assert rank_exit_codes(run) == {0: -signal.SIGTERM, 1: -signal.SIGKILL}, explain(run)
    assert "terminated: SIGTERM stopped the session (rank 0); ending by SIGTERM" in run.lines, explain(run)
    assert not run.starting("latest.json -> "), explain(run)
    assert_released_once(run, repo + SLOW_LINK)


def test_a_release_the_hub_refuses_is_said_once(tmp_path, tmp_path_factory, hub_server):
    """A refused resume on the Hub whose release commit gets a 401: said once (the refusal path and the failed
    start both end the session), and the refusal keeps its exit code."""
    base = baseline(tmp_path_factory)
    env = {**hub_server.env(), "SPECPROBE_HUB_RETRIES": "2", "SPECPROBE_HUB_BACKOFF_S": "0.05"}

    def train(steps: int):
        args = trainer_args(
            root=base.mix, out=tmp_path / f"out{steps}", repo="hf://tester/ckpt", steps=steps, push_every=2, nproc=1
        )
        return run_trainer(single_cmd(args), env=env, timeout=120)

    done = train(2)
    assert done.rc == 0, explain(done)
    # The next session's commits: its lease (1st), then its release (2nd), refused with a 401.
    hub_server.inject("status", r"/commit/", method="POST", nth=2, times=100, status=401)
    run = train(4)
    assert run.rc == 3 and "is terminal" in run.starting("refused: ")[0], explain(run)
    failed = [line for line in run.lines if "release FAILED" in line]
    assert len(failed) == 1 and "401" in failed[0] and "the next writer waits until it expires" in failed[0], failed
