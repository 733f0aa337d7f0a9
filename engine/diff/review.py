"""`engine review --base REV`: review every spec of a change the way its reviewer should, and say
which changes need a human's approval.

For every spec (each YAML file under the specs directory that no other one extends or includes, at
the base or in the working tree): both sides are loaded, validated and planned (`engine diff`'s
sides), compared, the saved run under `evidence/<spec stem>/` is reviewed against the change (each
touched check evaluated old and new) and re-checked with the new spec, as `engine check` would; then
every change is classified (engine/diff/risk.py). Exit 0: nothing risky, or `--accept-risk`;
1: risky changes need approval; 2: an invalid spec on either side, unreadable evidence, or bad usage.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from dataclasses import dataclass
from dataclasses import field as dc_field
from pathlib import Path, PurePosixPath
from typing import Any, Mapping, Sequence, TextIO

from engine.diff.command import load_at_base
from engine.diff.compare import compare
from engine.diff.model import DiffError, Report, envs_text
from engine.diff.overrides import dependents, gates_reading, handed_over
from engine.diff.reach import false_where, never_runs, newly_skipped, where_text
from engine.diff.render import Out, lines_of, summary
from engine.diff.risk import WHY_RISKY, Risk, SavedRun, assess, limit_phrase, merge_modes
from engine.diff.saved_run import TIGHT, review_evidence, run_label, time_cuts
from engine.diff.sides import Revision, references, repo_root
from engine.diff.strictness import reads
from engine.diff.trust import trusted
from engine.diff.variants import default_env, switched
from engine.judge.recheck import Refused, recheck
from engine.run import evidence as evmod
from engine.show.report import write_file
from engine.text import code, printable

EXIT_SAFE, EXIT_RISKY, EXIT_INVALID = 0, 1, 2
SPEC_SUFFIXES = (".yaml", ".yml")


@dataclass
class SpecReview:
    path: str  # repo-relative
    status: str  # unchanged | changed | new | deleted | invalid
    report: Report | None = None
    errors: list[str] = dc_field(default_factory=list)  # an invalid side: every problem, file:line
    saved: SavedRun | None = None
    recheck: str = ""  # the re-check of the saved run with the new spec, in a phrase
    risks: list[Risk] = dc_field(default_factory=list)
    figures: list[Any] = dc_field(default_factory=list)  # the new spec's plots over the saved run
    notes: list[str] = dc_field(default_factory=list)  # what a reviewer should know and is not risky
    disabled: set[str] = dc_field(default_factory=set)  # the gates the new side disables


@dataclass
class Review:
    base: str  # as given
    commit: str  # its commit, abbreviated
    specs: list[SpecReview]
    accepted: bool = False

    @property
    def risks(self) -> list[Risk]:
        return [r for s in self.specs for r in s.risks]

    @property
    def invalid(self) -> bool:
        return any(s.status == "invalid" for s in self.specs)

    @property
    def exit_code(self) -> int:
        if self.invalid:
            return EXIT_INVALID
        return EXIT_RISKY if self.risks and not self.accepted else EXIT_SAFE


# ---------------------------------------------------------------- which specs


def users(files: Mapping[str, bytes]) -> dict[str, list[str]]:
    """File (repo-relative) -> the files among `files` that extend or include it: the fragments."""
    out: dict[str, list[str]] = {}
    for path, text in files.items():
        here = PurePosixPath(path).parent
        for ref in references(text):
            out.setdefault(_normal(here / ref), []).append(path)
    return out


def used(files: Mapping[str, bytes]) -> set[str]:
    """The files (repo-relative) that some file among `files` extends or includes: fragments."""
    return set(users(files))


def _normal(p: PurePosixPath) -> str:
    parts: list[str] = []
    for part in p.parts:
        if part == "..":
            if parts:
                parts.pop()
        elif part != ".":
            parts.append(part)
    return "/".join(parts)


def discover(revision: Revision, spec_dir: str, evidence_dir: str) -> list[str]:
    """Repo-relative paths of every spec under `spec_dir` at the base revision or in the working tree: a
    YAML file that no other one extends or includes on either side (lib/ fragments are reviewed through
    the specs that use them), one that has a saved run under `evidence_dir` (a spec someone runs, even if
    another spec now extends it), or one that was a spec at the base and that another now extends."""
    return _discover(revision, spec_dir, evidence_dir)[0]


def _discover(revision: Revision, spec_dir: str, evidence_dir: str) -> tuple[list[str], dict[str, list[str]]]:
    """(`discover`'s paths, spec at the base -> the files that now extend or include it, for each spec
    that this change turned into a fragment and that has no saved run to keep it reviewed)."""
    root = revision.root
    listed = revision.listing(spec_dir, evidence_dir)
    at_base = revision.read([p for p in listed if p.startswith(spec_dir + "/") and p.endswith(SPEC_SUFFIXES)])
    now = {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in sorted((root / spec_dir).rglob("*"))
        if p.suffix in SPEC_SUFFIXES and p.is_file()
    }
    base_users, now_users = users(at_base), users(now)
    saved = {PurePosixPath(p).parent.name for p in listed if p.endswith("/evidence.json")} | {
        p.parent.name for p in (root / evidence_dir).glob("*/evidence.json")
    }
    turned = {
        p: now_users[p]
        for p in at_base
        if p not in base_users and p in now and p in now_users and PurePosixPath(p).stem not in saved
    }
    fragments = set(base_users) | set(now_users)
    specs = (p for p in set(at_base) | set(now) if p not in fragments or PurePosixPath(p).stem in saved or p in turned)
    return sorted(specs), turned


# ---------------------------------------------------------------- one spec


def _saved_run(revision: Revision, rel_dir: str, tmp: Path) -> tuple[dict | None, dict | None, bool]:
    """(saved run now, saved run at the base, whether it changed): evidence documents, None when absent."""
    doc_path = f"{rel_dir}/evidence.json"
    now_file = revision.root / doc_path
    if now_file.exists() and not now_file.resolve().is_relative_to(revision.root.resolve()):
        # A PR's saved run is its files: a link that leads out of the repository is not one of them.
        raise evmod.EvidenceError(f"{doc_path} leads outside the repository ({now_file.resolve()}): refused")
    now = evmod.load(now_file.parent) if now_file.is_file() else None
    blob = revision.blob(doc_path)
    if blob is None:
        return now, None, now is not None
    if now_file.is_file() and now_file.read_bytes() == blob:
        return now, now, False
    where = tmp / "base-evidence" / rel_dir
    where.mkdir(parents=True, exist_ok=True)
    (where / "evidence.json").write_bytes(blob)
    try:
        base_doc = evmod.load(where)
    except evmod.EvidenceError as exc:
        raise evmod.EvidenceError(str(exc).replace(str(where), f"{revision.rev}:{rel_dir}")) from None
    return now, base_doc, True


def _failing(spec: Any, doc: Mapping[str, Any], run_dir: str) -> tuple[list[str] | None, list[str], str]:
    """Re-check a saved run with `spec` exactly as `engine check` does, writing nothing: (what fails,
    why it was refused, a phrase)."""
    try:
        done = recheck(spec, doc, Path(run_dir), replay=False, spec_label=run_dir, store=False)
    except Refused as exc:
        lines = str(exc).splitlines()
        steps = [line for line in lines[1:] if line.startswith("step ")]
        reason = lines[0].split(": ", 1)[-1].split(" (")[0].split(";")[0].rstrip(".,")
        names = ", ".join(line.split(":")[0].removeprefix("step ") for line in steps)
        return None, steps or lines[:1], f"refused by `engine check`: {reason}" + (f" ({names})" if names else "")
    except Exception as exc:  # a mode or override this side lacks: no re-check
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return None, [first], f"not re-checked: {first}"
    gates = [r for r in done.results if r.get("severity", "gate") == "gate"]
    passed = sum(1 for r in gates if r["outcome"] in ("PASS", "SKIPPED", "DISABLED"))
    return list(done.verdict["failed"]), [], f"{done.verdict['outcome']} ({passed}/{len(gates)} gates pass)"


def _figures(spec: Any, doc: Mapping[str, Any]) -> list[Any]:
    """The spec's plots over its saved run, as `engine check --markdown` draws them; none when the spec
    declares none or they cannot be evaluated (the re-check above says why the run does not fit)."""
    from engine.show.plots import for_spec

    try:
        return for_spec(spec, doc)
    except Exception:  # pictures are never a reason to fail a review
        return []


def review_spec(revision: Revision, rel: str, evidence_dir: str, tmp: Path) -> SpecReview:
    """Both sides of one spec, the diff, its saved run and its risks."""
    out = SpecReview(rel, "unchanged")
    spec_path = revision.root / rel
    try:
        left, right = load_at_base(spec_path, revision.rev, tmp / "base" / rel.replace("/", "_"), revision)
    except DiffError as exc:
        out.status, out.errors = "invalid", str(exc).splitlines()
        return out
    report = compare(left, right)
    out.report = report
    stem = PurePosixPath(rel).stem
    rel_dir = f"{evidence_dir}/{stem}"
    saved = SavedRun(rel_dir)
    try:
        now, at_base, renewed = _saved_run(revision, rel_dir, tmp)
    except evmod.EvidenceError as exc:
        out.status, out.errors = "invalid", [str(exc)]
        return out
    # What the saved run ran is never read from the change itself (trust.py).
    taken = trusted(now, at_base, renewed, left.spec, right.spec, rel_dir)
    now = taken.doc
    saved.at_base, saved.renewed, saved.rewritten = at_base is not None, taken.renewed, taken.rewritten
    if now is not None and right.spec is None:
        saved.mode = str(now.get("mode"))
        out.recheck = "not re-checked: the spec is deleted"
    elif now is not None:
        saved.mode, saved.run_label = str(now.get("mode")), run_label(now)
        sources, ran = now.get("sources") or {}, now.get("values") or {}
        saved.env = {n: str(ran[n]) for n in switched(right.data) if sources.get(n) == "env" and n in ran}
        memo: dict = {}
        report.evidence = review_evidence(report, left, right, rel_dir, now, memo)
        if report.status == "both":
            saved.cuts = time_cuts(report, left, right, now, memo)
            out.notes += [
                f"tight: {limit_phrase(c, saved)}: less than {TIGHT:g} times what it took"
                for c in saved.cuts
                if not c.below
            ]
        renames = report.old_side.renames if report.old_side is not None else {}
        if renames and not taken.renewed:
            shown = ", ".join(f"{a} -> {b}" for a, b in renames.items())
            out.notes.append(
                f"{rel_dir} names its legs as before the rename ({shown}): `engine check` refuses it until "
                "the spec is run again"
            )
        if taken.refused:
            saved.refused, out.recheck = [taken.refused], "not re-checked: its legs cannot be recomputed"
        else:
            saved.failing, saved.refused, out.recheck = _failing(right.spec, now, rel_dir)
        out.figures = _figures(right.spec, now)
        # Only what fails now can be newly failing: the base's re-check answers that alone.
        if saved.failing and at_base is not None and left.spec is not None:
            same = at_base is now and left.spec is right.spec  # nothing to re-check twice
            saved.failing_at_base = saved.failing if same else _failing(left.spec, at_base, rel_dir)[0]
    elif now is None:
        out.recheck = f"no saved run under {rel_dir}/"
    out.saved = saved
    out.status = report.status if report.status != "both" else ("changed" if report.changed else "unchanged")
    out.disabled = {c["name"] for plan in right.plans.values() for c in plan.checks if c.get("disabled")}
    out.risks = _risks(report, rel, saved, left, right, now, at_base)
    return out


def _gates(plans: Mapping[str, Any], disabled: bool = False) -> dict[str, set[str]]:
    """Key -> the names of its gate checks (the disabled ones too, with `disabled`)."""
    return {
        key: {
            c["name"]
            for c in plan.checks
            if (c.get("severity") or "gate") == "gate" and (disabled or not c.get("disabled"))
        }
        for key, plan in plans.items()
    }


def _risks(
    report: Report,
    rel: str,
    saved: SavedRun,
    left: Any,
    right: Any,
    now: Mapping[str, Any] | None,
    at_base: Mapping[str, Any] | None,
) -> list[Risk]:
    """Every risk of one spec's change: each mode of it under each target, and its saved run."""
    if report.status == "deleted":
        return assess(report, rel, saved, _gates(left.plans, disabled=True), {})
    side = right if right.spec is not None else left
    pairs = _pairs(report, right)
    new_plans = {**side.plans, **{key: p[3] for key, p in pairs.items()}}
    gates = _gates(new_plans)
    wheres = {
        key: {c["name"]: side.shown(f"{c['file']}:{c['line']}") for c in plan.checks if c.get("file")}
        for key, plan in new_plans.items()
    }
    old = report.old_side or left
    never = _never_run(report, old, right, {m: gates[m] for m in side.plans}, now, at_base)
    changes = [c for cs in report.raw_modes.values() for c in cs] + report.spec_changes
    when_changed = {c.subject for c in changes if c.section == "checks" and c.field == "when"}
    false_in = {n: where_text(keys, pairs) for n, keys in false_where(pairs, when_changed).items()}
    risks = assess(report, rel, saved, gates, wheres, never, false_in)
    all_gates = set().union(*gates.values()) if gates else set()
    skipped = newly_skipped(pairs, all_gates - when_changed - set(never)) if report.status == "both" else {}
    for name, keys in skipped.items():
        risks.append(_skipped_risk(rel, name, keys, pairs, changes, wheres))
    risks += _handed_over(report, rel, right)
    merged = merge_modes(risks)
    default = default_env(right)
    for r in merged:
        r.default_env = default
    return merged


