"""End to end on the embedded default: `engine run specs/p4_smoke.yaml` and `engine run specs/p4_preempt.yaml`
as real subprocesses (CPU, 2 gloo ranks under torchrun, tiny model, local file:// store, synthetic mix built
on first use), the way a user runs them. cwd is a scratch directory holding a link to the repo's specs/, so
`runs/` (store, mix, evidence) lands there; the `python` builtin is the venv's interpreter (the engine is
started as the venv's console script with the venv's bin/ first on PATH).

What is asserted is the real run: exit code, the VERDICT line, every check of evidence.json PASS, and the
values the checks are about (leg 1 stopped at 10, leg 2 resumed from 10, checkpoints [10, 20], a terminal
pointer at 20 whose hashes are the bytes in the store), so a check that silently stopped checking anything
would still be caught here.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest
from p4_runs import SharedP4
from processes import kill_tree, start_job

pytestmark = pytest.mark.slow

REPO_ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
ENGINE = VENV_BIN / "engine"
RUN_DIR_LINE = re.compile(r"^run dir: (?P<dir>\S+)\s*$", re.M)
SECTION = re.compile(r"^=== (?P<step>\S+)\s*$")


# --------------------------------------------------------------------------------------------- helpers


def engine_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The caller's environment with the venv first on PATH, unbuffered output and no stray settings that would
    change what the specs resolve to (a mode, a target, a store, a repo, a token)."""
    env = dict(os.environ)
    for name in ("P4_PROBE_MODE", "P4_PROBE_REPO", "SPECPROBE_TARGET", "SPECPROBE_STORE", "HF_TOKEN", "HF_ENDPOINT"):
        env.pop(name, None)
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONUNBUFFERED"] = "1"
    env["OMP_NUM_THREADS"] = "1"
    env.update(extra or {})
    return env


