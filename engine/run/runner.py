"""Executes a Plan step by step (run / remove / collect), writing the evidence after every step.
It knows nothing of checks: the caller judges the evidence it leaves and stores the verdict through
the same record (engine/judge/verdict.py `store_verdict`).

The runner decides order and consequences (precondition, stop_on_failure, Ctrl-C); process.py
runs commands, output.py interprets their lines, collectors.py reads state, remove.py removes,
diagnostics.py lists a failed leg's files, signals.py handles Ctrl-C. What the run says, stores and
logs leaves through its Record (record.py), which masks it: the runner hands it raw text and
documents, and never sees a secret filter.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TextIO

from engine import defaults, version
from engine.run import collectors, evidence, snapshot
from engine.run.console import Console, ProgressDisplay
from engine.run.diagnostics import collect_diagnostics, report_lines
from engine.run.output import Capture, compile_rules, harvest_problems
from engine.run.process import HOLD_ENV, Interrupted, ProcessResult, compile_signal_rules, hold_points, run_command
from engine.run.record import Record, RecordError
from engine.run.reference import ReferenceError, References
from engine.run.remove import remove_step
from engine.run.said import exit_text
from engine.run.signals import StopSignals
from engine.text import utc_second


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM stopped the run; `doc` is its evidence, stored and marked interrupted."""

    def __init__(self, doc: dict[str, Any]) -> None:
        super().__init__("interrupted")
        self.doc = doc


def _precondition(body: Any) -> str | None:
    return body.get("precondition") if isinstance(body, Mapping) else None


def _stops_on_failure(body: Any) -> bool:
    return bool(body.get("stop_on_failure")) if isinstance(body, Mapping) else False


def _env_text(value: Any) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value)