def _pairs(report: Report, right: Any) -> dict[str, tuple[str, dict[str, str], Any, Any]]:
    """Key -> (mode, the target it is under, old plan, new plan): each mode both sides have under the
    spec's default target and under every other target (variants.py), the old plans renamed as compared."""
    old = report.old_side
    if old is None or old.spec is None or right.spec is None:
        return {}
    default = default_env(right)
    out = {m: (m, default, old.plans[m], right.plans[m]) for m in right.plans if m in old.plans}
    out.update(report.env_plans)
    return out


def _skipped_risk(
    rel: str, name: str, keys: list[str], pairs: Mapping[str, Any], changes: Sequence[Any], wheres: Mapping
) -> Risk:
    """A gate whose `when` is false where it was not: said with the modes and targets it no longer runs in."""
    mode, _, _, plan = pairs[keys[0]]
    check = next(c for c in plan.checks if c["name"] == name)
    read = {p[1] for p in reads({"when": check["when"], "let": check.get("let")}) if p[0] == "values" and len(p) > 1}
    places = [c.where for c in changes if c.section in ("values", "spec") and c.where and _head(c.subject) in read]
    places.append(wheres.get(keys[0], {}).get(name, ""))
    default = [k for k in keys if k == pairs[k][0]]  # a mode under the spec's default target
    what = f"gate {code(name)} no longer runs in {where_text(keys, pairs)}: `when: {check['when']}` is false there now"
    return Risk(
        "gate skipped in some modes",
        rel,
        name,
        what,
        next((p for p in places if p), ""),
        sorted({pairs[k][0] for k in keys}),
        targets=[pairs[k][1] for k in keys if k not in default],
        on_default=bool(default),
    )