def workdir_with_specs(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    link = path / "specs"
    if not link.exists():
        link.symlink_to(REPO_ROOT / "specs", target_is_directory=True)
    return path


@dataclass
class EngineRun:
    rc: int
    stdout: str
    stderr: str
    seconds: float
    run_dir: Path
    evidence: dict
    # label -> {pid: cmdline} of the processes naming the run dir, seen at a step header (label = the step)
    # or at the first line matching a probe (label = the probe's)
    seen_at: dict[str, dict[int, str]]

    @property
    def verdict_line(self) -> str:
        lines = [ln for ln in self.stdout.splitlines() if ln.startswith("VERDICT ")]
        assert lines, (
            f"no VERDICT line; rc={self.rc}\nstdout tail:\n{self.stdout[-3000:]}\nstderr:\n{self.stderr[-3000:]}"
        )
        return lines[-1]

    def checks(self) -> dict[str, dict]:
        return {c["name"]: c for c in self.evidence["checks"]}

    def run_json(self, step: str) -> dict:
        rj = self.evidence["steps"][step]["harvest"].get("run_json")
        assert isinstance(rj, dict), f"{step} has no RUN_JSON: {self.evidence['steps'][step]}"
        return rj

    def explain(self) -> str:
        return (
            f"rc={self.rc} after {self.seconds:.1f}s\nstdout tail:\n{self.stdout[-4000:]}\n"
            f"stderr tail:\n{self.stderr[-2000:]}"
        )


def processes_naming(text: str) -> dict[int, str]:
    """pid -> command line of every running process whose command line holds `text` (a run's own directory:
    nothing of another test or another user names it)."""
    found: dict[int, str] = {}
    for proc in psutil.process_iter(["cmdline", "status"]):
        cmd = " ".join(proc.info["cmdline"] or ())
        if proc.pid != os.getpid() and proc.info["status"] != psutil.STATUS_ZOMBIE and text in cmd:
            found[proc.pid] = cmd
    return found


def run_engine(
    cwd: Path,
    spec: str,
    *sets: str,
    env: dict[str, str] | None = None,
    timeout: float = 400,
    watch: bool = False,
    probes: dict[str, str] | None = None,
    options: tuple[str, ...] = (),
) -> EngineRun:
    """`engine run SPEC --set ... OPTIONS` in `cwd`; stdout streamed. With `watch`, at each step header the live
    processes whose command line names the run dir are recorded (who is still running between legs), and
    also at the first stdout line matching each of `probes` (label -> regex), recorded under its label."""
    argv = [str(ENGINE), "run", spec]
    for s in sets:
        argv += ["--set", s]
    argv += options
    t0 = time.monotonic()
    proc = start_job(argv, cwd=cwd, env=env if env is not None else engine_env(), stderr=subprocess.PIPE)
    out_lines: list[str] = []
    seen_at: dict[str, dict[int, str]] = {}
    run_dir: str | None = None
    stderr_box: list[str] = []
    t = threading.Thread(target=lambda: stderr_box.append(proc.stderr.read()), daemon=True)  # type: ignore[union-attr]
    t.start()
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            out_lines.append(line)
            if run_dir is None:
                m = RUN_DIR_LINE.match(line)
                if m:
                    run_dir = m.group("dir")
            m = SECTION.match(line)
            if watch and m and run_dir is not None:
                seen_at[m.group("step")] = processes_naming(run_dir)
            for label, rx in (probes or {}).items():
                if label not in seen_at and run_dir is not None and re.search(rx, line):
                    seen_at[label] = processes_naming(run_dir)
            if time.monotonic() - t0 > timeout:
                raise TimeoutError(f"engine ran past {timeout}s:\n" + "".join(out_lines[-60:]))
        rc = proc.wait(timeout=max(1.0, timeout - (time.monotonic() - t0)))
    except BaseException:
        kill_tree(proc.pid)  # the engine's group and every descendant (torchrun ranks have their own)
        proc.wait()
        raise
    t.join(timeout=10)
    seconds = time.monotonic() - t0
    stdout = "".join(out_lines)
    assert run_dir is not None, f"engine printed no run dir (rc={rc}):\n{stdout[-3000:]}\n{''.join(stderr_box)[-3000:]}"
    evidence_path = Path(run_dir) / "evidence.json"
    assert evidence_path.is_file(), f"no evidence.json in {run_dir} (rc={rc}):\n{stdout[-3000:]}"
    evidence = json.loads(evidence_path.read_text())
    return EngineRun(
        rc=rc,
        stdout=stdout,
        stderr="".join(stderr_box),
        seconds=seconds,
        run_dir=Path(run_dir),
        evidence=evidence,
        seen_at=seen_at,
    )


def assert_every_check_passed(run: EngineRun, spec_name: str, min_checks: int) -> None:
    assert run.rc == 0, run.explain()
    assert re.fullmatch(rf"VERDICT {spec_name} PASS \[\] seconds [0-9.]+", run.verdict_line), run.verdict_line
    ev = run.evidence
    assert ev["verdict"]["outcome"] == "PASS" and ev["verdict"]["exit_code"] == 0, ev["verdict"]
    assert ev["verdict"]["failed"] == []
    assert len(ev["checks"]) >= min_checks, [c["name"] for c in ev["checks"]]
    bad = {
        c["name"]: (c["outcome"], c.get("value"), c.get("missing"))
        for c in ev["checks"]
        if c["outcome"] != "PASS" or c.get("value") is not True
    }
    assert not bad, bad
    for name, step in ev["steps"].items():
        assert step["status"] in ("ok", "skipped"), (name, step)


def store_bytes_sha(repo_url: str, path: str) -> str:
    """The sha256 of the bytes the store holds for `path` (a re-read, not the recorded metadata)."""
    from trainer.store.url import open_store

    return hashlib.sha256(open_store(repo_url).read_bytes(path)).hexdigest()


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One scratch work dir for the module: the synthetic mix is built by the first run and reused after."""
    return workdir_with_specs(tmp_path_factory.mktemp("e2e_local"))


# ----------------------------------------------------------------------------------------------- tests


def test_p4_smoke_passes_end_to_end_with_real_values(workdir: Path, p4_shared: SharedP4) -> None:
    run = run_engine(workdir, "specs/p4_smoke.yaml", *p4_shared.sets("p4_smoke"))
    assert_every_check_passed(run, "p4_smoke", min_checks=32)
    ev = run.evidence
    # Everything this run wrote is under the scratch dir, nothing in the checkout.
    assert run.run_dir.parent == workdir / "runs" and run.run_dir.name.startswith("p4_smoke-smoke-")
    assert Path(ev["values"]["python"]).parent == VENV_BIN, ev["values"]["python"]
    assert ev["values"]["work_dir"] == str(workdir)
    repo = ev["values"]["repo"]
    assert repo.startswith(f"file://{workdir}/runs/store/probe/ckpt-"), repo

    leg1, leg2 = run.run_json("leg1"), run.run_json("leg2")
    assert leg1["final_step"] == 10 and leg1["segment_stop"] is True
    assert leg1["resumed_from_step"] is None and leg1["first_step"] == 1
    assert leg1["push_steps"] == [10] and leg1["val_skipped"] is True and leg1["val_ppl"] is None
    assert leg1["tokens_consumed"] == 10 * 512 and leg1["params"] == 119104 and leg1["world_size"] == 2
    assert sorted(map(int, leg1["losses"])) == list(range(1, 11))
    assert leg2["resumed_from_step"] == 10 and leg2["first_step"] == 11
    assert leg2["final_step"] == 20 and leg2["segment_stop"] is False
    assert sorted(map(int, leg2["losses"])) == list(range(11, 21))
    assert leg2["tokens_consumed"] == 20 * 512 and leg2["push_steps"] == [20]
    assert leg2["val_skipped"] is False and leg2["val_error"] is None and leg2["val_ppl"] > 1.0
    assert leg2["final_loss"] < leg1["losses"]["1"] * 0.8

    after1, after2 = ev["state"]["hub_after_leg1"], ev["state"]["hub_after_leg2"]
    assert after1["exists"] is True and after1["error"] is None
    assert after1["checkpoints"] == [10] and after1["has_final"] is False
    assert after1["pointer"]["step"] == 10 and after1["pointer"]["path_in_repo"] == "ckpt/checkpoint-10"
    assert after1["pointer"]["terminal"] is False
    assert after2["checkpoints"] == [10, 20] and after2["has_final"] is True
    p2 = after2["pointer"]
    assert p2["step"] == 20 and p2["path_in_repo"] == "final" and p2["terminal"] is True
    assert set(p2["files"]) == {"config.json", "model.safetensors", "optimizer.pt", "rng.pt", "trainer_state.json"}
    assert p2["files"] == after2["pointer_target_sha256"]
    # The pointer's hash is the bytes really in the store, read back here independently of the collector.
    assert store_bytes_sha(repo, "final/model.safetensors") == p2["files"]["model.safetensors"]
    # Pruning kept the weights of every checkpoint and dropped older optimizer state.
    assert "ckpt/checkpoint-10/model.safetensors" in after2["files"]
    assert "ckpt/checkpoint-10/optimizer.pt" not in after2["files"]

    # Leg 2 really was a cold resume from the store (leg 1's run directory had been wiped).
    assert ev["steps"]["wipe_before_leg2"]["status"] == "ok"
    leg2_log = (run.run_dir / ev["steps"]["leg2"]["log"]).read_text()
    assert "auto-resume: pointer step=10 path=ckpt/checkpoint-10" in leg2_log
    leg1_log = (run.run_dir / ev["steps"]["leg1"]["log"]).read_text()
    assert "auto-resume: repo missing" in leg1_log and "segment boundary at step 10" in leg1_log


def test_p4_preempt_kills_leg1_mid_push_and_leg2_loses_nothing(workdir: Path, p4_shared: SharedP4) -> None:
    run = run_engine(
        workdir,
        "specs/p4_preempt.yaml",
        *p4_shared.sets("p4_preempt"),
        watch=True,
        probes={"leg1_training": r"KEY> CKPT save step=10 "},
    )
    assert_every_check_passed(run, "p4_preempt", min_checks=23)
    ev = run.evidence
    run_dir = str(run.run_dir)

    leg1 = ev["steps"]["leg1"]
    assert leg1["terminated_by"] == "signal_rule" and leg1["rc"] in (-9, 137), leg1
    assert [s["signal"] for s in leg1["signals_sent"]] == ["SIGKILL"]
    log1 = (run.run_dir / leg1["log"]).read_text().splitlines()
    kill_line = log1[leg1["signals_sent"][0]["line"] - 1]
    assert re.search(r"CKPT push step=20 ", kill_line), kill_line
    text1 = "\n".join(log1)
    # Killed inside the push: the push of 20 never finished, the pointer never moved to 20, no RUN_JSON.
    assert "CKPT pushed step=20" not in text1 and "latest.json -> step=20" not in text1, text1[-2000:]
    assert "RUN_JSON" not in text1 and "TRAIN DONE" not in text1

    # No process of leg 1 outlived it: when the engine moved on to the next step, nothing that names this run's
    # directory was alive (torchrun's ranks sit in their own sessions; a group kill alone would miss them).
    # The scan does see a running leg: torchrun and both ranks, while leg 1 saves its first checkpoint.
    assert len(run.seen_at.get("leg1_training", {})) >= 3, run.seen_at.get("leg1_training")
    assert any(
        "trainer.train" in c and "torch.distributed.run" not in c for c in run.seen_at["leg1_training"].values()
    ), run.seen_at["leg1_training"]
    assert "hub_after_leg1" in run.seen_at, sorted(run.seen_at)
    assert run.seen_at["hub_after_leg1"] == {}, run.seen_at["hub_after_leg1"]
    # By the time the test reads the wipe's header the engine may be starting leg 2 (the wipe takes no time):
    # there, only leg 1's processes count (it resumes `auto`, leg 2 `must`).
    later = run.seen_at.get("wipe_before_leg2")
    assert later is not None and [c for c in later.values() if "--resume auto" in c] == [], later

    after1, after2 = ev["state"]["hub_after_leg1"], ev["state"]["hub_after_leg2"]
    # The pointer never named the checkpoint whose push was killed.
    assert after1["pointer"]["step"] == 10 and after1["pointer"]["path_in_repo"] == "ckpt/checkpoint-10"
    assert after1["pointer"]["terminal"] is False and after1["has_final"] is False
    assert after1["pointer"]["files"] == after1["pointer_target_sha256"]
    leg2 = run.run_json("leg2")
    assert leg2["resumed_from_step"] == 10 and leg2["first_step"] == 11 and leg2["final_step"] == 30
    assert sorted(map(int, leg2["losses"])) == list(range(11, 31))
    assert leg2["push_steps"] == [20, 30] and leg2["tokens_consumed"] == 30 * 512
    assert after2["checkpoints"] == [10, 20, 30] and after2["has_final"] is True
    assert after2["pointer"]["step"] == 30 and after2["pointer"]["terminal"] is True
    assert (
        store_bytes_sha(ev["values"]["repo"], "final/model.safetensors")
        == after2["pointer"]["files"]["model.safetensors"]
    )

    # And nothing of either leg is left running now that the engine has exited.
    left = processes_naming(run_dir)
    assert left == {}, left


@pytest.fixture(scope="module")
def failed_then_resumed(workdir: Path, p4_shared: SharedP4) -> tuple[EngineRun, bytes, EngineRun]:
    """The smoke whose leg 2 failed (an outage: one second, and it times out), then the same run resumed at
    the wipe before leg 2: (the failed run, its leg 1 log as it was, the resumed run)."""
    first = run_engine(workdir, "specs/p4_smoke.yaml", "t_leg2=1", *p4_shared.sets("p4_smoke"))
    assert first.rc == 5 and first.evidence["steps"]["leg2"]["timed_out"] is True, first.explain()
    leg1_log = (first.run_dir / "logs" / "leg1.log").read_bytes()
    resumed = run_engine(
        workdir,
        "specs/p4_smoke.yaml",
        "t_leg2=900",
        *p4_shared.sets("p4_smoke"),
        options=("--run-dir", str(first.run_dir), "--from", "wipe_before_leg2"),
    )
    return first, leg1_log, resumed


def test_a_failed_leg2_is_resumed_at_its_wipe_without_rerunning_leg1(
    failed_then_resumed: tuple[EngineRun, bytes, EngineRun],
) -> None:
    first, leg1_log, resumed = failed_then_resumed
    assert_every_check_passed(resumed, "p4_smoke", min_checks=32)
    ev = resumed.evidence
    reused = ["preflight", "fetch_mix", "wipe_before_leg1", "leg1", "hub_after_leg1"]
    assert [n for n, s in ev["steps"].items() if s.get("reused")] == reused
    assert {ev["steps"][n]["reused_from"] for n in reused} == {first.evidence["started_at"]}
    assert ev["steps"]["leg1"]["harvest"] == first.evidence["steps"]["leg1"]["harvest"]
    assert (resumed.run_dir / "logs" / "leg1.log").read_bytes() == leg1_log  # leg 1 did not run again
    assert "=== leg1\n" not in resumed.stdout and "=== leg2\n" in resumed.stdout
    # Same run id, same scratch repo: leg 2 resumed from what leg 1 pushed, after the wipe ran again.
    assert ev["values"]["repo"] == first.evidence["values"]["repo"]
    assert ev["steps"]["wipe_before_leg2"]["status"] == "ok" and "reused" not in ev["steps"]["wipe_before_leg2"]
    leg2 = resumed.run_json("leg2")
    assert leg2["resumed_from_step"] == 10 and leg2["first_step"] == 11 and leg2["final_step"] == 20
    # The progress lines: leg 1 counts to its stop (10), not the horizon it prints; the horizon leg
    # announces its validation pass, the phase its progress line names after the last step.
    assert ev["steps"]["leg1"]["progress"]["total"] == 10 and ev["steps"]["leg2"]["progress"]["total"] == 20
    assert "validation start tokens=8192" in (resumed.run_dir / "logs" / "leg2.log").read_text()
    # The run that never stopped was not trained again: its saved evidence was reused, made by an earlier smoke
    # of the session or by the failed attempt itself (whose run dir this is).
    reference = ev["steps"]["reference"]
    assert reference["status"] == "ok" and reference["reference"]["reused_from"] is not None, reference["reference"]
    assert "   reusing reference from " in resumed.stdout and "(same definition)" in resumed.stdout
    assert "making it" not in resumed.stdout and "making a new one" not in resumed.stdout
    assert resumed.run_json("reference")["final_step"] == 20


FIRST_DIFFERENCE = re.compile(r"= false: first difference at step (?P<step>\d+): (?P<a>\S+) vs (?P<b>\S+) \(")


def explain_of(run: EngineRun, check: str) -> str:
    """The report's lines under a check's row: its expression and the values it read."""
    lines = run.stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith(check + " "))
    below = [line for line in lines[at + 1 : at + 40]]
    return "\n".join(below[: next((i for i, line in enumerate(below) if not line.startswith(" ")), len(below))])


# The trainer's own word on this resume is right (step 10, the tokens of 20 steps); only a comparison with the
# run that never stopped sees that leg 2 trained on another learning rate (tiny's lr is 0.01).
CHANGED_LR_SPEC = """\
version: 1
extends: {smoke}
steps:
  - name: leg2
    override: true
    run:
      argv: ["${{torchrun}}", "${{train_args}}", "--resume", "must", "--stop-after-steps", "0",
             "--lr", "0.012", "--allow-config-change", "lr,min_lr"]
"""


def test_a_resume_on_an_allowed_lr_change_reports_the_right_step_but_fails_against_the_reference(
    workdir: Path, p4_shared: SharedP4, failed_then_resumed: tuple[EngineRun, bytes, EngineRun]
) -> None:
    _, _, passed = failed_then_resumed
    spec = workdir / "changed_lr.yaml"
    spec.write_text(CHANGED_LR_SPEC.format(smoke=REPO_ROOT / "specs" / "p4_smoke.yaml"))
    # Leg 2 again (from the wipe before it, which the engine asks for), in the run that passed: the store is
    # put back as leg 2 found it (only checkpoint-10), or it would resume from the final/ the passing leg 2
    # pushed and train nothing.
    run = run_engine(
        workdir,
        str(spec),
        *p4_shared.sets("p4_smoke"),
        options=("--run-dir", str(passed.run_dir), "--from", "wipe_before_leg2"),
    )
    assert run.rc == 5, run.explain()
    repo_dir = passed.evidence["values"]["repo"].removeprefix("file://")
    assert f"restored {repo_dir} from the snapshot taken before leg2" in run.stdout, run.stdout[:3000]
    leg2 = run.run_json("leg2")
    assert [(c["field"], c["old"], c["new"]) for c in leg2["config_changes"] if c["field"] == "lr"] == [
        ("lr", 0.01, 0.012)
    ]
    assert leg2["resumed_from_step"] == 10 and leg2["first_step"] == 11 and leg2["final_step"] == 20
    checks = run.checks()
    for trusted in ("next_leg_resumed_from_exactly_the_stop[leg=leg1]", "horizon_tokens_match_the_arithmetic"):
        assert checks[trusted]["outcome"] == "PASS", checks[trusted]
    # Against the reference: the lr leaves it at step 11, the first step leg 2 trained; the loss at step 12,
    # the first computed on weights that step 11's update moved; the weights at the horizon differ.
    failed = set(run.evidence["verdict"]["failed"])
    assert {
        "lrs_match_the_reference[leg=leg2]",
        "losses_match_the_reference[leg=leg2]",
        "final_checkpoint_matches_the_reference",
    } <= failed, failed
    assert "losses_match_the_reference[leg=leg1]" not in failed and "lrs_match_the_reference[leg=leg1]" not in failed
    # The data is not what changed: every step trained the reference's tokens; the horizon's validation,
    # of other weights over the same windows, leaves the reference's loss.
    assert checks["batches_match_the_reference[leg=leg2]"]["outcome"] == "PASS", checks
    assert "validation_matches_the_reference" in failed, failed
    reference = run.run_json("reference")
    for check, step, series in (
        ("lrs_match_the_reference[leg=leg2]", "11", "lrs"),
        ("losses_match_the_reference[leg=leg2]", "12", "losses"),
    ):
        said = FIRST_DIFFERENCE.search(explain_of(run, check))
        assert said is not None, explain_of(run, check)
        assert said["step"] == step, said.group(0)
        assert float(said["a"]) == pytest.approx(leg2[series][step], rel=1e-4), said.group(0)
        assert float(said["b"]) == pytest.approx(reference[series][step], rel=1e-4), said.group(0)
        assert leg2[series][step] != reference[series][step]
    assert leg2["losses"]["11"] == reference["losses"]["11"]
    compared = run.evidence["state"]["leg2_vs_reference"]
    assert compared["error"] is None and compared["first_not_close"]["group"] == "model", compared["first_not_close"]
