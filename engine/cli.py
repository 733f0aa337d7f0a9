"""engine: run a declarative probe spec, or re-check a saved run against it.

Usage (results go to stdout, diagnostics to stderr):

    engine validate specs/p4_smoke.yaml specs/p4_soak.yaml
    engine plan specs/p4_smoke.yaml --mode smoke --set steps=30
    engine run specs/p4_smoke.yaml --mode smoke --junit out/junit.xml --markdown out/summary.md
    engine run specs/p4_smoke.yaml --set repo=file:///tmp/store/probe/ckpt-1 --run-dir runs/try1
    engine check specs/p4_smoke.yaml --evidence runs/try1 --junit out/junit.xml
    engine replay specs/p4_smoke.yaml --evidence runs/try1
    engine schema > spec.schema.json
    engine diff specs/p4_soak.yaml --base origin/main --evidence runs/try1
    engine --version

`run` loads and validates the spec, resolves it for one mode (--mode, else the spec's mode_env
variable, else modes.default), prints the run directory and every value with where it came
from (secrets shown as <redacted>), runs the steps, evaluates the checks, stores checks and
verdict in <run dir>/evidence.json and ends with one line:

    VERDICT <spec> PASS|FAIL|PRECONDITION|INTERRUPTED [<failed names>] seconds <N>

The default run directory is runs/<name>-<mode>-<UTC stamp> under the current directory.

`check` re-evaluates the spec's CURRENT checks against a saved run without running anything
(results go to <run dir>/check-<stamp>.json; evidence.json is left as it was). It refuses
(exit 2) when a step's definition changed since the run, because the evidence would no longer
describe the spec. `replay` additionally re-harvests every run step from its saved raw log with
the spec's current output rules (prefix strip, markers), so a fixed harvest rule can be
verified without re-running a leg; output-rule changes are allowed there, nothing else.

Exit codes: 0 pass, 5 a failed check or leg, 2 invalid spec or usage, 3 a precondition
failed, 130 interrupted (`engine diff`: 0 no semantic change, 1 changed, 2 invalid).
"""
from __future__ import annotations

import argparse
import enum
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

# Keep imports lazy: `engine check` must answer in well under a second, so nothing heavy
# (and nothing from the trainer) is imported on its path.

VERSION = "0.1.0"
_BUILTINS = ("python", "work_dir", "spec_dir", "run_dir", "run_id")


class Exit(enum.IntEnum):
    """Process exit codes of `engine`."""
    PASS = 0
    USAGE = 2          # invalid spec, bad arguments, refused re-check
    PRECONDITION = 3
    FAILED = 5         # a failed check or a failed leg
    INTERRUPTED = 130


EPILOG = "exit codes: " + ", ".join(f"{int(c)} {c.name.lower()}" for c in Exit) + \
    " (usage = invalid spec, bad arguments or a refused re-check; failed = a failed check or leg)"


class _Refused(Exception):
    """The request cannot be carried out as asked; the message says why (exit 2)."""


def _err(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _stamp() -> str:
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())


# ---------------------------------------------------------------- loading

def _load(path: str) -> Any:
    from engine.spec import SpecErrors, load_spec
    try:
        return load_spec(path)
    except SpecErrors as exc:
        raise _Refused(str(exc)) from None
    except FileNotFoundError as exc:
        raise _Refused(f"{path}: no such file ({exc.filename})") from None
    except OSError as exc:
        raise _Refused(f"{path}: cannot read: {exc.strerror or exc}") from None


def _semantic_errors(spec: Any) -> list[str]:
    try:
        from engine.validate import validate
    except ImportError:  # validate.py is optional to the checking path; the schema already ran
        return []
    return [str(e) for e in validate(spec, dict(os.environ))]


