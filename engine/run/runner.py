"""Executes a Plan step by step (run / remove / collect), writing the evidence after every step
and, at the end, the checks and verdict it is given: during a run it is evidence.json's only writer.

The runner decides order and consequences (precondition, stop_on_failure, Ctrl-C); process.py
runs commands, output.py interprets their lines, collectors.py reads state, evidence.py stores.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

from engine import defaults, limits, version
from engine.run import collectors, evidence, subreaper
from engine.run.console import Console, ProgressDisplay
from engine.run.output import Capture, child_exit_text, compile_rules, harvest_problems
from engine.run.process import Interrupted, compile_signal_rules, run_command
from engine.run.reaper import Reaper
from engine.secrets import Scrubber, TreeScrubber
from engine.spec.plan import step_kind
from engine.text import utc_second
from engine.types import CheckResult, Verdict

DIAG_READ_BYTES = 1 << 18  # enough for 70 long lines; a multi-GB rank log is never read whole


class RunDirError(Exception):
    """The run directory cannot be used (a file, not writable, or holding another run)."""


def prepare_run_dir(run_dir: Path, force: bool = False) -> None:
    """Create the run directory and prove it writable before anything runs; refuse one that
    holds files already unless `force` (a run would silently mix its evidence with theirs)."""
    if run_dir.exists() or run_dir.is_symlink():
        if not run_dir.is_dir():
            raise RunDirError(f"--run-dir {run_dir}: exists and is not a directory")
        try:
            entries = sorted(os.listdir(run_dir))
        except OSError as exc:
            raise RunDirError(f"--run-dir {run_dir}: cannot list it: {exc.strerror or exc}") from None
        if entries and not force:
            shown = ", ".join(entries[:5]) + (f" and {len(entries) - 5} more" if len(entries) > 5 else "")
            raise RunDirError(
                f"--run-dir {run_dir}: exists and is not empty ({shown}); choose "
                f"another, empty it, or pass --force to run into it (the run's "
                f"evidence.json and logs replace theirs, other files stay)"
            )
    try:
        (run_dir / "logs").mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".writable.", dir=run_dir)
        os.close(fd)
        os.unlink(probe)
    except (OSError, ValueError) as exc:
        raise RunDirError(f"--run-dir {run_dir}: cannot write there: {getattr(exc, 'strerror', None) or exc}") from None


# Evidence -> (check results, verdict): engine.judge.verdict.judge bound to the plan.
Judge = Callable[[Mapping[str, Any]], tuple[list[CheckResult], Verdict]]


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM stopped the run; `doc` is the evidence as stored (judged, when a judge
    was given), marked interrupted."""

    def __init__(self, doc: dict[str, Any]) -> None:
        super().__init__("interrupted")
        self.doc = doc


def _precondition(step: Mapping[str, Any]) -> str | None:
    body = step.get(step_kind(step))
    return body.get("precondition") if isinstance(body, Mapping) else None


def _stops_on_failure(step: Mapping[str, Any]) -> bool:
    body = step.get(step_kind(step))
    return bool(body.get("stop_on_failure")) if isinstance(body, Mapping) else False


def _env_text(value: Any) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value)