def _handed_over(report: Report, rel: str, right: Any) -> list[Risk]:
    """An `env:` entry added (or pointed at another value): the value is the environment's to set now."""
    out = []
    for var, name, where in handed_over(report.spec_changes) if right.spec is not None else []:
        gates = gates_reading(right.plans.values(), dependents(right.data, name), reads)
        shown = ", ".join(code(g) for g in gates[:4]) + (f" and {len(gates) - 4} more" if len(gates) > 4 else "")
        what = f"`{name}` can now be set by the environment variable `{var}`" + (
            f": it decides {'gate' if len(gates) == 1 else f'{len(gates)} gates'} {shown}"
            if gates
            else " (no gate reads it by name; the legs or the checks may be written with it)"
        )
        out.append(Risk("value made overridable", rel, name, what, where, sorted(right.plans)))
    return out


def _head(subject: str) -> str:
    return subject.removeprefix("values.").split(".")[0]


def _never_run(
    report: Report,
    left: Any,
    right: Any,
    gates: Mapping[str, set[str]],
    now: Mapping[str, Any] | None,
    at_base: Mapping[str, Any] | None,
) -> dict[str, tuple[str, str]]:
    """Gate -> (why it never runs, where the change is), for the gates this change left with a `when`
    false in every mode that was not so at the base: asked only of gates whose check or whose values
    the change touched."""
    if report.status != "both" or right.spec is None:
        return {}
    changes = [c for cs in report.raw_modes.values() for c in cs] + report.spec_changes
    touched = {c.subject for c in changes if c.section == "checks"}
    moved = {c.subject.removeprefix("values.").split(".")[0] for c in changes if c.section in ("values", "spec")}
    candidates = {
        c["name"]
        for plan in right.plans.values()
        for c in plan.checks
        if c.get("when")
        and c["name"] in gates.get(plan.mode, ())
        and (c["name"] in touched or any(p[0] == "values" and p[1:2] and p[1] in moved for p in reads(c)))
    }
    if not candidates:
        return {}
    never = never_runs(right.spec, right.plans, candidates, now)
    if never and left.spec is not None:
        before = never_runs(left.spec, left.plans, never, at_base)
        never = {name: why for name, why in never.items() if name not in before}
    checks = {c["name"]: c for plan in right.plans.values() for c in plan.checks}
    out = {}
    for name, why in never.items():
        read = {p[1] for p in reads(checks[name]) if p[0] == "values" and len(p) > 1}
        # The `when` written, else a value it reads that moved, else the gate itself.
        places = [c.where for c in changes if c.section == "checks" and c.subject == name and c.field == "when"]
        places += [
            c.where
            for c in changes
            if c.section in ("values", "spec") and c.subject.removeprefix("values.").split(".")[0] in read
        ]
        places.append(right.shown(f"{checks[name]['file']}:{checks[name]['line']}"))
        out[name] = (why, next(p for p in places if p))
    return out


