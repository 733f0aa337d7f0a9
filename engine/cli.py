"""engine: run a declarative probe spec, or re-check a saved run against it.

Usage (results go to stdout, diagnostics to stderr):

    engine validate specs/p4_smoke.yaml specs/p4_soak.yaml
    engine plan specs/p4_smoke.yaml --mode smoke --set steps=30
    engine run specs/p4_smoke.yaml --mode smoke --junit out/junit.xml --markdown out/summary.md
    engine run specs/p4_smoke.yaml --set repo=file:///tmp/store/probe/ckpt-1 --run-dir runs/try1
    engine check specs/p4_smoke.yaml --evidence runs/try1 --junit out/junit.xml
    engine replay specs/p4_smoke.yaml --evidence runs/try1
    engine schema > spec.schema.json
    engine diff specs/p4_soak.yaml --base origin/main --evidence runs/try1 --markdown -
    engine review --base origin/main --markdown review.md
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

`--markdown FILE` (run, check, replay, diff, review) also writes the report as Markdown to FILE, for a PR
comment or a job summary; `--markdown -` prints the Markdown on stdout instead of the text report.

Exit codes: 0 pass, 5 a failed check or leg, 2 invalid spec or usage, 3 a precondition
failed, 130 interrupted (`engine diff`: 0 no semantic change, 1 changed, 2 invalid; `engine review`:
0 nothing risky or accepted, 1 risky changes need approval, 2 invalid).
"""
from __future__ import annotations

import argparse
import functools
import os
import sys
from pathlib import Path
from typing import Any, Mapping, Sequence

from engine.verdict import Exit

# Imports are lazy, per command: `engine check` must answer in well under a second, so nothing a
# command does not use (the runner for `check`, the diff for `run`, never the trainer) loads.
EPILOG = "exit codes: " + ", ".join(f"{int(c)} {c.name.lower()}" for c in Exit) + \
    " (usage = invalid spec, bad arguments or a refused re-check; failed = a failed check or leg)"
DIFF_EPILOG = "exit codes: 0 no semantic change, 1 a semantic change, 2 invalid spec or usage"
REVIEW_EPILOG = "exit codes: 0 nothing risky (or --accept-risk), 1 risky changes need approval, " \
    "2 invalid spec or evidence on either side, or usage"
MARKDOWN_HELP = "also write the report as Markdown to FILE; `-` prints it instead of the text report"


class _Refused(Exception):
    """The request cannot be carried out as asked; the message says why (exit 2)."""