class StopSignals:
    """Ctrl-C and SIGTERM (a job scheduler's timeout) during a run, however many arrive.

    The first one raises KeyboardInterrupt where the run is, once it is armed (a signal that
    arrives before is held until then): the runner stops the leg (SIGTERM, then SIGKILL after its
    grace), marks it interrupted and writes the evidence and the verdict. The ones after it never
    raise: a KeyboardInterrupt inside that cleanup would lose the evidence, the verdict or the exit
    code. The second SIGKILLs the engine's child processes (the running leg: its grace is not waited
    out, process.py then removes the rest of its tree); later ones are only counted.

    On leaving, the previous handlers come back; with `linger` (the `engine` program, about to
    exit) not once a signal arrived: the exit code is decided, and a later Ctrl-C, ignored, must
    not turn it into a traceback or a death by signal.
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self, linger: bool = False, kill: Callable[[], list[int]] | None = None) -> None:
        self.linger = linger
        self.kill = kill or kill_children
        self.count = 0
        self.armed = False
        self._pending = False
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for sig in self.SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.armed = False
        for sig, previous in self._previous.items():
            # SIG_IGN, not a Python handler: the interpreter puts SIG_DFL back for those at its
            # very end, and a Ctrl-C landing then would kill the process (-2) instead of 130.
            signal.signal(sig, signal.SIG_IGN if self.linger and self.count else previous)
        self._previous.clear()

    def arm(self) -> None:
        """From here the first signal raises; one that came before raises now."""
        if self._pending:
            self._pending = False
            raise KeyboardInterrupt("interrupted before the first step")
        self.armed = self.count == 0

    def disarm(self) -> None:
        """The steps are over (or stopping): nothing raises any more."""
        self.armed = False

    def _handle(self, signum: int, frame: Any) -> None:
        self.count += 1
        if self.count == 1:
            if self.armed:
                self.armed = False
                raise KeyboardInterrupt(f"signal {signum}")
            self._pending = True
            return
        if self.count == 2:
            killed = self.kill()
            _say_now(
                f"engine: {signal.Signals(signum).name} again: SIGKILL to the running leg "
                f"({len(killed)} process group{'s' if len(killed) != 1 else ''}); "
                "the evidence is still written"
                if killed
                else f"engine: {signal.Signals(signum).name} again: still writing the evidence"
            )
        elif self.count == 3:
            _say_now("engine: stopping already; the evidence and the verdict are being written")


def _say_now(text: str) -> None:
    """Straight to fd 2: a signal handler must not re-enter a buffered stream the main thread may
    be writing to at that very moment."""
    try:
        os.write(2, (text + "\n").encode())
    except OSError:
        pass


def _child_pids() -> list[int]:
    """The engine's direct children (/proc/<pid>/task/<tid>/children); empty where unreadable."""
    me = os.getpid()
    pids: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{me}/task")
    except OSError:
        return pids
    for tid in tasks:
        try:
            with open(f"/proc/{me}/task/{tid}/children", "rb") as fh:
                pids += [int(x) for x in fh.read().split()]
        except (OSError, ValueError):
            continue
    return pids


def kill_children() -> list[int]:
    """SIGKILL every child of the engine, with its process group where it leads one (a leg runs
    in a session of its own); for a leg under a supervisor (engine/run/subreaper.py), its leader's
    group, so that the supervisor lives on to take the rest of the leg down; the pids signalled."""
    killed = []
    for pid in _child_pids():
        leader = subreaper.LEADERS.get(pid)
        try:
            if leader is not None:
                os.killpg(leader, signal.SIGKILL)
            elif os.getpgid(pid) == pid:
                os.killpg(pid, signal.SIGKILL)
            else:
                os.kill(pid, signal.SIGKILL)
            killed.append(pid)
        except (ProcessLookupError, PermissionError):
            continue
    return killed