def build_review(
    base: str,
    specs: Sequence[str] | None = None,
    spec_dir: str = "specs",
    evidence_dir: str = "evidence",
    accept: bool = False,
    cwd: Path | None = None,
) -> Review:
    """Review every spec (or those named, paths relative to `cwd`) against git revision `base`."""
    cwd = cwd or Path.cwd()
    revision = Revision(repo_root(cwd), base)
    rel_dirs = [_repo_rel(revision.root, cwd, d) for d in (spec_dir, evidence_dir)]
    turned: dict[str, list[str]] = {}
    if specs:
        paths = [_repo_rel(revision.root, cwd, s) for s in specs]
    else:
        paths, turned = _discover(revision, rel_dirs[0], rel_dirs[1])
    stems: dict[str, str] = {}
    for p in paths:
        other = stems.setdefault(PurePosixPath(p).stem, p)
        if other != p:
            raise DiffError(
                f"{other} and {p} share the name {PurePosixPath(p).stem!r}: "
                f"{rel_dirs[1]}/{PurePosixPath(p).stem}/ cannot say whose saved run it is"
            )
    with tempfile.TemporaryDirectory(prefix="specprobe-review-") as tmp:
        reviews = [review_spec(revision, p, rel_dirs[1], Path(tmp)) for p in paths]
    by_path = {s.path: s for s in reviews}
    for path, readers in turned.items():
        by_path[path].risks.append(_fragment_risk(path, readers, by_path))
    return Review(base, revision.commit[:12], reviews, accept)