class Runner:
    """One run of a plan, from its first step to its stored evidence. `console` shows a leg's key lines
    and progress (text its leg log masked already); everything else leaves through `record`."""

    def __init__(
        self,
        plan: evidence.PlanLike,
        record: Record,
        console: Console,
        reuse: evidence.Reuse | None = None,
        fresh_reference: bool = False,
    ) -> None:
        self.plan, self.record, self.console = plan, record, console
        self.t0 = time.monotonic()
        self.doc = evidence.new_document(plan, record.run_dir, version())
        self.references = References(record.run_dir, self.doc["started_at"], record.mask, self.say, fresh_reference)
        for step in plan.steps:
            self.doc["steps"][step["name"]] = {"kind": step["kind"], "status": "not_run"}
        if reuse is not None:
            evidence.carry_over(self.doc, reuse)
        # What each kind of step does: it fills the step's record and returns its exit code.
        self.kinds: dict[str, Callable[[Mapping[str, Any], dict[str, Any]], int | None]] = {
            "run": self._run,
            "remove": self._remove,
            "collect": self._collect,
        }

    def save(self) -> None:
        self.doc["finished_at"] = evidence.now_iso()
        self.doc["seconds"] = round(time.monotonic() - self.t0, 3)
        self.record.save(self.doc)

    def say(self, text: str) -> None:
        self.record.say(text)

    def execute(self, stops: StopSignals | None = None) -> dict[str, Any]:
        """Every step, then the end of the run stored; the evidence as the runner holds it (unmasked:
        what a judge reads). RunInterrupted once a Ctrl-C's evidence is stored."""
        stops = stops or StopSignals()  # unentered: arm/disarm only (a caller handles signals)
        current: str | None = None
        try:
            self.save()
            stops.arm()
            for step in self.plan.steps:
                current = step["name"]
                if not self.run_step(step):
                    break
            current = None
            stops.disarm()
        except KeyboardInterrupt:
            stops.disarm()
            if current is not None:
                self.doc["steps"][current]["status"] = "interrupted"
            self.doc["interrupted"] = True
            self.say(f"INTERRUPTED during {current or 'the run'}; later steps not run")
            self._finish()
            raise RunInterrupted(self.doc) from None
        except RecordError as exc:
            stops.disarm()
            self.record.failed(self.doc, exc, current)
        self._finish()
        return self.doc

    def _finish(self) -> None:
        """Store the end of the run: the files the legs left masked, the clock stopped (a verdict's
        seconds are the run's, not the judging's). A write that fails makes the verdict ERROR;
        evidence.json keeps the last version that could be written."""
        self.record.finish(self.doc)
        try:
            self.save()
        except RecordError as exc:
            if "record_error" not in self.doc:
                self.record.failed(self.doc, exc, None)
        self.references.close()
        self.record.close()

    def run_step(self, step: Mapping[str, Any]) -> bool:
        """Run one step, record it, write the evidence; False when nothing later may run."""
        name, kind = step["name"], step["kind"]
        record = self.doc["steps"][name]
        if record.get("reused"):  # `--from` a later step: this one's evidence is the earlier run's
            self.say(
                f"=== {name}: reused ({record.get('status')}) from the run of {utc_second(record.get('reused_from'))}"
            )
            self._carried_reference(step, record)
            return True
        self.say(f"=== {name}")
        if not step.get("enabled", True):
            record["status"] = "skipped"
            self.say(f"{name} skipped (when: {step.get('when')})")
            self.save()
            return True
        started = time.monotonic()
        try:
            reused = self._reference_before(step, record)
            if reused is False:
                rc = self.kinds[kind](step, record)
                self._reference_after(step, record)
            else:  # reused (its record is the run's that made it), or its directory refused
                rc = record.get("rc", 0 if record.get("status") == "ok" else 1)
        finally:
            record.setdefault("seconds", round(time.monotonic() - started, 3))
            self.record.after_step(step, record, started)
        self.say(f"{name}_RC {rc} seconds {time.monotonic() - started:.1f} elapsed {time.monotonic() - self.t0:.0f}")
        go_on = True
        if record["status"] == "failed":
            message = _precondition(step.get(kind))
            if message:
                self.doc["precondition_failed"] = {"step": name, "message": message}
                self.say(f"PRECONDITION FAILED ({name}): {message}")
                go_on = False
            elif _stops_on_failure(step.get(kind)):
                self.doc["stopped"] = {"step": name, "reason": "stop_on_failure"}
                self.say(f"STOPPING: {name} failed and has stop_on_failure")
                go_on = False
        self.save()
        return go_on

    def _run(self, step: Mapping[str, Any], record: dict[str, Any]) -> int | None:
        name, run = step["name"], step["run"]
        try:
            rules = compile_rules(run)
            signal_rules = compile_signal_rules(run.get("signals"))
        except (ValueError, KeyError) as exc:
            # validate.py should have caught it; still, say where instead of a traceback.
            message = f"{step.get('file')}:{step.get('line')}: step {name}: {exc}"
            record.update({"status": "failed", "error": message, "rc": None})
            self.say(f"   {message}")
            return None
        capture = Capture(rules, self.console)
        display = ProgressDisplay(
            name,
            capture.progress,
            rules.progress.every_s if rules.progress else None,
            self.console,
            run.get("timeout_s"),
        )
        log_rel = f"logs/{_safe_name(name)}.log"
        record.update(
            log=log_rel, harvest={}, harvest_errors=[], failure_lines=[], diagnostics=None, progress=None, error=None
        )
        if step.get("snapshot") and not self._snapshot(step, record):
            return None
        try:
            result = run_command(
                [str(a) for a in run["argv"]],
                env=_leg_env(run),
                cwd=run.get("cwd") or None,
                timeout_s=run.get("timeout_s"),
                grace_s=float(run.get("grace_s", defaults.GRACE_S)),
                log=self.record.leg_log(log_rel),
                on_block=capture.feed,
                on_tick=display.tick,
                signals=signal_rules,
                strip_prefix=rules.strip_prefix,
                notify=lambda text: self.say("   " + text),
            )
        except Interrupted as exc:
            display.close()
            self._record_capture(record, capture, failed=True, warning=display.warning)
            record.update(exc.result.as_dict())
            raise
        except RecordError as exc:
            display.close()
            self._record_capture(record, capture, failed=True)
            record.update({**(exc.result.as_dict() if exc.result is not None else {}), "status": "failed"})
            record["error"] = str(exc)
            raise
        display.close()
        self._judge_leg(step, record, result, capture, display.warning)
        return result.rc

    def _reference_before(self, step: Mapping[str, Any], record: dict[str, Any]) -> bool | None:
        """A step that is (or belongs to) a reference: True when its evidence was reused, None when its
        directory cannot be used (the step failed, saying why), False when it runs."""
        try:
            return self.references.before(step, record, self.doc["state"])
        except (ReferenceError, OSError) as exc:
            record.update({"status": "failed", "error": f"reference: {exc}", "rc": None})
            self.say(f"   {record['error']}")
            return None

    def _reference_after(self, step: Mapping[str, Any], record: dict[str, Any]) -> None:
        try:
            self.references.after(step, record, self.doc["state"])
        except OSError as exc:  # the run's own evidence stands; only later runs lose the reuse
            (record.get("reference") or {})["saved"] = False
            self.say(f"   WARNING: could not save the reference for later runs: {exc}")

    def _carried_reference(self, step: Mapping[str, Any], record: dict[str, Any]) -> None:
        """A reference taken over from the earlier attempt (`--from` a later step) still holds what
        that attempt recorded, or the step fails, saying so."""
        try:
            problem = self.references.carried(step, record)
        except (ReferenceError, OSError) as exc:
            problem = f"reference: {exc}"
        if problem:
            record.update({"status": "failed", "error": problem})
            self.say(f"   {problem}")

    def _snapshot(self, step: Mapping[str, Any], record: dict[str, Any]) -> bool:
        """Copy what the step declares it changes into the run dir before it runs; False (the step
        failed, saying why) when the copy is over its limit or cannot be made."""
        try:
            record["snapshot"] = snapshot.take(
                step["name"], step["snapshot"], self.record.run_dir, self.record.check_copy
            )
        except (snapshot.SnapshotError, OSError) as exc:
            record.update({"status": "failed", "error": f"snapshot: {exc}", "rc": None})
            self.say(f"   SNAPSHOT FAILED: {exc}")
            return False
        for entry in record["snapshot"]:
            if entry["absent"]:
                self.say(f"   snapshot before {step['name']}: {entry['path']} is absent")
                continue
            self.say(
                f"   snapshot before {step['name']}: {entry['path']} ({entry['files']} files, {entry['bytes']:,} bytes) -> {entry['stored']}"
            )
            if entry["masked"]:
                self.say(
                    f"   WARNING: the snapshot of {entry['path']} held a secret, masked in {', '.join(entry['masked'][:5])}: "
                    f"`--from {step['name']}` cannot restore it"
                )
        return True

    def _judge_leg(
        self, step: Mapping[str, Any], record: dict, result: ProcessResult, capture: Capture, warning: dict | None
    ) -> None:
        """What a leg that ran to its end did: ok or failed, recorded and said, diagnostics when failed.
        A line a `fail_on` rule matched fails it whatever its exit code."""
        name, run = step["name"], step["run"]
        # A rule that gave up on a line (a catastrophic regex) leaves the harvest unreliable.
        problems = result.problems + capture.rules.pattern_errors()
        ok = (
            result.rc in run.get("ok_exit_codes", [0])
            and not result.timed_out
            and result.error is None
            and not problems
            and not capture.fail_on_count
        )
        record.update(result.as_dict())
        record["status"] = "ok" if ok else "failed"
        record["error"] = "; ".join(([result.error] if result.error else []) + problems) or None
        self._record_capture(record, capture, failed=not ok, warning=warning)
        for problem in harvest_problems(name, record, (run.get("output") or {}).get("harvest") or {}):
            self.say(
                f"   HARVEST {'FAILED' if problem['fails'] else 'note'} {problem['harvest']} "
                f"({problem['kind']}): {problem['message']}"
            )
        if record["error"]:
            self.say(f"   {record['error']}")
        if result.timed_out:
            self.say(f"   TIMEOUT after {run.get('timeout_s')} s")
        for sent in result.signals_sent:
            self.say(f"   signal rule sent {sent['signal']} (line {sent['line']}, {sent['at_s']:.1f} s)")
        if not ok:
            self._show_failure(name, record, capture)
            diag = (run.get("on_failure") or {}).get("diagnostics")
            if diag:
                record["diagnostics"] = self._diagnostics(diag)

    def _record_capture(
        self, record: dict[str, Any], capture: Capture, failed: bool, warning: dict[str, Any] | None = None
    ) -> None:
        harvest, errors = capture.harvest_result()
        record.update(
            {
                "harvest": harvest,
                "harvest_errors": errors,
                "lines": capture.lines,
                "progress": capture.progress.as_dict(),
            }
        )
        if warning is not None:  # the ETA passed the time left before the timeout
            record["progress_warning"] = warning
        printed = capture.fail_on_result()
        if printed is not None:
            record["fail_on"] = printed
        warned = capture.warn_on_result()
        if warned is not None:
            record["warn_on"] = warned
        if failed:
            record["failure_lines"] = capture.failure_lines()
            record["failure_hits"] = capture.failure_hits
            record["tail"] = capture.tail_lines()
            child = capture.child_exit()
            if child is not None:
                record["child_exit"] = child
            exception = capture.exception_result()
            if exception is not None:
                record["exception"] = exception

    def _show_failure(self, name: str, record: Mapping[str, Any], capture: Capture) -> None:
        said = exit_text(record)
        if said is not None:  # before the launcher's own noise: what the child itself said
            self.say(f"   {name}: {said}")
        shown = capture.failure_lines()
        self.say(f"   FAILURE LINES ({capture.failure_hits} of {capture.lines}):")
        if capture.failure_hits > len(shown):
            self.say(f"   (the last {len(shown)})")
        for line in shown:
            self.say("   ! " + line[:300])
        self.say("   TAIL:")
        for line in capture.tail_lines():
            self.say("   | " + line[:300])

    def _diagnostics(self, diag: Mapping[str, Any]) -> dict[str, Any]:
        report = collect_diagnostics(
            Path(str(diag["dir"])),
            int(diag.get("list_max", defaults.DIAGNOSTICS_LIST_MAX)),
            int(diag.get("max_files", defaults.DIAGNOSTICS_MAX_FILES)),
            int(diag.get("tail_lines", defaults.DIAGNOSTICS_TAIL_LINES)),
            self.record.mask,
        )
        report = self.record.mask(report)
        for line in report_lines(report):
            self.say(line)
        return report

    def _remove(self, step: Mapping[str, Any], record: dict[str, Any]) -> int:
        return remove_step(step, record, self.record.run_dir, self.say, self.plan)

    def _collect(self, step: Mapping[str, Any], record: dict[str, Any]) -> int:
        name, spec = step["name"], step["collect"]
        collector = spec["collector"]
        record.update({"collector": collector, "error": None})
        log_rel = f"logs/{_safe_name(name)}.log"
        run_dir = self.record.run_dir
        context = collectors.context_of(
            name, run_dir, run_dir / log_rel, self.record.mask, lambda: self.record.leg_log(log_rel)
        )
        try:
            state = collectors.collect(collector, spec.get("args") or {}, context, spec.get("timeout_s"))
        except collectors.CollectorError as exc:
            record.update({"status": "failed", "error": str(exc)})
            self.say(f"   COLLECT FAILED: {exc}")
            return 1
        # Masked before it is cut for the console: cut first, a secret across the cut would leave a piece.
        self.doc["state"][name] = self.record.mask(state)
        record["status"] = "ok"
        self.say(f"   state {name}: {json.dumps(self.doc['state'][name], default=str)[:300]}")
        return 0


