"""`engine run SPEC --run-dir DIR --from STEP`: a run that starts at STEP and keeps the evidence of
the steps before it from the run already in DIR, while the spec still defines them as they ran.

A resumed run is the same run: the earlier run's mode, overrides and builtins (run id, run dir: the
store a later leg resumes from is named after them), with the user's own `--set` over them. It is
refused, before anything moves, for another spec's run, a directory without a run, an unknown
step, an earlier step whose definition changed (the saved fingerprints say so, `step_changes` says
how), failed or never ran, for a STEP that a `remove` step prepares (resume at the wipe: the
failed attempt left its files where the wipe would have removed them), and for a value the run was
given that its evidence keeps only masked (a secret) and this run does not give again. The reused
legs are re-harvested from their logs with the spec's output rules of now, as `engine replay`
does. What the steps from STEP on snapshot (`snapshot:`) is put back as they found it
(`snapshot_restores` refuses a copy that is missing, changed or masked before anything moves;
`restore_snapshots` puts them back). The earlier run's evidence and the logs of the steps that run
again are set aside in `previous-<stamp>/`, all or none (`SetAside`, which the caller undoes when
the run stored nothing of its own), so nothing in the run dir describes a step that did not run
this time; the reused steps' logs stay where they are. The caller holds the run dir
(engine/run/record.py prepare_run_dir) before any of this.
"""

from __future__ import annotations

import copy
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.judge.recheck import Refused, reharvest_steps, spec_mismatch, step_changes
from engine.judge.verdict import derive_statuses
from engine.run import evidence, snapshot
from engine.secrets import REDACTED
from engine.spec.load import Spec
from engine.spec.plan import Plan, replan

# What an earlier step may have ended as to be reused: anything else cannot stand for a pass.
REUSABLE = ("ok", "skipped")


@dataclass
class Resumed:
    plan: Plan
    reuse: evidence.Reuse
    saved: dict[str, Any]  # the earlier run's evidence, as it was before anything was set aside
    notes: list[str] = field(default_factory=list)  # what the caller says before the run


def plan_resume(
    spec: Spec,
    run_dir: Path,
    from_step: str,
    *,
    sets: Sequence[str] = (),
    mode: str | None = None,
    spec_label: str = "",
) -> Resumed:
    """The plan of a run resumed at `from_step` in `run_dir` and the steps it reuses; Refused (why,
    each changed step named) when the earlier run cannot vouch for the steps before it."""
    flag = f"--from {from_step}"
    try:
        saved = evidence.load(run_dir)
    except evidence.EvidenceError as exc:
        raise Refused(f"{flag}: {run_dir} holds no run to resume: {exc}") from None
    mismatch = spec_mismatch(spec, saved, spec_label, run_dir, action="resume")
    if mismatch:
        raise Refused(mismatch)
    if mode is not None and mode != saved.get("mode"):
        raise Refused(f"{flag}: the run in {run_dir} ran in mode {saved.get('mode')!r}, not {mode!r}")
    _same_dir(saved, run_dir, flag)
    plan = replan(spec, saved, sets=sets)
    _refuse_lost_secrets(saved, plan, sets, flag)
    names = [s["name"] for s in plan.steps]
    if from_step not in names:
        raise Refused(f"{flag}: spec {plan.name!r} has no step {from_step!r}; its steps: {', '.join(names)}")
    earlier = names[: names.index(from_step)]
    _refuse_changed(saved, plan, from_step, earlier, flag)
    _refuse_unfinished(saved, plan, earlier, flag)
    _refuse_a_wipe_before(plan, from_step, flag)
    state = saved.get("state") or {}
    records = {n: copy.deepcopy(saved["steps"][n]) for n in earlier}
    notes = _reharvest(records, plan, run_dir, flag)
    reuse = evidence.Reuse(
        from_step=from_step,
        run_started_at=saved.get("started_at") if isinstance(saved.get("started_at"), str) else None,
        records=records,
        state={n: state[n] for n in earlier if n in state},
    )
    return Resumed(plan, reuse, saved, notes)


def _refuse_lost_secrets(saved: Mapping[str, Any], plan: Plan, sets: Sequence[str], flag: str) -> None:
    """A value the run was given (`--set`, or the environment) that its evidence keeps only masked
    (a secret, or a URL's password) would reach the later legs as the text `<redacted>`: refused,
    naming each, unless this run gives it again."""
    given = {s.partition("=")[0].strip() for s in sets}
    values: Mapping[str, Any] = saved.get("values") or {}
    env_of = {name: var for var, name in (plan.spec.data.get("env") or {}).items()}
    lost = []
    for name, source in (saved.get("sources") or {}).items():
        if source not in ("--set", "env") or name in given or name not in values:
            continue
        # The plan has the masked text back unless the environment gave the value again.
        if REDACTED in evidence.dumps(plan.values.get(name), indent=None):
            again = f"export {env_of[name]}" if source == "env" and name in env_of else f"--set {name}=..."
            lost.append(f"{name} (given by {source}; give it again: {again})")
    if lost:
        raise Refused(
            f"refusing {flag}: the run was given values its evidence keeps only masked (a secret is never "
            f"stored), and the later steps would get the text {REDACTED!r} instead: " + "; ".join(lost)
        )