def _fragment_risk(path: str, readers: list[str], by_path: Mapping[str, SpecReview]) -> Risk:
    """A spec of the base that another file now extends: no longer reviewed as one, and the other may
    disable its gates (said when it does)."""
    own = by_path[path].disabled
    disabled = sorted({g for r in readers if r in by_path for g in by_path[r].disabled} - own)
    names = ", ".join(code(r) for r in readers)
    what = f"{code(path)}, a spec at the base with no saved run, is now read through {names}" + (
        f", which disable{'s' if len(readers) == 1 else ''} its gate{'s' if len(disabled) > 1 else ''} "
        + ", ".join(code(g) for g in disabled[:6])
        + (f" and {len(disabled) - 6} more" if len(disabled) > 6 else "")
        if disabled
        else ""
    )
    return Risk("spec turned into a fragment", path, path, what + ": `engine review` no longer reviews it as a spec")


def _repo_rel(root: Path, cwd: Path, path: str) -> str:
    full = (cwd / path).resolve()
    try:
        return full.relative_to(root).as_posix()
    except ValueError:
        raise DiffError(f"{path}: not inside the git work tree {root}") from None


# ---------------------------------------------------------------- rendering


def _headline(review: Review) -> str:
    n = len(grouped(review.risks))
    if review.invalid:
        bad = [s.path for s in review.specs if s.status == "invalid"]
        return f"INVALID: {', '.join(bad)} (fix the spec: nothing else is decided)"
    if not n:
        return "nothing risky"
    noun = "risky change" if n == 1 else "risky changes"
    if review.accepted:
        return f"{n} {noun}, accepted (--accept-risk)"
    return f"RISKY: {n} {noun} {'needs' if n == 1 else 'need'} approval"