class Runner:
    def __init__(
        self, plan: evidence.PlanLike, run_dir: Path, console: Console, reuse: evidence.Reuse | None = None
    ) -> None:
        self.plan, self.run_dir, self.console = plan, run_dir, console
        self.t0 = time.monotonic()
        self.scrubber = Scrubber.for_plan(plan, os.environ)
        # Legs write into the run dir too (torchrun's per-rank logs hold the environment and the
        # exception message): after every step, every file there is masked.
        self.files = TreeScrubber(run_dir, self.scrubber.secrets)
        self.doc = evidence.new_document(plan, run_dir, version())
        for step in plan.steps:
            self.doc["steps"][step["name"]] = {"kind": step_kind(step), "status": "not_run"}
        if reuse is not None:
            evidence.carry_over(self.doc, reuse)

    def save(self) -> None:
        self.doc["finished_at"] = evidence.now_iso()
        self.doc["seconds"] = round(time.monotonic() - self.t0, 3)
        self._write()

    def _write(self) -> None:
        evidence.write(self.run_dir, self.scrubber.scrub_obj(self.doc))

    def say(self, text: str) -> None:
        self.console.line(self.scrubber.scrub(text))

    def execute(self, judge: Judge | None = None, stops: StopSignals | None = None) -> dict[str, Any]:
        stops = stops or StopSignals()  # unentered: arm/disarm only (a caller handles signals)
        # Should the engine die mid-run, the reaper masks what the legs left in the run dir.
        self._tell_reaper(lambda reaper: reaper.scrub_at_end(self.run_dir, self.scrubber.secrets))
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
            self._finish(judge)
            raise RunInterrupted(self.doc) from None
        except evidence.RecordError as exc:
            stops.disarm()
            self._record_failed(exc, current)
        self._finish(judge)
        return self.doc

    def _record_failed(self, exc: evidence.RecordError, step: str | None) -> None:
        """The run's record could not be written (a full disk): the run stops here, and its verdict
        is ERROR, naming the file and why. evidence.json keeps its last complete version."""
        self.doc["record_error"] = {"path": str(exc.path), "error": str(exc), "step": step}
        self.say(f"ERROR: {exc}; the run stops{f' at {step}' if step else ''}, later steps not run")

    def _finish(self, judge: Judge | None) -> None:
        """Store the end of the run, then its checks and verdict: the verdict's seconds are the
        run's, so the clock stops before judging. A write that fails makes the verdict ERROR; it
        is then only said, and evidence.json keeps the last version that could be written."""
        try:
            self.save()
        except evidence.RecordError as exc:
            if "record_error" not in self.doc:
                self._record_failed(exc, None)
        if judge is not None:
            self._judge(judge)
        self.scrub_files()
        self._tell_reaper(lambda reaper: reaper.scrubbed(self.run_dir))
        # What the caller renders (the terminal table, JUnit, Markdown, HTML) is what was stored.
        self.doc = self.scrubber.scrub_obj(self.doc)

    def _judge(self, judge: Judge) -> None:
        while True:
            results, verdict = judge(self.doc)
            self.doc["checks"] = self.scrubber.scrub_obj(results)
            self.doc["verdict"] = self.scrubber.scrub_obj(verdict)
            try:
                self._write()
                return
            except evidence.RecordError as exc:
                if "record_error" in self.doc:  # judged with it: the verdict stands, unstored
                    self.say(f"ERROR: the verdict could not be stored: {exc}")
                    return
                self._record_failed(exc, None)

    def _tell_reaper(self, message: Callable[[Reaper], None]) -> None:
        try:
            message(Reaper.get())
        except (RuntimeError, OSError) as exc:
            # The run itself is not at stake, only the cleanup after a killed engine: say so.
            self.say(
                f"WARNING: {exc}; should the engine be killed, the run dir's files keep "
                f"what secrets the legs wrote into them"
            )

    def scrub_files(self, record: dict[str, Any] | None = None) -> None:
        """Mask every secret in the files under the run dir, saying which held one."""
        found = self.files.scrub()
        for path in found:
            self.say(f"   masked a secret in {path}")
        for problem in self.files.problems:
            self.say(f"   WARNING: could not check for secrets (it may hold one): {problem}")
        self.files.problems.clear()
        if record is not None and found:
            record["secrets_masked_in"] = found

    def run_step(self, step: Mapping[str, Any]) -> bool:
        """Run one step, record it, write the evidence; False when nothing later may run."""
        name, kind = step["name"], step_kind(step)
        record = self.doc["steps"][name]
        if record.get("reused"):  # `--from` a later step: this one's evidence is the earlier run's
            self.say(
                f"=== {name}: reused ({record.get('status')}) from the run of {utc_second(record.get('reused_from'))}"
            )
            return True
        self.say(f"=== {name}")
        if not step.get("enabled", True):
            record["status"] = "skipped"
            self.say(f"{name} skipped (when: {step.get('when')})")
            self.save()
            return True
        started = time.monotonic()
        try:
            if kind == "run":
                rc = self._run(step, record)
            elif kind == "remove":
                rc = self._remove(step["remove"], record, step.get("remove_also_under") or ())
            else:
                rc = self._collect(name, step["collect"], record)
        finally:
            record.setdefault("seconds", round(time.monotonic() - started, 3))
            self.scrub_files(record)
        self.say(f"{name}_RC {rc} seconds {time.monotonic() - started:.1f} elapsed {time.monotonic() - self.t0:.0f}")
        go_on = True
        if record["status"] == "failed":
            message = _precondition(step)
            if message:
                self.doc["precondition_failed"] = {"step": name, "message": message}
                self.say(f"PRECONDITION FAILED ({name}): {message}")
                go_on = False
            elif _stops_on_failure(step):
                self.doc["stopped"] = {"step": name, "reason": "stop_on_failure"}
                self.say(f"STOPPING: {name} failed and has stop_on_failure")
                go_on = False
        self.save()
        return go_on

    # --- run ---------------------------------------------------------------------------------
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
            {
                "log": log_rel,
                "harvest": {},
                "harvest_errors": [],
                "failure_lines": [],
                "diagnostics": None,
                "progress": None,
                "error": None,
            }
        )
        try:
            result = run_command(
                [str(a) for a in run["argv"]],
                env={str(k): _env_text(v) for k, v in (run.get("env") or {}).items()},
                cwd=run.get("cwd") or None,
                timeout_s=run.get("timeout_s"),
                grace_s=float(run.get("grace_s", defaults.GRACE_S)),
                log_path=self.run_dir / log_rel,
                on_block=capture.feed,
                on_tick=display.tick,
                signals=signal_rules,
                strip_prefix=rules.strip_prefix,
                scrub=self.scrubber,
                notify=lambda text: self.say("   " + text),
                log_written=self.files.vouch if self.files.finder else None,
            )
        except Interrupted as exc:
            display.close()
            self._record_capture(record, capture, failed=True, warning=display.warning)
            record.update(exc.result.as_dict())
            raise
        except evidence.RecordError as exc:
            display.close()
            self._record_capture(record, capture, failed=True)
            record.update({**(exc.result.as_dict() if exc.result is not None else {}), "status": "failed"})
            record["error"] = str(exc)
            raise
        display.close()
        # A rule that gave up on a line (a catastrophic regex) leaves the harvest unreliable.
        problems = result.problems + rules.pattern_errors()
        ok = (
            result.rc in run.get("ok_exit_codes", [0])
            and not result.timed_out
            and result.error is None
            and not problems
        )
        record.update(result.as_dict())
        record["status"] = "ok" if ok else "failed"
        record["error"] = "; ".join(([result.error] if result.error else []) + problems) or None
        self._record_capture(record, capture, failed=not ok, warning=display.warning)
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
            self._show_failure(name, capture)
            diag = (run.get("on_failure") or {}).get("diagnostics")
            if diag:
                record["diagnostics"] = self._diagnostics(diag)
        return result.rc

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
        if failed:
            record["failure_lines"] = capture.failure_lines()
            record["failure_hits"] = capture.failure_hits
            record["tail"] = capture.tail_lines()
            child = capture.child_exit()
            if child is not None:
                record["child_exit"] = child

    def _show_failure(self, name: str, capture: Capture) -> None:
        child = capture.child_exit()
        if child is not None:  # before the launcher's own noise: what the child itself said
            self.say(f"   {name}: {child_exit_text(child)}")
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
            self.scrubber.scrub,
        )
        report = self.scrubber.scrub_obj(report)
        self.say(f"   DIAGNOSTICS {report['dir']}:")
        if not report["exists"]:
            self.say(f"   {report['message']}")
            return report
        for entry in report["listing"]:
            self.say("   " + entry)
        if report["listing_more"]:
            self.say(f"   ... and {report['listing_more']} more entries")
        for item in report["files"]:
            self.say(f"   ==== {item['path']} (last {len(item['tail'])} lines)")
            for line in item["tail"]:
                self.say("   " + line)
        return report

    # --- remove ------------------------------------------------------------------------------
    def _remove(self, spec: str | Sequence[str], record: dict[str, Any], also_under: Sequence[str] = ()) -> int:
        paths = [spec] if isinstance(spec, (str, os.PathLike)) else list(spec)
        removed, absent = [], []
        record.update({"paths": [str(p) for p in paths], "error": None})
        try:
            targets = [check_removable(p, self.run_dir, also_under) for p in paths]
            for target in targets:
                if remove_path(target):
                    removed.append(str(target))
                else:
                    absent.append(str(target))
        except (ValueError, OSError) as exc:
            record.update({"status": "failed", "error": str(exc), "removed": removed, "absent": absent})
            self.say(f"   REMOVE FAILED: {exc}")
            return 1
        record.update({"status": "ok", "removed": removed, "absent": absent})
        for path in removed:
            self.say(f"   removed {path}")
        for path in absent:
            self.say(f"   already absent {path}")
        return 0

    # --- collect -----------------------------------------------------------------------------
    def _collect(self, name: str, spec: Mapping[str, Any], record: dict[str, Any]) -> int:
        collector = spec["collector"]
        record.update({"collector": collector, "error": None})
        context = {
            "cwd": os.getcwd(),
            "run_dir": str(self.run_dir),
            "step": name,
            "log_path": str(self.run_dir / "logs" / f"{_safe_name(name)}.log"),
            "scrub": self.scrubber.scrub,
            "scrubber": self.scrubber,
        }
        try:
            state = collectors.collect(collector, spec.get("args") or {}, context)
        except collectors.CollectorError as exc:
            record.update({"status": "failed", "error": self.scrubber.scrub(str(exc))})
            self.say(f"   COLLECT FAILED: {exc}")
            return 1
        self.doc["state"][name] = self.scrubber.scrub_obj(state)
        record["status"] = "ok"
        self.say(f"   state {name}: {json.dumps(self.doc['state'][name], default=str)[:300]}")
        return 0