def _reharvest(records: dict[str, Any], plan: Plan, run_dir: Path, flag: str) -> list[str]:
    """Each reused leg's harvest re-derived from its log with the spec's CURRENT output rules (as
    `engine replay` does), in place: a changed rule or an edited evidence.json cannot carry a
    harvest its log does not give. Refused when a log cannot be read; one note per leg whose
    harvest differs from what the evidence said."""
    legs = {n: r for n, r in records.items() if isinstance(r, dict) and r.get("kind") == "run" and r.get("log")}
    for name, record in legs.items():
        if not os.path.lexists(run_dir / str(record["log"])):
            raise Refused(
                f"refusing {flag}: the log of {name} ({record['log']}) is gone, and a reused step is "
                f"re-harvested from it; resume at {name} (--from {name}) or earlier"
            )
    before = {n: copy.deepcopy(r.get("harvest")) for n, r in legs.items()}
    try:
        reharvest_steps({"steps": legs}, plan, run_dir)
    except evidence.EvidenceError as exc:
        raise Refused(f"refusing {flag}: {exc}; resume at the step whose log it is, or earlier") from None
    return [
        f"{n}: re-harvested from {r['log']} with the current output rules; the saved evidence said otherwise"
        for n, r in legs.items()
        if r.get("harvest") != before[n]
    ]


def _same_dir(saved: Mapping[str, Any], run_dir: Path, flag: str) -> None:
    """The run's paths (its legs' files, the builtin `run_dir` in every step) are those of the
    directory it ran in; a copy elsewhere would run the later legs against the old one."""
    ran_in = (saved.get("values") or {}).get("run_dir")
    if isinstance(ran_in, str) and os.path.realpath(ran_in) != os.path.realpath(run_dir):
        raise Refused(f"{flag}: the run in {run_dir} was made in {ran_in}; resume it there")


def _refuse_changed(saved: Mapping[str, Any], plan: Plan, from_step: str, earlier: list[str], flag: str) -> None:
    ran = list(saved.get("steps") or {})
    ran_before = ran[: ran.index(from_step)] if from_step in ran else ran
    problems = []
    if ran_before != earlier:
        problems.append(
            f"the steps before {from_step} were {', '.join(ran_before) or 'none'} in that run, "
            f"and are {', '.join(earlier) or 'none'} now"
        )
    changes, _ = step_changes(saved, plan)
    changed = [c for c in changes if _step_named(c) in earlier]
    if problems or changed:
        first = min((earlier.index(_step_named(c)) for c in changed), default=0)
        target = earlier[first] if earlier else from_step
        raise Refused(
            f"refusing {flag}: steps before it changed since the run, so its evidence of them no longer "
            f"describes the spec; resume at {target} (--from {target}) or run it whole.\n"
            + "\n".join(problems + changed)
        )


def _step_named(change: str) -> str:
    """The step a `step_changes` line is about (`step leg1: definition changed (...)`)."""
    return change.split(":", 1)[0].removeprefix("step ")


def _refuse_unfinished(saved: Mapping[str, Any], plan: Plan, earlier: list[str], flag: str) -> None:
    doc, _ = derive_statuses(plan.steps, saved)  # from the exit codes, not the stored strings
    bad = [(n, (doc["steps"].get(n) or {}).get("status", "absent")) for n in earlier]
    bad = [(n, status) for n, status in bad if status not in REUSABLE]
    if bad:
        shown = ", ".join(f"{n} ({status})" for n, status in bad)
        raise Refused(
            f"refusing {flag}: {shown} did not finish well in that run, and a reused step must have; "
            f"resume at {bad[0][0]} (--from {bad[0][0]}) or earlier"
        )


def _refuse_a_wipe_before(plan: Plan, from_step: str, flag: str) -> None:
    """A `remove` step after the last reused leg prepares what comes next: the failed attempt wrote
    there since, so reusing the wipe would hand the step a warm disk instead of a cold one."""
    steps = plan.steps[: [s["name"] for s in plan.steps].index(from_step)]
    last_leg = max((i for i, s in enumerate(steps) if s["kind"] == "run"), default=-1)
    wipes = [s for s in steps[last_leg + 1 :] if s["kind"] == "remove" and s.get("enabled", True)]
    if wipes:
        first = wipes[0]["name"]
        raise Refused(
            f"refusing {flag}: the remove step {first} ({', '.join(map(str, wipes[0]['remove']))}) "
            f"prepares it after the last reused leg, and what the failed attempt wrote there since "
            f"would stay; resume at the wipe: --from {first}"
        )