def _spec_row(s: SpecReview) -> tuple[str, str, str, str]:
    what = {"invalid": "INVALID", "unchanged": "unchanged", "new": "new spec", "deleted": "deleted"}.get(s.status, "")
    if s.status in ("changed", "new") and s.report is not None:
        what = (what + "; " if what else "") + summary(s.report)
    risky = str(len(s.risks)) if s.risks else ("-" if s.status != "invalid" else "")
    return s.path, what, s.recheck or "-", risky


def _spec_table(out: Out, review: Review) -> None:
    """The headline and one row per spec: what changed, its saved run re-checked, its notes."""
    head = _headline(review)
    count = f"{len(review.specs)} spec{'s' if len(review.specs) != 1 else ''}"
    rows = [_spec_row(s) for s in review.specs]
    if out.md:
        out.lines += [
            f"## Spec review: {head}",
            "",
            f"{count}, base {code(review.base)} ({code(review.commit)}) -> this change",
            "",
            "| spec | change | saved run re-checked with the new spec | risky |",
            "|---|---|---|---|",
        ]
        out.lines += ["| " + " | ".join(_cell(x) for x in row) + " |" for row in rows]
        notes = [f"- {code(s.path)}: {note}" for s in review.specs for note in s.notes]
        out.lines += ["", *notes] if notes else []
        return
    out.lines += [f"engine review: {count}, base {review.base} ({review.commit}) -> working tree", head]
    width = max((len(r[0]) for r in rows), default=0)
    for s, (path, what, rechecked, risky) in zip(review.specs, rows):
        risk = f"; {risky} risky" if risky not in ("-", "") else ""
        out.lines.append(f"  {path:<{width}}  {what}{risk}")
        out.lines.append(f"  {'':<{width}}  saved run: {rechecked}")
        out.lines += [f"  {'':<{width}}  note: {note}" for note in s.notes]