def _leg_env(run: Mapping[str, Any]) -> dict[str, str]:
    """The variables a leg gets beyond the engine's: its `env`, and the points its rules hold it at."""
    env = {str(k): _env_text(v) for k, v in (run.get("env") or {}).items()}
    points = hold_points(run.get("signals"))
    if points:
        given = [p for p in env.get(HOLD_ENV, "").split(",") if p]
        env[HOLD_ENV] = ",".join(dict.fromkeys(given + points))
    return env


def _safe_name(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name) or "step"


def start(
    plan: evidence.PlanLike,
    run_dir: str | os.PathLike[str],
    out: TextIO = sys.stdout,
    *,
    is_tty: bool | None = None,
    err: TextIO | None = None,
    reuse: evidence.Reuse | None = None,
    fresh_reference: bool = False,
) -> Runner:
    """A run of `plan` in `run_dir`, its record open and nothing run yet. `out`: the console; `err`:
    where warnings go (stderr). `reuse`: the steps taken over from the earlier run in `run_dir`
    (`engine run --from`), which do not run again. `fresh_reference`: make every reference step
    anew, whatever is saved (`engine run --fresh-reference`)."""
    run_path = Path(run_dir)
    (run_path / "logs").mkdir(parents=True, exist_ok=True)
    console = Console(out, is_tty, err)
    return Runner(plan, Record.open(run_path, plan, os.environ, console.line), console, reuse, fresh_reference)


def execute(
    plan: evidence.PlanLike,
    run_dir: str | os.PathLike[str],
    out: TextIO = sys.stdout,
    *,
    is_tty: bool | None = None,
    err: TextIO | None = None,
) -> dict[str, Any]:
    """Run every step of `plan` under the run's own Ctrl-C handlers, writing
    `<run_dir>/evidence.json` after each; the evidence as stored (no checks: `engine run` judges it).
    Ctrl-C (or SIGTERM) raises RunInterrupted, a KeyboardInterrupt carrying the stored document."""
    runner = start(plan, run_dir, out, is_tty=is_tty, err=err)
    with StopSignals() as own:
        try:
            return runner.record.mask(runner.execute(own))
        except RunInterrupted as exc:
            raise RunInterrupted(runner.record.mask(exc.doc)) from None