@dataclass
class SetAside:
    """The earlier run's files moved into `folder` (relative to the run dir) by `set_aside`."""

    run_dir: Path
    folder: str
    moved: list[str]  # relative to the run dir, in the order they were moved

    def undo(self) -> list[str]:
        """Every moved file back where it was, and the folder removed; one line per file that could
        not go back (a file of the same name there now), naming where it is."""
        left = []
        dest = self.run_dir / self.folder
        for rel in reversed(self.moved):
            home = self.run_dir / rel
            try:
                if os.path.lexists(home):
                    raise FileExistsError(f"{home} exists")
                os.replace(dest / rel, home)
            except OSError as exc:
                left.append(f"{rel} stays in {self.folder}/ ({getattr(exc, 'strerror', None) or exc})")
        for folder in sorted((p for p in dest.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)) + [dest]:
            try:
                folder.rmdir()
            except OSError:
                pass
        return left


def set_aside(run_dir: Path, resumed: Resumed) -> SetAside | None:
    """Move the earlier run's evidence (and its re-check records) and the logs of the steps that
    run again into `previous-<stamp>/`: all of them, or, when one cannot move (a full disk), none
    (Refused, saying so). None when there was nothing to move."""
    saved = resumed.saved
    stamp = re.sub(r"[^0-9A-Za-z]", "", str(saved.get("started_at") or ""))[:15] or "run"
    dest, n = run_dir / f"previous-{stamp}", 1
    while os.path.lexists(dest):
        n += 1
        dest = run_dir / f"previous-{stamp}-{n}"
    rerun = [s["name"] for s in resumed.plan.steps if s["name"] not in resumed.reuse.records]
    records = saved.get("steps") or {}
    moving = [evidence.FILENAME] + sorted(p.name for p in run_dir.glob("check-*.json"))
    moving += sorted(p.name for p in run_dir.glob("replay-*.json"))
    for name in rerun:
        logs = {f"logs/{name}.log", (records.get(name) or {}).get("log")}
        moving += sorted(str(p) for p in logs if isinstance(p, str) and (run_dir / p).is_file())
    aside = SetAside(run_dir, dest.name, [])
    try:
        for rel in dict.fromkeys(moving):
            source = run_dir / rel
            if not source.is_file():
                continue
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            os.replace(source, dest / rel)
            aside.moved.append(rel)
    except OSError as exc:
        left = aside.undo()
        raise Refused(
            f"--run-dir {run_dir}: cannot set the earlier run's files aside in {dest.name}/: "
            f"{exc.strerror or exc}; "
            + ("nothing was moved" if not left else "and these could not be moved back: " + "; ".join(left))
        ) from None
    return aside if aside.moved else None


def snapshot_restores(run_dir: Path, resumed: Resumed) -> list[tuple[str, Mapping[str, Any]]]:
    """What `--from STEP` puts back before it runs: for each path a step from STEP on snapshots, the
    copy taken before the first of those steps that ran in the earlier attempt, as (step, entry).
    Refused, naming it, when that copy is missing, changed since, masked, or was never taken."""
    flag = f"--from {resumed.reuse.from_step}"
    steps = resumed.plan.steps
    start = [s["name"] for s in steps].index(resumed.reuse.from_step)
    records = resumed.saved.get("steps") or {}
    done: set[str] = set()
    out: list[tuple[str, Mapping[str, Any]]] = []
    for step in steps[start:]:
        name, block = step["name"], step.get("snapshot")
        record = records.get(name) if isinstance(records.get(name), Mapping) else {}
        if not block or record.get("status") in (None, "not_run", "skipped") or _stopped_at_snapshot(record):
            continue  # it did not run in that attempt: it changed nothing
        wanted = [os.path.abspath(os.path.expanduser(str(p))) for p in block["paths"]]
        taken = {e.get("path"): e for e in record.get("snapshot") or [] if isinstance(e, Mapping)}
        for path in wanted:
            if path in done:
                continue
            done.add(path)
            entry = taken.get(path)
            if entry is None:
                raise Refused(
                    f"refusing {flag}: {name} ran in that attempt without a snapshot of {path} "
                    f"(it took {', '.join(map(str, taken)) or 'none'}), so what it changed there cannot be "
                    f"put back; run it whole"
                )
            why = snapshot.problem(name, entry, run_dir)
            if why:
                raise Refused(f"refusing {flag}: {why}; run it whole")
            out.append((name, entry))
    return out


def _stopped_at_snapshot(record: Mapping[str, Any]) -> bool:
    """The step failed taking its snapshot: its leg never started."""
    return record.get("rc") is None and str(record.get("error") or "").startswith("snapshot:")


def restore_snapshots(run_dir: Path, restores: list[tuple[str, Mapping[str, Any]]], say: Callable[[str], None]) -> None:
    """Put back what `snapshot_restores` found, saying each (`restored ... from the snapshot taken
    before leg2`); SnapshotError naming the path when one cannot be."""
    for name, entry in restores:
        snapshot.restore(name, [entry], run_dir, say)