def render_review(review: Review, markdown: bool = False) -> str:
    """The review as text (terminal) or Markdown (a PR comment)."""
    out = Out(markdown)
    _spec_table(out, review)
    for s in review.specs:
        if s.status == "invalid":
            out.head(f"{s.path}: invalid")
            out.lines += [f"    {e}" for e in s.errors] if not out.md else ["```", *s.errors, "```"]
    if review.risks:
        out.head("risky changes (approve with --accept-risk)" if not review.accepted else "risky changes (accepted)")
        for group in grouped(review.risks):
            r, where, at = group[0], _places(group, out), out.at(group[0].where)
            if out.md:
                out.lines.append(f"- **{r.kind}** in {where}: {r.what}{at}")
                out.lines.append(f"  - *why risky*: {r.why}")
            else:
                out.lines.append(f"  ! {r.kind} in {where}: {r.what}{at}")
                out.lines.append(f"      why risky: {r.why}")
    for s in review.specs:
        if s.report is None or s.status == "unchanged":
            continue
        if out.md:
            out.blank()
            out.lines += [f"<details><summary>{_html(s.path)}: {_html(summary(s.report))}</summary>", ""]
            lines_of(out, s.report, level=3)
            out.blank()
            out.lines.append("</details>")
        else:
            out.blank()
            out.lines.append("-" * 100)
            lines_of(out, s.report)
    if out.md:
        from engine.show import mermaid

        for s in review.specs:
            if s.figures and s.saved is not None:
                out.blank()
                out.lines += [
                    f"<details><summary>{_html(s.path)}: plots of the saved run {_html(s.saved.label)}/</summary>",
                    "",
                ]
                out.lines.append(mermaid.section(s.figures).rstrip("\n"))
                out.blank()
                out.lines.append("</details>")
    return printable("\n".join(out.lines).rstrip() + "\n")


def grouped(risks: Sequence[Risk]) -> list[list[Risk]]:
    """Risks that are one change seen through several specs or modes (a lib fragment they share),
    together: each group is listed once, with every spec and mode."""
    out: dict[tuple, list[Risk]] = {}
    for r in risks:
        out.setdefault((r.kind, r.subject, r.what, r.where), []).append(r)
    return list(out.values())


def _places(group: Sequence[Risk], out: Out) -> str:
    """`specs/a.yaml [mode smoke, soak], specs/b.yaml [mode soak; target gpu, real]`: the targets said
    where a risk is seen under another than the spec's default one."""

    def place(r: Risk) -> str:
        envs = ([r.default_env] if r.on_default and r.default_env else []) + r.targets
        where = ([f"mode {', '.join(r.modes)}"] if r.modes else []) + ([envs_text(envs)] if r.targets else [])
        return out.code(r.spec) + (f" [{'; '.join(where)}]" if where else "")

    return ", ".join(place(r) for r in group)


def _cell(text: str) -> str:
    # A spec's path and its summary come from the PR under review: as text in the comment, never as HTML.
    return _html(text).replace("|", "\\|").replace("\n", " ")


def _html(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


# ---------------------------------------------------------------- the command


def review_main(args: argparse.Namespace, stdout: TextIO | None = None, stderr: TextIO | None = None) -> int:
    """`engine review` (cli.py's `review` arguments): print the review; exit 0 safe (or accepted),
    1 risky, 2 invalid. `--markdown FILE` also writes it as Markdown; `--markdown -` prints Markdown."""
    stdout = stdout or sys.stdout
    stderr = stderr or sys.stderr
    try:
        review = build_review(args.base, args.specs, args.spec_dir, args.evidence_dir, args.accept_risk)
    except DiffError as exc:
        print(printable(str(exc)), file=stderr, flush=True)
        return EXIT_INVALID
    stdout.write(render_review(review, markdown=args.markdown == "-"))
    stdout.flush()
    if args.markdown and args.markdown != "-":
        write_file(args.markdown, render_review(review, markdown=True))
    return review.exit_code


__all__ = [
    "EXIT_INVALID",
    "EXIT_RISKY",
    "EXIT_SAFE",
    "WHY_RISKY",
    "Review",
    "SpecReview",
    "build_review",
    "discover",
    "render_review",
    "review_main",
]