def _plan(spec: Any, mode: str | None, sets: Sequence[str], environ: Mapping[str, str],
          builtins: Mapping[str, Any] | None = None) -> Any:
    from engine.plan import build_plan
    from engine.spec import SpecErrors
    from engine.values import UsageError
    try:
        return build_plan(spec, mode=mode, sets=list(sets), environ=environ, builtins=builtins)
    except (SpecErrors, UsageError) as exc:
        raise _Refused(str(exc)) from None


def _preconditions(plan: Any) -> dict[str, str]:
    return {s["name"]: s["run"]["precondition"] for s in plan.steps
            if s.get("kind") == "run" and s["run"].get("precondition")}


# ---------------------------------------------------------------- step definitions

def definition(step: Mapping[str, Any]) -> dict[str, Any]:
    """The part of a resolved step its fingerprint covers (no output rules, no location)."""
    out = {k: v for k, v in step.items() if k not in ("file", "line")}
    if "run" in out:
        out["run"] = {k: v for k, v in out["run"].items() if k != "output"}
    return out


def _flatten(obj: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(obj, dict) and obj:
        out: dict[str, Any] = {}
        for k, v in obj.items():
            out.update(_flatten(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    return {prefix: obj}


def changed_keys(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """Dotted keys whose values differ between two step definitions."""
    a, b = _flatten(dict(old)), _flatten(dict(new))
    return sorted(k for k in set(a) | set(b) if a.get(k, "<absent>") != b.get(k, "<absent>"))


def _change(key: str, old: Mapping[str, Any], new: Mapping[str, Any]) -> str:
    from engine.checks import compact
    a, b = _flatten(dict(old)), _flatten(dict(new))
    return f"{key}: {compact(a.get(key, '<absent>'), 100)} -> {compact(b.get(key, '<absent>'), 100)}"


def step_changes(evidence: Mapping[str, Any], plan: Any) -> list[str]:
    """One line per step whose definition differs between the saved run and the current plan."""
    old_fp: Mapping[str, str] = evidence.get("fingerprints") or {}
    new_fp: Mapping[str, str] = plan.fingerprints
    old_defs: Mapping[str, Any] = evidence.get("definitions") or {}
    new_defs = {s["name"]: definition(s) for s in plan.steps}
    lines = []
    for name in old_fp:
        if name not in new_fp:
            lines.append(f"step {name}: removed from the spec since the run")
    for name in new_fp:
        if name not in old_fp:
            lines.append(f"step {name}: added to the spec since the run")
        elif new_fp[name] != old_fp[name]:
            if name in old_defs:
                new_def = _redacted(new_defs[name], plan)
                keys = changed_keys(old_defs[name], new_def)
                if not keys:
                    # Equal once secrets are redacted: only a secret differs (or could not be
                    # re-supplied), and the evidence holds no secret to compare with.
                    _err(f"note: step {name} differs only in a secret value; re-checking anyway")
                    continue
                how = "; ".join(_change(k, old_defs[name], new_def) for k in keys)
                lines.append(f"step {name}: definition changed ({how})")
            else:
                lines.append(f"step {name}: definition changed (fingerprint "
                             f"{old_fp[name][:12]} -> {new_fp[name][:12]})")
    return lines


def _scrubber(plan: Any) -> Any:
    # The same secrets the runner scrubs: secret-named values, env vars and step env entries.
    from engine.evidence import Scrubber
    return Scrubber.for_run(plan.values, os.environ, plan.secret_names,
                            [(s.get("run") or {}).get("env") or {} for s in plan.steps])


def _redacted(obj: Any, plan: Any) -> Any:
    return _scrubber(plan).scrub_obj(obj)


def _definitions(plan: Any) -> dict[str, Any]:
    return {s["name"]: _redacted(definition(s), plan) for s in plan.steps}


# ---------------------------------------------------------------- re-planning a saved run

def replan(spec: Any, evidence: Mapping[str, Any]) -> Any:
    """The plan the saved run would have had with the CURRENT spec: same mode, same --set and
    env overrides, same builtins (run_dir, run_id, ... differ per run by design)."""
    from engine.values import REDACTED
    values: Mapping[str, Any] = evidence.get("values") or {}
    sources: Mapping[str, str] = evidence.get("sources") or {}
    env_names = {name: var for var, name in (spec.data.get("env") or {}).items()}
    sets, environ = [], {}
    for name, source in sources.items():
        if source not in ("--set", "env") or name not in values:
            continue
        value = values[name]
        if value == REDACTED and name in env_names and env_names[name] in os.environ:
            # Secrets are not stored; the caller's environment is the only place they live.
            environ[env_names[name]] = os.environ[env_names[name]]
        else:
            sets.append(f"{name}={json.dumps(value)}")
    builtins = {k: values[k] for k in _BUILTINS if k in values and sources.get(k) == "builtin"}
    return _plan(spec, evidence.get("mode"), sets, environ, builtins)


def _reharvest(evidence: dict, plan: Any, run_dir: Path) -> list[str]:
    """Re-derive every run step's harvest from its raw log with the plan's output rules."""
    from engine.output import reharvest
    notes = []
    by_name = {s["name"]: s for s in plan.steps}
    for name, step in (evidence.get("steps") or {}).items():
        if step.get("kind") != "run" or not step.get("log") or name not in by_name:
            continue
        log = run_dir / step["log"]
        if not log.is_file():
            notes.append(f"step {name}: raw log {log} is missing; kept the saved harvest")
            continue
        fresh = reharvest(by_name[name], log)
        step["harvest"], step["harvest_errors"] = fresh["harvest"], fresh["harvest_errors"]
        step["lines"], step["progress"] = fresh["lines"], fresh["progress"]
        if step.get("status") == "failed":  # the runner keeps these for failed legs only
            step["failure_lines"], step["tail"] = fresh["failure_lines"], fresh["tail"]
    return notes


# ---------------------------------------------------------------- results

def _judge(plan: Any, evidence: Mapping[str, Any]) -> tuple[list[dict], dict]:
    from engine.checks import evaluate, verdict
    try:
        from engine.functions import OPTIONS
    except ImportError:  # pragma: no cover - functions.py is part of the engine
        OPTIONS = None
    blocked = (evidence.get("precondition_failed") or {}).get("step")
    if blocked:
        # Nothing after the precondition ran: every check would read missing data, and twenty
        # NO_DATA traces would bury the one line that matters (what could not be prepared).
        results = [{**_check_fields(check), "outcome": "SKIPPED", "value": None, "missing": [],
                    "explain": [], "reason": f"not evaluated: precondition step {blocked} failed"}
                   for check in plan.checks]
    else:
        results = evaluate(plan.checks, evidence, OPTIONS)
    return results, verdict(evidence, results, _preconditions(plan))


def _check_fields(check: Mapping[str, Any]) -> dict:
    return {k: check.get(k) for k in ("name", "why", "expr", "severity", "file", "line")}


def _emit(evidence: Mapping[str, Any], results: list[dict], verdict: Mapping[str, Any],
          args: argparse.Namespace) -> None:
    from engine import report
    print(report.table(evidence, results, verdict, verbose=args.verbose), flush=True)
    for path, render in ((args.junit, report.junit), (args.markdown, report.markdown)):
        if path:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            Path(path).write_text(render(evidence, results, verdict), encoding="utf-8")


def _fresh(directory: Path, stem: str) -> Path:
    """`stem.json`, or `stem-2.json`, ...: two re-checks in one second must not overwrite."""
    path, n = directory / f"{stem}.json", 1
    while path.exists():
        n += 1
        path = directory / f"{stem}-{n}.json"
    return path


def _write_json(path: Path, doc: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1, default=str) + "\n", encoding="utf-8")
    os.replace(tmp, path)


# ---------------------------------------------------------------- commands

def cmd_validate(args: argparse.Namespace) -> int:
    bad = False
    for path in args.specs:
        try:
            errors = _semantic_errors(_load(path))
        except _Refused as exc:
            errors = str(exc).splitlines()
        if errors:
            bad = True
            print(f"INVALID {path}: {len(errors)} problem{'s' if len(errors) > 1 else ''}", flush=True)
            for line in errors:
                print(line, flush=True)
        else:
            print(f"OK {path}", flush=True)
    return Exit.USAGE if bad else Exit.PASS


def _valid_spec(path: str) -> Any:
    spec = _load(path)
    errors = _semantic_errors(spec)
    if errors:
        raise _Refused("\n".join(errors))
    return spec


def cmd_plan(args: argparse.Namespace) -> int:
    plan = _plan(_valid_spec(args.spec), args.mode, args.set, os.environ)
    print(plan.describe(), end="", flush=True)
    return Exit.PASS


def cmd_schema(args: argparse.Namespace) -> int:
    from engine.spec import schema_text
    text = schema_text()
    print(text, end="" if text.endswith("\n") else "\n")
    return Exit.PASS


def _show_values(plan: Any) -> None:
    from engine.values import redact
    shown = redact(plan.values)
    width = max((len(k) for k in shown), default=0)
    print("values:")
    for key, value in shown.items():
        print(f"  {key:<{width}} = {json.dumps(value, default=str)}  [{plan.sources.get(key, '?')}]")
    sys.stdout.flush()


def cmd_run(args: argparse.Namespace) -> int:
    from engine import evidence as ev
    from engine.plan import pick_mode
    from engine.runner import execute
    from engine.values import UsageError
    spec = _valid_spec(args.spec)
    try:
        mode = pick_mode(spec.data, args.mode, os.environ)
    except UsageError as exc:
        raise _Refused(str(exc)) from None
    run_id = _stamp()
    name = spec.data.get("name", "spec")
    run_dir = Path(args.run_dir or Path.cwd() / "runs" / f"{name}-{mode}-{run_id}").absolute()
    plan = _plan(spec, mode, args.set, os.environ, {"run_dir": str(run_dir), "run_id": run_id})
    print(f"spec {plan.name} mode {plan.mode}\nrun dir: {run_dir}", flush=True)
    _show_values(plan)
    interrupted = False
    try:
        doc = execute(plan, run_dir, sys.stdout)
    except KeyboardInterrupt:
        interrupted = True
        try:
            doc = ev.load(run_dir)
        except ev.EvidenceError:  # interrupted before the first write: nothing to judge
            _err(f"interrupted before any evidence was written to {run_dir}")
            return Exit.INTERRUPTED
        doc["interrupted"] = True
    doc["definitions"] = _definitions(plan)
    results, verdict = _judge(plan, doc)
    if interrupted:
        verdict.update(outcome="INTERRUPTED", exit_code=int(Exit.INTERRUPTED))
    doc["checks"], doc["verdict"] = results, verdict
    ev.write(run_dir, _redacted(doc, plan))
    _emit(doc, results, verdict, args)
    return verdict["exit_code"]


def _recheck(args: argparse.Namespace, replay: bool) -> int:
    from engine import evidence as ev
    run_dir = Path(args.evidence)
    try:
        saved = ev.load(run_dir)
    except ev.EvidenceError as exc:
        raise _Refused(str(exc)) from None
    spec = _valid_spec(args.spec)
    plan = replan(spec, saved)
    changes = step_changes(saved, plan)
    if changes:
        hint = " (`engine replay` accepts changed output rules and checks, nothing else)" if replay \
            else " (`engine check` accepts changed checks; `engine replay` also changed output rules)"
        raise _Refused(f"refusing to re-check {run_dir}: the spec's steps changed since the run"
                       f"{hint}; run it again instead.\n" + "\n".join(changes))
    doc = {k: v for k, v in saved.items() if k not in ("checks", "verdict")}
    if replay:
        for note in _reharvest(doc, plan, run_dir):
            _err(note)
    results, verdict = _judge(plan, doc)
    kind = "replay" if replay else "check"
    out = _fresh(run_dir, f"{kind}-{_stamp()}")
    record = {"kind": kind, "spec": str(args.spec), "at": _stamp(), "checks": results,
              "verdict": verdict}
    if replay:
        record["steps"] = doc.get("steps")
    try:
        _write_json(out, record)
    except OSError as exc:  # a read-only run dir must not cost the answer
        _err(f"could not write {out}: {exc.strerror or exc}")
    _emit(doc, results, verdict, args)
    return verdict["exit_code"]


def cmd_check(args: argparse.Namespace) -> int:
    return _recheck(args, replay=False)


def cmd_replay(args: argparse.Namespace) -> int:
    return _recheck(args, replay=True)


# ---------------------------------------------------------------- argparse

def _parser() -> argparse.ArgumentParser:
    doc = __doc__ or ""
    parser = argparse.ArgumentParser(
        prog="engine", description=doc, epilog=EPILOG,  # `engine --help` is the manual
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"engine {VERSION}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, help_text: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=help_text, description=help_text, epilog=EPILOG)

    def planning(p: argparse.ArgumentParser) -> None:
        p.add_argument("spec", metavar="SPEC")
        p.add_argument("--mode", help="mode to resolve (default: the spec's mode_env, then modes.default)")
        p.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                       help="override a value (parsed as a YAML scalar); repeatable")

    def reports(p: argparse.ArgumentParser) -> None:
        p.add_argument("--junit", metavar="FILE", help="also write a JUnit XML report")
        p.add_argument("--markdown", metavar="FILE", help="also write a Markdown summary")
        p.add_argument("-v", "--verbose", action="store_true", help="full explain trees")

    p = command("run", "run the spec's steps, then evaluate its checks")
    planning(p)
    p.add_argument("--run-dir", metavar="DIR", help="evidence directory (default runs/<name>-<mode>-<stamp>)")
    reports(p)
    p.set_defaults(func=cmd_run)

    p = command("validate", "check spec files (schema and semantics); nothing runs")
    p.add_argument("specs", nargs="+", metavar="SPEC")
    p.set_defaults(func=cmd_validate)

    p = command("plan", "show the resolved plan for one mode; nothing runs")
    planning(p)
    p.set_defaults(func=cmd_plan)

    p = command("schema", "print the spec JSON Schema")
    p.set_defaults(func=cmd_schema)

    for name, help_text, func in (
            ("check", "re-evaluate the spec's current checks against a saved run", cmd_check),
            ("replay", "re-harvest a saved run's raw logs with the current output rules, then check",
             cmd_replay)):
        p = command(name, help_text)
        p.add_argument("spec", metavar="SPEC")
        p.add_argument("--evidence", required=True, metavar="RUN_DIR", help="the saved run's directory")
        reports(p)
        p.set_defaults(func=func)
    # `engine diff` lives in engine/diff.py with its own arguments; it is handed the rest of the
    # command line so its (heavier) import stays off the `check` path.
    p = sub.add_parser("diff", add_help=False, help="semantic diff of a spec (engine diff --help)")
    p.add_argument("rest", nargs=argparse.REMAINDER)
    p.set_defaults(func=cmd_diff)
    return parser


def cmd_diff(args: argparse.Namespace) -> int:
    from engine.diff import main as diff_main
    return diff_main(args.rest)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `engine` console script; returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["diff"]:  # its own parser, so `engine diff --help` is diff's help
        from engine.diff import main as diff_main
        return diff_main(argv[1:])
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse: 0 for --help/--version, 2 for usage errors
        return int(exc.code or 0)
    try:
        return int(args.func(args))
    except _Refused as exc:
        _err(str(exc))
        return Exit.USAGE
    except KeyboardInterrupt:
        _err("interrupted")
        return Exit.INTERRUPTED
    except BrokenPipeError:  # `engine plan | head`: the reader left, nothing more to say
        return Exit.PASS


if __name__ == "__main__":
    sys.exit(main())