def _safe_name(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name) or "step"


def check_removable(
    path: str | os.PathLike[str], run_dir: Path, also_under: Sequence[str | os.PathLike[str]] = ()
) -> Path:
    """The absolute path to remove, or ValueError when removing it would destroy something the
    run (or the user) cannot lose: /, the home directory, the working directory or one of its
    parents, the run's evidence directory or one of its parents; and anything that is not inside
    the working directory, the run directory or one of the directories the step names in
    `also_under` (the engine may run as root: `runs/../../etc` must not be one typo away)."""
    if not str(path).strip():
        raise ValueError("refusing to remove an empty path")
    target = Path(os.path.abspath(os.path.expanduser(str(path))))
    protected = {
        "/": Path("/"),
        "the home directory": Path(os.path.abspath(os.path.expanduser("~"))),
    }
    if target in protected.values():
        label = next(k for k, v in protected.items() if v == target)
        raise ValueError(f"refusing to remove {target}: it is {label}")
    cwd = Path(os.getcwd()).resolve()
    # A symlink is unlinked, not followed, so judge the link itself, not what it points at.
    real = target.parent.resolve() / target.name if target.is_symlink() else target.resolve()
    if real == cwd or real in cwd.parents:
        raise ValueError(f"refusing to remove {target}: it is (or contains) the working directory {cwd}")
    run = run_dir.resolve()
    if real == run or real in run.parents:
        raise ValueError(f"refusing to remove {target}: it is (or contains) the run directory {run}")
    roots = [cwd, run] + [Path(os.path.abspath(os.path.expanduser(str(r)))).resolve() for r in also_under]
    if not any(limits.under(real, root) for root in roots):
        extra = "".join(f", {r}" for r in roots[2:])
        raise ValueError(
            f"refusing to remove {target}: it is outside the working directory {cwd}"
            f", the run directory {run}{extra}; a step that must remove it says so with "
            f"`remove: {{paths: [...], also_under: [<a directory above it>]}}`"
        )
    return target


