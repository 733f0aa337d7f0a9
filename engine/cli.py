"""engine: run a declarative probe spec, or re-check a saved run against it.

Usage (results go to stdout, diagnostics to stderr):

    engine validate specs/p4_smoke.yaml specs/p4_soak.yaml
    engine plan specs/p4_smoke.yaml --mode smoke --set steps=30
    engine run specs/p4_smoke.yaml --mode smoke --junit out/junit.xml --markdown out/summary.md
    engine run specs/p4_smoke.yaml --set repo=file:///tmp/store/probe/ckpt-1 --run-dir runs/try1
    engine run specs/p4_smoke.yaml --run-dir runs/try1 --from wipe_before_leg2
    engine check specs/p4_smoke.yaml --evidence runs/try1 --junit out/junit.xml
    engine replay specs/p4_smoke.yaml --evidence runs/try1 --html out/report.html
    engine schema > spec.schema.json
    engine diff specs/p4_soak.yaml --base origin/main --evidence runs/try1 --markdown -
    engine review --base origin/main --markdown review.md
    engine --version

`run` loads and validates the spec, resolves it for one mode (--mode, else the spec's mode_env
variable, else modes.default), prints the run directory and one line saying how many values there
are and which were overridden, and where (-v: every value with where it came from; secrets shown as
<redacted>), runs the steps, evaluates the checks, stores checks and verdict in
<run dir>/evidence.json and ends with one line:

    VERDICT <spec> PASS|FAIL|PRECONDITION|INTERRUPTED|ERROR [<failed names>] seconds <N>

The default run directory is runs/<name>-<mode>-<UTC stamp> under the current directory.
`--from STEP` resumes the run in --run-dir at STEP: that run's mode, values and run id, the steps
before STEP keep its evidence (refused when the spec changed them, or they did not pass), what the
steps from STEP on snapshot (`snapshot:`) is put back as they found it, and STEP and every step after
it run again. A reference step (`reference:`) is reused from the run that made it while its
definition and inputs are unchanged (`reusing reference from RUN_DIR (same definition)`);
`--fresh-reference` makes it anew.

`check` re-evaluates the spec's CURRENT checks, with its current values, against a saved run
without running anything (results go to <run dir>/check-<stamp>.json; evidence.json is left as it
was; each value that differs from the run's is listed on stderr). It refuses (exit 2) evidence of
another spec, and a run whose step definitions changed since, because the evidence would no
longer describe the spec. `replay` additionally re-harvests every run step from its saved raw log with
the spec's current output rules (prefix strip, markers), so a fixed harvest rule can be
verified without re-running a leg; output-rule changes are allowed there, nothing else.

`--markdown FILE` (run, check, replay, diff, review) also writes the report as Markdown to FILE, for a PR
comment or a job summary; `--markdown -` prints the Markdown on stdout instead of the text report.
It draws the spec's plots as Mermaid charts. `--html FILE` (run, check, replay) writes one
self-contained page: the verdict, the failure trees, the plots as SVG, the checks and the steps (no
script, nothing fetched); `--html -` prints it instead of the text report.

Exit codes: 0 pass, 5 a failed check or step, 2 invalid spec or usage, 3 a precondition
failed, 4 the run's record could not be written (a full disk: ERROR), 130 interrupted
(`engine diff`: 0 no semantic change, 1 changed, 2 invalid; `engine review`: 0 nothing risky or
accepted, 1 risky changes need approval, 2 invalid). A closed stdout changes no
exit code: the output is dropped and the VERDICT line goes to stderr.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import os
import sys
from pathlib import Path
from typing import Any, Mapping, Sequence

from engine.judge.verdict import Exit

# Imports are lazy, per command: `engine check` must answer in well under a second, so nothing a
# command does not use (the runner for `check`, the diff for `run`, never the trainer) loads.
EPILOG = (
    "exit codes: "
    + ", ".join(f"{int(c)} {c.name.lower()}" for c in Exit)
    + " (usage = invalid spec, bad arguments or a refused re-check; failed = a failed check or step,"
    " or a harvest problem)"
)
DIFF_EPILOG = "exit codes: 0 no semantic change, 1 a semantic change, 2 invalid spec or usage"
REVIEW_EPILOG = (
    "exit codes: 0 nothing risky (or --accept-risk), 1 risky changes need approval, "
    "2 invalid spec or evidence on either side, or usage"
)
MARKDOWN_HELP = "also write the report as Markdown to FILE; `-` prints it instead of the text report"
HTML_HELP = "also write a self-contained HTML report (plots as SVG) to FILE; `-` prints it instead of the text report"


class _Refused(Exception):
    """The request cannot be carried out as asked; the message says why (exit 2)."""


def _err(text: str) -> None:
    from engine.text import printable  # a spec's or a leg's text must not drive the terminal

    print(printable(text), file=sys.stderr, flush=True)


def _out(text: str, end: str = "\n") -> None:
    from engine.text import printable

    print(printable(text), end=end, flush=True)


def _valid_spec(path: str) -> Any:
    """The spec at `path`, loaded and validated; SpecErrors or _Refused listing every problem."""
    from engine.spec.load import load_spec
    from engine.spec.validate import findings

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
    from engine.judge.recheck import Refused
    from engine.run.evidence import EvidenceError
    from engine.spec.located import SpecErrors
    from engine.spec.values import UsageError

    return _Refused, SpecErrors, UsageError, EvidenceError, Refused


def _check_reports(args: argparse.Namespace) -> None:
    """Refuse (exit 2) before anything runs when --junit/--markdown/--html cannot be written: after
    an hour of legs, a traceback after the VERDICT line is the wrong way to find out."""
    from engine.show import report

    for flag, path in (("--junit", args.junit), ("--markdown", args.markdown), ("--html", args.html)):
        if path and path != "-":
            problem = report.writable_problem(path)
            if problem:
                raise _Refused(f"{flag} {path}: {problem}")


def _emit(
    evidence: Mapping[str, Any], results: list, verdict: Mapping[str, Any], args: argparse.Namespace, spec: Any = None
) -> int | None:
    """Write the report files, then print the report; Exit.USAGE when a file could not be
    written (said before the verdict is printed), else None."""
    from engine.show import report
    from engine.text import printable

    figures: list = []
    if (args.markdown or args.html) and spec is not None:
        from engine.show.plots import for_spec

        figures = for_spec(spec, evidence)
    markdown = report.markdown(evidence, results, verdict, figures) if args.markdown else ""
    page = ""
    if args.html:
        from engine.show import html as htmlreport

        page = htmlreport.render(evidence, results, verdict, figures)
    failed = None
    files = [(args.junit, lambda: report.junit(evidence, results, verdict))] if args.junit else []
    if args.markdown and args.markdown != "-":
        files.append((args.markdown, lambda: markdown))
    if args.html and args.html != "-":
        files.append((args.html, lambda: page))
    for path, render in files:
        try:
            report.write_file(path, render())
        except (OSError, ValueError) as exc:
            _err(
                f"could not write the report {path}: {getattr(exc, 'strerror', None) or exc} "
                f"(the run's evidence is stored; `engine check` renders it again)"
            )
            failed = Exit.USAGE
    # A leg's text inside the report (a harvested string, a failure line) must not drive the terminal.
    if args.markdown == "-":
        print(printable(markdown), end="", flush=True)
    elif args.html == "-":
        print(printable(page), end="", flush=True)
    else:
        print(printable(report.table(evidence, results, verdict, verbose=args.verbose)), flush=True)
    if getattr(sys.stdout, "lost", None):  # the reader left: the verdict still reaches someone
        _err(report.verdict_line((evidence.get("spec") or {}).get("name") or "spec", verdict))
    return failed


# ---------------------------------------------------------------- commands


def cmd_validate(args: argparse.Namespace) -> int:
    bad = False
    for path in args.specs:
        try:
            _valid_spec(path)
        except _refusals() as exc:
            bad = True
            errors = str(exc).splitlines()
            _out(f"INVALID {path}: {len(errors)} problem{'s' if len(errors) > 1 else ''}")
            _out("\n".join(errors))
        else:
            _out(f"OK {path}")
    return Exit.USAGE if bad else Exit.PASS


def cmd_plan(args: argparse.Namespace) -> int:
    from engine.spec.plan import build_plan

    plan = build_plan(_valid_spec(args.spec), mode=args.mode, sets=args.set, environ=os.environ)
    _out(plan.describe(), end="")
    return Exit.PASS


def cmd_schema(args: argparse.Namespace) -> int:
    from engine.spec.load import schema_text

    text = schema_text()
    print(text, end="" if text.endswith("\n") else "\n")
    return Exit.PASS


def cmd_run(args: argparse.Namespace) -> int:
    spec = _valid_spec(args.spec)
    if args.from_step:
        return _run_resumed(args, spec)
    plan, run_dir = _fresh_plan(args, spec)
    _refuse_before_running(args, spec, plan)
    lock = _hold(run_dir, force=args.force)
    try:
        return _run(args, spec, plan, run_dir)
    finally:
        lock.release()


def _refuse_before_running(args: argparse.Namespace, spec: Any, plan: Any) -> None:
    """What a run refuses before it touches the run dir: a budget a --set broke, a report it
    could not write."""
    from engine.spec.located import SpecErrors
    from engine.spec.validate import budget_error

    # validate checked the budget with the spec's own values; a --set can still push it over.
    over = budget_error(spec, plan.mode, plan.contributions())
    if over and not args.fresh_reference:
        from engine.run.reference import reusable

        # A reference that will be reused costs nothing.
        over = budget_error(spec, plan.mode, [c for c in plan.contributions() if not reusable(plan, c[0])])
    if over:
        raise SpecErrors([over])
    _check_reports(args)


def _hold(run_dir: Path, force: bool = False, resuming: bool = False) -> Any:
    """The run dir, taken for this engine (engine/run/record.py prepare_run_dir); a lock a gone
    engine left is taken over, and said."""
    from engine.run.record import RunDirError, prepare_run_dir

    try:
        lock = prepare_run_dir(run_dir, force=force, resuming=resuming)
    except RunDirError as exc:
        raise _Refused(str(exc)) from None
    if lock.took_over:
        _err(f"engine: took over the lock of {run_dir} from an engine that is gone ({lock.took_over})")
    return lock


def _run_resumed(args: argparse.Namespace, spec: Any) -> int:
    """`--from STEP`: the run dir held before the earlier run is read or anything is set aside; what
    the steps from STEP on snapshot put back (refused before anything moves when a copy cannot be),
    then the earlier run set aside; when the run could not store any evidence of its own (a full
    disk), the set-aside is undone."""
    from engine.judge.rerun import plan_resume, set_aside, snapshot_restores
    from engine.text import utc_second

    if not args.run_dir:
        raise _Refused(f"--from {args.from_step}: needs --run-dir DIR, the directory of the run to resume")
    if args.force:
        raise _Refused("--from resumes the run in --run-dir; --force (run over it) contradicts it")
    run_dir = Path(args.run_dir).absolute()
    lock = _hold(run_dir, resuming=True)
    try:
        resumed = plan_resume(spec, run_dir, args.from_step, sets=args.set, mode=args.mode, spec_label=str(args.spec))
        restores = snapshot_restores(run_dir, resumed)  # refused here, before anything moves
        _refuse_before_running(args, spec, resumed.plan)
        restored = _restore(run_dir, restores)
        aside = set_aside(run_dir, resumed)
        reuse = dataclasses.replace(resumed.reuse, set_aside=aside.folder if aside else None)
        try:
            return _run(args, spec, resumed.plan, run_dir, reuse, [*restored, *resumed.notes])
        finally:
            if aside is not None and not (run_dir / "evidence.json").is_file():
                left = aside.undo()
                _err(
                    f"engine: this run stored no evidence of its own, so the earlier run's files are back where "
                    f"they were: evidence.json holds the run of {utc_second(reuse.run_started_at)} again"
                    + (f" (but {'; '.join(left)})" if left else "")
                    + f"; resume it again with --from {args.from_step}"
                )
    finally:
        lock.release()


def _run(
    args: argparse.Namespace, spec: Any, plan: Any, run_dir: Path, reuse: Any = None, notes: Sequence[str] = ()
) -> int:
    """The run itself, in a run dir this engine holds: its report, and its exit code."""
    from engine.judge.verdict import store_verdict
    from engine.run import evidence
    from engine.run.runner import RunInterrupted, start
    from engine.run.signals import StopSignals
    from engine.spec.plan import values_lines, values_summary

    _out(f"spec {plan.name} mode {plan.mode}\nrun dir: {run_dir}")
    if reuse is not None:
        _out(_resuming_line(reuse))
    for note in notes:
        _out(note)
    env_vars = {name: var for var, name in (spec.data.get("env") or {}).items() if var in os.environ}
    _out(
        "\n".join(values_lines(plan.values, plan.sources, plan.secret_names))
        if args.verbose
        else values_summary(plan.values, plan.sources, plan.mode, env_vars, plan.secret_names)
    )
    # Held until the report is out: a Ctrl-C after the first must not cut the evidence, the
    # verdict or its exit code short.
    with StopSignals(linger=True) as stops:
        try:
            runner = start(plan, run_dir, sys.stdout, reuse=reuse, fresh_reference=args.fresh_reference)
            ran = runner.execute(stops)
        except RunInterrupted as exc:  # the evidence is stored and marked interrupted
            ran = exc.doc
        except KeyboardInterrupt:
            stored = evidence.path_of(run_dir).is_file()
            _err(
                f"interrupted before the verdict was stored in {run_dir}"
                if stored
                else f"interrupted before any evidence was written to {run_dir}"
            )
            return Exit.INTERRUPTED
        # The steps are over and the signals no longer raise: the verdict is judged and stored whole.
        doc = store_verdict(plan, ran, runner.record)
        failed = _emit(doc, doc["checks"], doc["verdict"], args, spec)
        if stops.count and doc["verdict"]["outcome"] != "INTERRUPTED":
            _err("engine: interrupted after the last step had finished; the verdict stands")
    code = doc["verdict"]["exit_code"]
    # A full disk fails the reports too; what the run could not record is the news, not them.
    return code if code == Exit.ERROR else failed or code


def _fresh_plan(args: argparse.Namespace, spec: Any) -> tuple[Any, Path]:
    """The plan of a new run and its run directory (--run-dir, else a fresh one under runs/)."""
    from engine.spec.plan import build_plan, pick_mode, run_stamp

    mode = pick_mode(spec.data, args.mode, os.environ)
    run_id = run_stamp()
    name = spec.data.get("name", "spec")
    run_dir = Path(args.run_dir).absolute() if args.run_dir else _fresh_run_dir(name, mode, run_id)
    plan = build_plan(
        spec, mode=mode, sets=args.set, environ=os.environ, builtins={"run_dir": str(run_dir), "run_id": run_id}
    )
    return plan, run_dir


def _restore(run_dir: Path, restores: list) -> list[str]:
    """`--from`: put back what the steps from STEP on found when they first ran (their snapshots);
    the lines that say so. Refused (exit 2) when one cannot be put back."""
    if not restores:
        return []
    from engine.judge.rerun import restore_snapshots
    from engine.run.snapshot import SnapshotError

    said: list[str] = []
    try:
        restore_snapshots(run_dir, restores, said.append)
    except (SnapshotError, OSError) as exc:
        raise _Refused("\n".join([*said, f"--run-dir {run_dir}: could not restore a snapshot: {exc}"])) from None
    return said


def _resuming_line(reuse: Any) -> str:
    """What `--from` keeps of the earlier run, said before anything runs."""
    from engine.text import utc_second

    kept = ", ".join(reuse.records) or "nothing"
    aside = (
        f"; its evidence and the logs of the steps that run again are in {reuse.set_aside}/" if reuse.set_aside else ""
    )
    return f"resuming at {reuse.from_step}: reusing {kept} from the run of {utc_second(reuse.run_started_at)}{aside}"


def _fresh_run_dir(name: str, mode: str, run_id: str) -> Path:
    """runs/<name>-<mode>-<stamp>, with -2, -3, ... when a run of the same second has it."""
    base = Path.cwd() / "runs" / f"{name}-{mode}-{run_id}"
    path, n = base, 1
    while os.path.lexists(path):
        n += 1
        path = base.with_name(f"{base.name}-{n}")
    return path.absolute()


def _recheck(args: argparse.Namespace, replay: bool) -> int:
    from engine.judge.recheck import recheck
    from engine.run import evidence

    saved = evidence.load(args.evidence)
    spec = _valid_spec(args.spec)
    _check_reports(args)
    done = recheck(spec, saved, Path(args.evidence), replay=replay, spec_label=str(args.spec), note=_err)
    return _emit(done.evidence, done.results, done.verdict, args, spec) or done.verdict["exit_code"]


def cmd_diff(args: argparse.Namespace) -> int:
    from engine.diff.command import diff_main

    return diff_main(args)


def cmd_review(args: argparse.Namespace) -> int:
    from engine.diff.review import review_main

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
        prog="engine",
        description=__doc__,
        epilog=EPILOG,  # `engine --help` is the manual
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action=_VersionAction)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _run_command(sub)
    p = _command(sub, "validate", "check spec files (schema and semantics); nothing runs", cmd_validate)
    p.add_argument("specs", nargs="+", metavar="SPEC")
    _planning(_command(sub, "plan", "show the resolved plan for one mode; nothing runs", cmd_plan))
    _command(sub, "schema", "print the spec JSON Schema", cmd_schema)
    for name, help_text in (
        ("check", "re-evaluate the spec's current checks against a saved run"),
        ("replay", "re-harvest a saved run's raw logs with the current output rules, then check"),
    ):
        p = _command(sub, name, help_text, functools.partial(_recheck, replay=name == "replay"))
        p.add_argument("spec", metavar="SPEC")
        p.add_argument("--evidence", required=True, metavar="RUN_DIR", help="the saved run's directory")
        _reports(p)
    _diff_command(sub)
    _review_command(sub)
    return parser


def _command(sub: Any, name: str, help_text: str, func: Any, epilog: str = EPILOG) -> argparse.ArgumentParser:
    p = sub.add_parser(name, help=help_text, description=help_text, epilog=epilog)
    p.set_defaults(func=func)
    return p


def _planning(p: argparse.ArgumentParser) -> None:
    """The arguments that resolve a spec into a plan (run and plan)."""
    p.add_argument("spec", metavar="SPEC")
    p.add_argument("--mode", help="mode to resolve (default: the spec's mode_env, then modes.default)")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="override a value (parsed as a YAML scalar); repeatable",
    )


def _reports(p: argparse.ArgumentParser) -> None:
    """The report files a verdict can also be written to (run, check, replay)."""
    p.add_argument("--junit", metavar="FILE", help="also write a JUnit XML report")
    p.add_argument("--markdown", metavar="FILE", help=MARKDOWN_HELP)
    p.add_argument("--html", metavar="FILE", help=HTML_HELP)
    p.add_argument(
        "-v", "--verbose", action="store_true", help="full explain trees (`run`: also every value, with its source)"
    )


def _run_command(sub: Any) -> None:
    p = _command(sub, "run", "run the spec's steps, then evaluate its checks", cmd_run)
    _planning(p)
    p.add_argument("--run-dir", metavar="DIR", help="evidence directory (default runs/<name>-<mode>-<stamp>)")
    p.add_argument(
        "--force",
        action="store_true",
        help="run into an existing, non-empty --run-dir (its evidence and logs are replaced)",
    )
    p.add_argument(
        "--from",
        dest="from_step",
        metavar="STEP",
        help="resume the run in --run-dir at STEP: the steps before it keep that run's evidence (refused "
        "when the spec changed them, or they did not pass); what the steps from STEP on snapshot is put back "
        "first; STEP and the steps after it run again",
    )
    p.add_argument(
        "--fresh-reference",
        action="store_true",
        help="make every reference step anew instead of reusing the saved reference",
    )
    _reports(p)


def _diff_command(sub: Any) -> None:
    p = _command(
        sub,
        "diff",
        "semantic diff of a spec: two files, or a spec at a git revision vs the working tree",
        cmd_diff,
        DIFF_EPILOG,
    )
    p.add_argument("old", metavar="OLD|SPEC", help="the old spec, or with --base the spec in the working tree")
    p.add_argument("new", nargs="?", metavar="NEW", help="the new spec (not with --base)")
    p.add_argument("--base", metavar="REV", help="compare the spec (and what it extends/includes) at this git revision")
    p.add_argument(
        "--evidence",
        metavar="RUN_DIR",
        help="judge every check the change touches on this saved run, old and new, with their numbers",
    )
    p.add_argument("--markdown", metavar="FILE", help=MARKDOWN_HELP)
    p.add_argument("--mode", help="only this mode (default: every mode of either side)")


def _review_command(sub: Any) -> None:
    p = _command(
        sub,
        "review",
        "review a change of the specs against a git revision: diff, saved-run re-check and which changes are risky",
        cmd_review,
        REVIEW_EPILOG,
    )
    p.add_argument("specs", nargs="*", metavar="SPEC", help="only these specs (default: every spec under --specs)")
    p.add_argument("--base", required=True, metavar="REV", help="the git revision the change is reviewed against")
    p.add_argument("--accept-risk", action="store_true", help="risky changes are approved: exit 0")
    p.add_argument("--markdown", metavar="FILE", help=MARKDOWN_HELP)
    p.add_argument(
        "--spec-dir",
        default="specs",
        metavar="DIR",
        help="where the specs live (default specs; files others extend or include are fragments)",
    )
    p.add_argument(
        "--evidence-dir", default="evidence", metavar="DIR", help="saved runs, one <spec stem>/ each (default evidence)"
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `engine` console script; returns the exit code."""
    from engine.run.console import SafeStream
    from engine.secrets import url_credentials

    saved = sys.stdout, sys.stderr
    masks = url_credentials(list(sys.argv[1:] if argv is None else argv))
    # A reader that leaves early (`engine run SPEC | head -1`) must not decide the exit code.
    out = sys.stdout = SafeStream(sys.stdout, "stdout", masks)
    sys.stderr = SafeStream(sys.stderr, "stderr", masks)
    try:
        return _main(argv)
    finally:
        if out.lost and not out.lost.startswith("closed before"):
            _err(f"engine: standard output was lost ({out.lost}); the rest of the output was dropped")
        sys.stdout, sys.stderr = saved


def _main(argv: Sequence[str] | None) -> int:
    parser = _parser()
    try:
        args = parser.parse_args(sys.argv[1:] if argv is None else list(argv))
    except SystemExit as exc:  # argparse: 0 for --help/--version, 2 for usage errors
        return int(exc.code or 0)
    if getattr(args, "markdown", None) == "-" and getattr(args, "html", None) == "-":
        _err("--markdown - and --html - would both print on stdout; give one of them a FILE")
        return Exit.USAGE
    try:
        return int(args.func(args))
    except KeyboardInterrupt:
        _err("interrupted")
        return Exit.INTERRUPTED
    except _refusals() as exc:
        _err(str(exc))
        return Exit.USAGE


if __name__ == "__main__":
    sys.exit(main())