def _err(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _valid_spec(path: str) -> Any:
    """The spec at `path`, loaded and validated; SpecErrors or _Refused listing every problem."""
    from engine.spec import load_spec
    from engine.validate import findings
    spec = load_spec(path)
    errors, warnings = findings(spec, dict(os.environ))
    if errors:
        raise _Refused("\n".join(str(e) for e in errors))
    for w in warnings:  # legal but easy to misread: said, never refused
        _err(f"warning: {w}")
    return spec


def _refusals() -> tuple[type[Exception], ...]:
    """The errors that mean "not as asked" (exit 2, the message on stderr), not an engine bug;
    imported only once something is raised."""
    from engine.evidence import EvidenceError
    from engine.recheck import Refused
    from engine.spec import SpecErrors
    from engine.values import UsageError
    return _Refused, SpecErrors, UsageError, EvidenceError, Refused


def _emit(evidence: Mapping[str, Any], results: list, verdict: Mapping[str, Any],
          args: argparse.Namespace) -> None:
    from engine import report
    markdown = report.markdown(evidence, results, verdict) if args.markdown else ""
    if args.markdown == "-":
        print(markdown, end="", flush=True)
    else:
        print(report.table(evidence, results, verdict, verbose=args.verbose), flush=True)
    if args.junit:
        report.write_file(args.junit, report.junit(evidence, results, verdict))
    if args.markdown and args.markdown != "-":
        report.write_file(args.markdown, markdown)


# ---------------------------------------------------------------- commands

def cmd_validate(args: argparse.Namespace) -> int:
    bad = False
    for path in args.specs:
        try:
            _valid_spec(path)
        except _refusals() as exc:
            bad = True
            errors = str(exc).splitlines()
            print(f"INVALID {path}: {len(errors)} problem{'s' if len(errors) > 1 else ''}", flush=True)
            print("\n".join(errors), flush=True)
        else:
            print(f"OK {path}", flush=True)
    return Exit.USAGE if bad else Exit.PASS


def cmd_plan(args: argparse.Namespace) -> int:
    from engine.plan import build_plan
    plan = build_plan(_valid_spec(args.spec), mode=args.mode, sets=args.set, environ=os.environ)
    print(plan.describe(), end="", flush=True)
    return Exit.PASS


def cmd_schema(args: argparse.Namespace) -> int:
    from engine.spec import schema_text
    text = schema_text()
    print(text, end="" if text.endswith("\n") else "\n")
    return Exit.PASS


def cmd_run(args: argparse.Namespace) -> int:
    from engine import evidence
    from engine.plan import build_plan, pick_mode, run_stamp, values_lines
    from engine.runner import RunInterrupted, execute
    from engine.verdict import judge
    spec = _valid_spec(args.spec)
    mode = pick_mode(spec.data, args.mode, os.environ)
    run_id = run_stamp()
    name = spec.data.get("name", "spec")
    run_dir = Path(args.run_dir or Path.cwd() / "runs" / f"{name}-{mode}-{run_id}").absolute()
    plan = build_plan(spec, mode=mode, sets=args.set, environ=os.environ,
                      builtins={"run_dir": str(run_dir), "run_id": run_id})
    print(f"spec {plan.name} mode {plan.mode}\nrun dir: {run_dir}", flush=True)
    print("\n".join(values_lines(plan.values, plan.sources)), flush=True)
    try:
        doc = execute(plan, run_dir, sys.stdout, judge=lambda ev: judge(plan, ev))
    except RunInterrupted as exc:  # the evidence is stored, judged and marked interrupted
        doc = exc.doc
    except KeyboardInterrupt:
        stored = evidence.path_of(run_dir).is_file()
        _err(f"interrupted before the verdict was stored in {run_dir}" if stored
             else f"interrupted before any evidence was written to {run_dir}")
        return Exit.INTERRUPTED
    _emit(doc, doc["checks"], doc["verdict"], args)
    return doc["verdict"]["exit_code"]


def _recheck(args: argparse.Namespace, replay: bool) -> int:
    from engine import evidence
    from engine.recheck import recheck
    saved = evidence.load(args.evidence)
    done = recheck(_valid_spec(args.spec), saved, Path(args.evidence), replay=replay,
                   spec_label=str(args.spec), note=_err)
    _emit(done.evidence, done.results, done.verdict, args)
    return done.verdict["exit_code"]


def cmd_diff(args: argparse.Namespace) -> int:
    from engine.diff import diff_main
    return diff_main(args)


def cmd_review(args: argparse.Namespace) -> int:
    from engine.review import review_main
    return review_main(args)


# ---------------------------------------------------------------- argparse

class _VersionAction(argparse.Action):
    """`--version`, looked up only when asked: importlib.metadata costs every other command time."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, help="show the version and exit")

    def __call__(self, parser: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> None:
        from engine import version
        print(f"engine {version()}", flush=True)
        parser.exit()


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="engine", description=__doc__, epilog=EPILOG,  # `engine --help` is the manual
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action=_VersionAction)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, help_text: str, func: Any, epilog: str = EPILOG) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text, description=help_text, epilog=epilog)
        p.set_defaults(func=func)
        return p

    def planning(p: argparse.ArgumentParser) -> None:
        p.add_argument("spec", metavar="SPEC")
        p.add_argument("--mode", help="mode to resolve (default: the spec's mode_env, then modes.default)")
        p.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                       help="override a value (parsed as a YAML scalar); repeatable")

    def reports(p: argparse.ArgumentParser) -> None:
        p.add_argument("--junit", metavar="FILE", help="also write a JUnit XML report")
        p.add_argument("--markdown", metavar="FILE", help=MARKDOWN_HELP)
        p.add_argument("-v", "--verbose", action="store_true", help="full explain trees")

    p = command("run", "run the spec's steps, then evaluate its checks", cmd_run)
    planning(p)
    p.add_argument("--run-dir", metavar="DIR", help="evidence directory (default runs/<name>-<mode>-<stamp>)")
    reports(p)

    p = command("validate", "check spec files (schema and semantics); nothing runs", cmd_validate)
    p.add_argument("specs", nargs="+", metavar="SPEC")

    planning(command("plan", "show the resolved plan for one mode; nothing runs", cmd_plan))
    command("schema", "print the spec JSON Schema", cmd_schema)

    for name, help_text in (
            ("check", "re-evaluate the spec's current checks against a saved run"),
            ("replay", "re-harvest a saved run's raw logs with the current output rules, then check")):
        p = command(name, help_text, functools.partial(_recheck, replay=name == "replay"))
        p.add_argument("spec", metavar="SPEC")
        p.add_argument("--evidence", required=True, metavar="RUN_DIR", help="the saved run's directory")
        reports(p)

    p = command("diff", "semantic diff of a spec: two files, or a spec at a git revision vs the "
                "working tree", cmd_diff, DIFF_EPILOG)
    p.add_argument("old", metavar="OLD|SPEC", help="the old spec, or with --base the spec in the working tree")
    p.add_argument("new", nargs="?", metavar="NEW", help="the new spec (not with --base)")
    p.add_argument("--base", metavar="REV",
                   help="compare the spec (and what it extends/includes) at this git revision")
    p.add_argument("--evidence", metavar="RUN_DIR", help="evaluate added/changed checks against this saved run")
    p.add_argument("--markdown", metavar="FILE", help=MARKDOWN_HELP)
    p.add_argument("--mode", help="only this mode (default: every mode of either side)")

    p = command("review", "review a change of the specs against a git revision: diff, saved-run re-check "
                "and which changes are risky", cmd_review, REVIEW_EPILOG)
    p.add_argument("specs", nargs="*", metavar="SPEC", help="only these specs (default: every spec under --specs)")
    p.add_argument("--base", required=True, metavar="REV", help="the git revision the change is reviewed against")
    p.add_argument("--accept-risk", action="store_true", help="risky changes are approved: exit 0")
    p.add_argument("--markdown", metavar="FILE", help=MARKDOWN_HELP)
    p.add_argument("--spec-dir", default="specs", metavar="DIR",
                   help="where the specs live (default specs; files others extend or include are fragments)")
    p.add_argument("--evidence-dir", default="evidence", metavar="DIR",
                   help="saved runs, one <spec stem>/ each (default evidence)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `engine` console script; returns the exit code."""
    parser = _parser()
    try:
        args = parser.parse_args(sys.argv[1:] if argv is None else list(argv))
    except SystemExit as exc:  # argparse: 0 for --help/--version, 2 for usage errors
        return int(exc.code or 0)
    try:
        return int(args.func(args))
    except KeyboardInterrupt:
        _err("interrupted")
        return Exit.INTERRUPTED
    except BrokenPipeError:  # `engine plan | head`: the reader left, nothing more to say
        return Exit.PASS
    except _refusals() as exc:
        _err(str(exc))
        return Exit.USAGE


if __name__ == "__main__":
    sys.exit(main())