def remove_path(target: Path) -> bool:
    """rm -rf one path (a symlink is unlinked, never followed); False when it was not there."""
    if target.is_symlink() or target.is_file():
        target.unlink()
        return True
    if target.is_dir():
        shutil.rmtree(target)
        return True
    if os.path.lexists(target):
        target.unlink()
        return True
    return False


def collect_diagnostics(
    root: Path, list_max: int, max_files: int, tail_lines: int, scrub: Callable[[str], str] = lambda line: line
) -> dict[str, Any]:
    """List a directory tree and tail its files, everything shown unfiltered: the failing rank's
    traceback may use words no failure pattern anticipated. Each tail line is scrubbed before it
    is cut to the evidence's line limit: cut first, a secret across the cut would leave a piece."""
    if not root.is_dir():
        what = "is not a directory" if root.exists() else "does not exist"
        return {
            "dir": str(root),
            "exists": False,
            "message": f"diagnostics dir {root} {what}",
            "listing": [],
            "listing_more": 0,
            "files": [],
        }
    entries: list[str] = []
    files: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        base = Path(dirpath)
        for d in dirnames:
            entries.append(str((base / d).relative_to(root)) + "/")
        for f in sorted(filenames):
            entries.append(str((base / f).relative_to(root)))
            files.append(base / f)
    tails = [
        {"path": str(f), "tail": [limits.cut_text(scrub(line)) for line in tail_file(f, tail_lines)]}
        for f in files[:max_files]
    ]
    return {
        "dir": str(root),
        "exists": True,
        "listing": entries[:list_max],
        "listing_more": max(len(entries) - list_max, 0),
        "files": tails,
    }


def tail_file(path: Path, n: int) -> list[str]:
    try:
        # O_NONBLOCK: a FIFO a leg left in the directory must not block the engine.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return ["<not a regular file: not read>"]
            size = os.lseek(fd, 0, os.SEEK_END)
            os.lseek(fd, max(size - DIAG_READ_BYTES, 0), os.SEEK_SET)
            data = os.read(fd, DIAG_READ_BYTES)
        finally:
            os.close(fd)
    except OSError as exc:
        return [f"<cannot read: {exc.strerror or exc}>"]
    lines = data.decode("utf-8", errors="replace").splitlines()
    return lines[-n:] if n > 0 else []


def execute(
    plan: evidence.PlanLike,
    run_dir: str | os.PathLike[str],
    out: TextIO = sys.stdout,
    *,
    is_tty: bool | None = None,
    judge: Judge | None = None,
    stops: StopSignals | None = None,
    err: TextIO | None = None,
    reuse: evidence.Reuse | None = None,
) -> dict[str, Any]:
    """Run every step of `plan`, writing `<run_dir>/evidence.json` after each; with `judge`, then
    store its check results and verdict in it too. Return the document. Ctrl-C (or SIGTERM) raises
    RunInterrupted, a KeyboardInterrupt carrying the document, once the evidence records the
    interrupted step and the verdict (see StopSignals for many of them). `stops`: handlers the caller
    installed and keeps past the run; by default the run installs its own for its duration. `err`:
    where warnings go (stderr). `reuse`: the steps taken over from the earlier run in `run_dir`
    (`engine run --from`), which do not run again."""
    run_path = Path(run_dir)
    (run_path / "logs").mkdir(parents=True, exist_ok=True)
    runner = Runner(plan, run_path, Console(out, is_tty, err), reuse)
    if stops is not None:  # the caller's handlers, held past the run (engine run prints the report)
        return runner.execute(judge, stops)
    with StopSignals() as own:
        return runner.execute(judge, own)
