"""`engine diff`: what a spec change means, mode by mode, for the reviewer of a PR.

    engine diff OLD.yaml NEW.yaml                     two files
    engine diff specs/p4_soak.yaml --base origin/main the spec at a git revision vs the working tree
    engine diff ... --evidence runs/p4_soak-soak-X    added/changed checks evaluated on a saved run
    engine diff ... --markdown                        Markdown for a PR comment / job summary

Both sides are loaded, merged (extends/include at their own revision), validated and resolved into
a plan for every mode with the SAME fixed builtins and an empty environment, so only the spec can
make a difference: run_dir, run_id or the reviewer's shell never show up as changes. Plans are then
compared field by field: JMESPath is compared by syntax tree and prose by words, so reordering keys
or reformatting YAML gives an empty diff.

Exit codes: 0 no semantic change, 1 a semantic change, 2 an invalid spec on either side or bad usage.
"""
from __future__ import annotations

import argparse
import difflib
import json
import os
import posixpath
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field as dc_field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import yaml

EXIT_SAME, EXIT_CHANGED, EXIT_INVALID = 0, 1, 2

# Every run gets its own of these; both sides get the same placeholders so they never differ.
FIXED_BUILTINS: dict[str, str] = {"python": "<python>", "work_dir": "<work_dir>",
                                  "spec_dir": "<spec_dir>", "run_dir": "<run_dir>",
                                  "run_id": "<run_id>"}
BUILTIN_NAMES = (*FIXED_BUILTINS, "mode")
ABSENT = object()  # a key one side lacks (None is a legitimate value)
# Step fields that are labels or locations, never behaviour.
_STEP_IGNORED = ("name", "file", "line")
# Fields compared as JMESPath (by syntax tree) and as prose (by words).
_EXPR_FIELDS = ("expr", "when")
_PROSE_FIELDS = ("why", "description", "precondition")
# Fields of a step that only bound how long it may take: a run that finished within both the old and
# the new limit did exactly what it would have done under the new one.
_TIME_FIELDS = ("run.timeout_s", "run.grace_s")
# Parts of a step's evidence produced by its output rules (what `engine replay` re-derives).
_HARVESTED = ("harvest", "harvest_errors", "failure_lines", "progress", "lines", "tail")


class DiffError(Exception):
    """Bad usage, an unreadable revision, an invalid spec: the message says which (exit 2)."""


# ================================================================ loading both sides

@dataclass
class Side:
    """One side of the diff: the loaded spec (None when the file does not exist there) and its plans."""
    label: str
    spec: Any | None
    plans: dict[str, Any] = dc_field(default_factory=dict)  # mode -> Plan

    @property
    def data(self) -> dict:
        return self.spec.data if self.spec is not None else {}


def _git(args: Sequence[str], cwd: Path) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(["git", *args], cwd=cwd, capture_output=True)
    except FileNotFoundError:
        raise DiffError("--base needs git, and no `git` is on PATH") from None


def repo_root(start: Path) -> Path:
    """Top of the git work tree containing `start` (a directory)."""
    proc = _git(["rev-parse", "--show-toplevel"], start)
    if proc.returncode != 0:
        raise DiffError(f"{start}: not inside a git work tree (--base needs one): "
                        f"{proc.stderr.decode(errors='replace').strip()}")
    return Path(proc.stdout.decode().strip()).resolve()


def _references(text: bytes) -> list[str]:
    """The paths a spec file extends/includes, as written; [] when it does not parse (load_spec says why)."""
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError:
        return []
    if not isinstance(doc, dict):
        return []
    refs = [doc["extends"]] if isinstance(doc.get("extends"), str) else []
    refs += [i for i in doc.get("include") or [] if isinstance(i, str)] \
        if isinstance(doc.get("include"), list) else []
    return refs


def materialise(spec: Path, rev: str, dest: Path) -> Path | None:
    """Write the spec as it was at `rev`, with every file it extends/includes AT THAT REVISION, under
    `dest` mirroring repo-relative paths; return the spec's path there, or None if it did not exist."""
    start = spec.parent if spec.parent.is_dir() else Path.cwd()
    root = repo_root(start)
    try:
        rel = spec.resolve().relative_to(root).as_posix()
    except ValueError:
        raise DiffError(f"{spec}: not inside the git work tree {root}") from None
    proc = _git(["rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"], root)
    if proc.returncode != 0:
        raise DiffError(f"--base {rev}: not a revision of the repository at {root}")
    commit = proc.stdout.decode().strip()
    queue, seen = [rel], set()
    while queue:
        path = queue.pop(0)
        if path in seen:
            continue
        seen.add(path)
        blob = _git(["cat-file", "blob", f"{commit}:{path}"], root)
        if blob.returncode != 0:
            if path == rel:
                return None
            continue  # load_spec reports the missing parent at the line that names it
        target = dest / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(blob.stdout)
        for ref in _references(blob.stdout):
            joined = posixpath.normpath(posixpath.join(posixpath.dirname(path), ref))
            if not joined.startswith("../") and joined != "..":
                queue.append(joined)
    return dest / rel


def _relabel(text: str, tmp: Path | None, prefix: str) -> str:
    """Errors in a materialised revision name `REV:path`, not a temp directory."""
    if tmp is None:
        return text
    # load_spec shows paths relative to the cwd when below it, else absolute: undo every form.
    for form in sorted({str(tmp), str(tmp.resolve()), os.path.relpath(tmp)}, key=len, reverse=True):
        text = text.replace(form + os.sep, prefix)
    return text


def load_side(path: Path, label: str, tmp: Path | None = None, rev_prefix: str = "") -> Side:
    """Load + validate + plan every mode; DiffError (exit 2) listing every problem when invalid."""
    from engine.plan import build_plan, mode_names
    from engine.spec import SpecErrors, load_spec
    from engine.values import UsageError
    try:
        spec = load_spec(path)
        errors = [str(e) for e in _validate(spec)]
        if errors:
            raise DiffError("\n".join(errors))
        side = Side(label, spec)
        for mode in mode_names(spec.data) or ["default"]:
            side.plans[mode] = build_plan(spec, mode=mode, environ={}, builtins=FIXED_BUILTINS)
        return side
    except SpecErrors as exc:
        raise DiffError(_relabel(f"{label}: invalid spec\n{exc}", tmp, rev_prefix)) from None
    except UsageError as exc:
        raise DiffError(_relabel(f"{label}: {exc}", tmp, rev_prefix)) from None
    except DiffError as exc:
        raise DiffError(_relabel(f"{label}: invalid spec\n{exc}", tmp, rev_prefix)) from None


def _validate(spec: Any) -> list[Any]:
    from engine.validate import validate
    return validate(spec, environ={})


# ================================================================ comparing

@dataclass
class Change:
    """One semantic difference. `old`/`new` are ABSENT when the thing exists on one side only."""
    section: str  # spec | values | steps | checks
    op: str  # added | removed | changed | reordered
    subject: str  # the value / step / check / spec key concerned
    field: str = ""  # for a changed step or check: which field ("run.argv", "expr", ...)
    old: Any = ABSENT
    new: Any = ABSENT
    extra: dict[str, Any] = dc_field(default_factory=dict)  # rendering details (a step's summary ...)

    def key(self) -> str:
        """Identity for grouping the same change across modes: what a reader sees of it. An argument
        list is keyed by its token delta, so `added --verify-pushes after --prune` is one change
        even where the rest of the command differs by mode."""
        def j(v: Any) -> Any:
            return "<absent>" if v is ABSENT else v
        payload: Any = [j(self.old), j(self.new)]
        if self.op == "changed" and _scalar_list(self.old) and _scalar_list(self.new):
            payload = _argv_delta(self.old, self.new)
        return json.dumps([self.section, self.op, self.subject, self.field, payload, self.extra],
                          sort_keys=True, default=str)


@dataclass
class Budget:
    old_budget: float | None
    old_worst: float
    new_budget: float | None
    new_worst: float


@dataclass
class ModeDiff:
    mode: str
    status: str  # both | added | removed
    changes: list[Change] = dc_field(default_factory=list)
    budget: Budget | None = None  # when the worst case or the budget moved


@dataclass
class Report:
    old_label: str
    new_label: str
    name: str
    spec_changes: list[Change]
    common: list[Change]  # identical in every mode both sides have (shown once)
    common_modes: list[str]
    modes: list[ModeDiff]
    raw_modes: dict[str, list[Change]]  # per mode, before factoring (what evidence review reads)
    evidence: "EvidenceReview | None" = None

    @property
    def changed(self) -> bool:
        return bool(self.spec_changes or self.common or any(m.changes or m.status != "both"
                                                            for m in self.modes))


def _words(text: Any) -> Any:
    return " ".join(text.split()) if isinstance(text, str) else text


def _expr_tree(text: Any) -> Any:
    """JMESPath by syntax tree: `a==b` and `a == b` (or a re-folded YAML string) are the same check."""
    if not isinstance(text, str):
        return text
    try:
        import jmespath
        return json.dumps(jmespath.compile(text).parsed, sort_keys=True)
    except Exception:  # noqa: BLE001 - an unparsable expression compares as its words
        return _words(text)


def _normal(field_name: str, value: Any) -> Any:
    last = field_name.rsplit(".", 1)[-1]
    if last in _EXPR_FIELDS:
        return _expr_tree(value)
    if last in _PROSE_FIELDS:
        return _words(value)
    return value


def _same(field_name: str, a: Any, b: Any) -> bool:
    if a is ABSENT or b is ABSENT:
        return a is b
    return _normal(field_name, a) == _normal(field_name, b)


def flatten(obj: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested mappings -> dotted keys; lists and empty mappings are leaves."""
    out: dict[str, Any] = {}
    for k, v in obj.items():
        key = f"{prefix}.{k}" if prefix else str(k)
        if isinstance(v, dict) and v:
            out.update(flatten(v, key))
        else:
            out[key] = v
    return out


# Fields a reviewer reads first: whether it runs, what it runs, how long it may take; output last.
_FIELD_ORDER = ("kind", "enabled", "when", "run.argv", "run.env", "run.cwd", "run.timeout_s",
                "run.grace_s", "run.ok_exit_codes", "run.precondition", "run.stop_on_failure",
                "run.signals", "run.progress", "run.on_failure", "run.output", "remove", "collect")


def _field_rank(name: str) -> int:
    for i, prefix in enumerate(_FIELD_ORDER):
        if name == prefix or name.startswith(prefix + "."):
            return i
    return len(_FIELD_ORDER)


def _field_diffs(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[tuple[str, Any, Any]]:
    """(dotted field, old, new) for every field that differs, most telling fields first."""
    a, b = flatten(old), flatten(new)
    out = []
    keys = list(b) + [k for k in a if k not in b]
    for k in sorted(keys, key=_field_rank):  # stable: same-rank fields keep the spec's order
        va, vb = a.get(k, ABSENT), b.get(k, ABSENT)
        # `harvest: {}` on one side and `harvest.run_json.*` on the other: the sub-keys say it all.
        if (va is ABSENT and vb == {}) or (vb is ABSENT and va == {}):
            continue
        if not _same(k, va, vb):
            out.append((k, va, vb))
    return out


def _secret_safe(values: Mapping[str, Any]) -> dict[str, Any]:
    from engine.values import redact
    return redact(values)


def _step_body(step: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in step.items() if k not in _STEP_IGNORED}


def _step_summary(step: Mapping[str, Any]) -> dict[str, Any]:
    """What a reviewer needs to see of an added step."""
    out: dict[str, Any] = {"kind": step["kind"], "enabled": step.get("enabled", True),
                           "when": step.get("when")}
    if step["kind"] == "run":
        r = step["run"]
        out.update(argv=r["argv"], timeout_s=r["timeout_s"], grace_s=r["grace_s"])
    elif step["kind"] == "remove":
        out["remove"] = step["remove"]
    else:
        out["collect"] = step["collect"]
    return out


def _check_fields(check: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in check.items() if k not in ("name", "file", "line")}


def diff_values(old: Any, new: Any) -> list[Change]:
    a = {k: v for k, v in _secret_safe(old.values).items() if k not in BUILTIN_NAMES}
    b = {k: v for k, v in _secret_safe(new.values).items() if k not in BUILTIN_NAMES}
    raw_a, raw_b = old.values, new.values
    out = []
    for k in list(b) + [k for k in a if k not in b]:
        if k not in a:
            out.append(Change("values", "added", k, new=b[k]))
        elif k not in b:
            out.append(Change("values", "removed", k, old=a[k]))
        elif raw_a[k] != raw_b[k]:
            if isinstance(a[k], dict) and isinstance(b[k], dict) and a[k] and b[k]:
                # A mapping value (a leg's env): the keys that moved, not two walls of JSON.
                out += [Change("values", "changed" if va is not ABSENT and vb is not ABSENT else
                               ("added" if va is ABSENT else "removed"), f"{k}.{f}", old=va, new=vb)
                        for f, va, vb in _field_diffs(a[k], b[k])] or \
                    [Change("values", "changed", k, old=a[k], new=b[k])]
            else:
                # A secret that changed is a change; its text is still never shown.
                out.append(Change("values", "changed", k, old=a[k], new=b[k]))
    return out


def _hider(plan: Any) -> Callable[[str, Any], Any]:
    """Shows a step field without secrets: secret values' text anywhere, and whole fields whose
    name looks secret (an `env.HF_TOKEN` written literally in the spec)."""
    from engine.evidence import REDACTED, Scrubber, is_secret
    scrubber = Scrubber.for_run(plan.values, {}, getattr(plan, "secret_names", ()))

    def hide(fname: str, value: Any) -> Any:
        if value is ABSENT:
            return value
        if any(is_secret(part) for part in fname.split(".")):
            return REDACTED
        return scrubber.scrub_obj(value)
    return hide


def diff_steps(old: Any, new: Any) -> list[Change]:
    a = {s["name"]: s for s in old.steps}
    b = {s["name"]: s for s in new.steps}
    hide_old, hide_new = _hider(old), _hider(new)
    out = []
    common_old = [n for n in a if n in b]
    common_new = [n for n in b if n in a]
    if common_old != common_new:
        out.append(Change("steps", "reordered", "", old=list(a), new=list(b)))
    for name, step in b.items():
        if name not in a:
            out.append(Change("steps", "added", name, new=hide_new("", _step_summary(step))))
            continue
        for fname, va, vb in _field_diffs(_step_body(a[name]), _step_body(step)):
            # A change only in a secret's text is still a change; it just shows as redacted.
            out.append(Change("steps", "changed", name, fname, hide_old(fname, va), hide_new(fname, vb)))
    out += [Change("steps", "removed", n, old=hide_old("", _step_summary(s)))
            for n, s in a.items() if n not in b]
    return out


def diff_checks(old_checks: Sequence[Mapping[str, Any]], new_checks: Sequence[Mapping[str, Any]]
                ) -> list[Change]:
    a = {c["name"]: c for c in old_checks}
    b = {c["name"]: c for c in new_checks}
    out = []
    for name, check in b.items():
        if name not in a:
            out.append(Change("checks", "added", name, new=_check_fields(check)))
            continue
        fa, fb = _check_fields(a[name]), _check_fields(check)
        for fname in list(fb) + [k for k in fa if k not in fb]:
            va, vb = fa.get(fname, ABSENT), fb.get(fname, ABSENT)
            if fname == "severity":  # an unset severity is a gate
                va, vb = va or "gate", vb or "gate"
            if not _same(fname, va, vb) and not (va in (None, ABSENT) and vb in (None, ABSENT)):
                out.append(Change("checks", "changed", name, fname, va, vb))
    out += [Change("checks", "removed", n, old=_check_fields(c)) for n, c in a.items() if n not in b]
    return out


def diff_plans(old: Any, new: Any) -> tuple[list[Change], Budget | None]:
    changes = diff_values(old, new) + diff_steps(old, new) + diff_checks(old.checks, new.checks)
    budget = None
    if old.worst_case_s != new.worst_case_s or old.budget_s != new.budget_s:
        budget = Budget(old.budget_s, old.worst_case_s, new.budget_s, new.worst_case_s)
    return changes, budget


_SPEC_KEYS = ("name", "description", "version", "budget_s", "mode_env")


def diff_spec_level(old: Mapping[str, Any], new: Mapping[str, Any],
                    per_mode: Mapping[str, list[Change]]) -> list[Change]:
    """Changes not tied to one mode: header keys, env mapping, default mode, value definitions that
    changed without changing any mode's resolved value (they matter under --set / env overrides)."""
    from engine.values import REDACTED, is_secret
    out = []
    for k in _SPEC_KEYS:
        va, vb = old.get(k, ABSENT), new.get(k, ABSENT)
        if not _same(k, va, vb):
            out.append(Change("spec", "changed", k, old=va, new=vb))
    da = (old.get("modes") or {}).get("default", ABSENT)
    db = (new.get("modes") or {}).get("default", ABSENT)
    if da != db:
        out.append(Change("spec", "changed", "modes.default", old=da, new=db))
    ea, eb = old.get("env") or {}, new.get("env") or {}
    for var in list(eb) + [v for v in ea if v not in eb]:
        if ea.get(var, ABSENT) != eb.get(var, ABSENT):
            out.append(Change("spec", "changed", f"env.{var}", old=ea.get(var, ABSENT),
                              new=eb.get(var, ABSENT)))
    moved = {c.subject.split(".")[0] for changes in per_mode.values() for c in changes
             if c.section == "values"}
    va, vb = old.get("values") or {}, new.get("values") or {}
    for name in list(vb) + [n for n in va if n not in vb]:
        if name in moved or name not in va or name not in vb:
            continue  # added/removed values and moved results are shown per mode
        if _definition(va[name]) != _definition(vb[name]):
            shown = (REDACTED, REDACTED) if is_secret(name) else (va[name], vb[name])
            out.append(Change("spec", "changed", f"values.{name}", old=shown[0], new=shown[1],
                              extra={"note": "definition changed; same result in every mode"}))
    return out


def _mode_values(data: Mapping[str, Any], mode: str, op: str) -> list[Change]:
    """The values a mode sets itself: what a reviewer needs to see of a mode added or removed."""
    own = (data.get("modes") or {}).get(mode) or {}
    shown = _secret_safe(own)
    return [Change("values", op, k, **({"new": v} if op == "added" else {"old": v}))
            for k, v in shown.items()]


def _definition(raw: Any) -> Any:
    """A value definition with its `{eval: ...}` expressions compared by syntax tree."""
    if isinstance(raw, dict):
        return {k: (_expr_tree(v) if k == "eval" else _definition(v)) for k, v in raw.items()}
    if isinstance(raw, list):
        return [_definition(v) for v in raw]
    return raw


def compare(old: Side, new: Side, only_mode: str | None = None) -> Report:
    """The semantic diff of two loaded sides."""
    modes_old, modes_new = list(old.plans), list(new.plans)
    modes = modes_new + [m for m in modes_old if m not in new.plans]
    if only_mode is not None:
        if only_mode not in modes:
            raise DiffError(f"--mode {only_mode}: in neither side (modes: {', '.join(modes) or 'none'})")
        modes = [only_mode]
    mode_diffs: list[ModeDiff] = []
    raw: dict[str, list[Change]] = {}
    for m in modes:
        if m in old.plans and m in new.plans:
            changes, budget = diff_plans(old.plans[m], new.plans[m])
            raw[m] = changes
            mode_diffs.append(ModeDiff(m, "both", changes, budget))
        elif m in new.plans:
            p = new.plans[m]
            mode_diffs.append(ModeDiff(m, "added", _mode_values(new.data, m, "added"),
                                       Budget(None, 0.0, p.budget_s, p.worst_case_s)))
        else:
            p = old.plans[m]
            mode_diffs.append(ModeDiff(m, "removed", _mode_values(old.data, m, "removed"),
                                       Budget(p.budget_s, p.worst_case_s, None, 0.0)))
    # A whole spec added or removed (--base on a new file): show it against nothing, in full.
    if old.spec is None or new.spec is None:
        for md in mode_diffs:
            plan = (new if old.spec is None else old).plans[md.mode]
            empty = _EmptyPlan()
            pair = (empty, plan) if old.spec is None else (plan, empty)
            md.changes, _ = diff_plans(*pair)
            raw[md.mode] = md.changes
    both = [md for md in mode_diffs if md.status == "both"]
    common: list[Change] = []
    if len(both) >= 2:
        keys = [{c.key() for c in md.changes} for md in both]
        shared = set.intersection(*keys)
        common = [c for c in both[0].changes if c.key() in shared]
        for md in both:
            md.changes = [c for c in md.changes if c.key() not in shared]
    spec_changes = diff_spec_level(old.data, new.data, raw) if old.spec and new.spec else []
    name = new.data.get("name") or old.data.get("name") or "spec"
    return Report(old.label, new.label, name, spec_changes, common,
                  [md.mode for md in both] if common else [], mode_diffs, raw)


class _EmptyPlan:
    """The plan of a spec that does not exist on one side."""
    values: dict[str, Any] = {}
    steps: list[dict[str, Any]] = []
    checks: list[dict[str, Any]] = []
    budget_s = None
    worst_case_s = 0.0
    fingerprints: dict[str, str] = {}


# ================================================================ evidence review

@dataclass
class CheckReview:
    name: str
    status: str  # added | changed | affected (unchanged, but reads a changed leg/value)
    blockers: list[str] = dc_field(default_factory=list)  # why the saved run cannot answer
    old: dict | None = None  # check result of the old definition on the run
    new: dict | None = None  # ... of the new one


@dataclass
class EvidenceReview:
    run_dir: str
    label: str  # "run 2026-11-28T21:04 (soak)"
    mode: str
    notes: list[str]
    checks: list[CheckReview]


def _run_label(ev: Mapping[str, Any]) -> str:
    started = str(ev.get("started_at") or "")
    stamp = started[:16] if re.match(r"\d{4}-\d\d-\d\dT\d\d:\d\d", started) else (started or "?")
    return f"run {stamp} ({ev.get('mode', '?')})"


def _reads(check: Mapping[str, Any]) -> list[tuple[str, ...]]:
    """Evidence paths a check's expr and when read from the root."""
    from engine import functions
    out: list[tuple[str, ...]] = []
    for key in _EXPR_FIELDS:
        text = check.get(key)
        if isinstance(text, str):
            try:
                out += functions.root_paths(functions.compile_expr(text))
            except Exception:  # noqa: BLE001 - validate already refused bad expressions
                pass
    return out


def _replan(spec: Any, ev: Mapping[str, Any]) -> Any | None:
    """The plan the saved run would have had under `spec` (its mode, overrides and builtins)."""
    if spec is None:
        return None
    try:
        from engine.cli import replan
        return replan(spec, ev)
    except Exception:  # noqa: BLE001 - mode missing on this side, an override it lacks: no plan
        return None


def _short(value: Any, limit: int = 60) -> str:
    from engine.checks import compact
    return compact(value, limit)


def _argv_delta(old: Sequence[Any], new: Sequence[Any],
                code: Callable[[Any], str] = lambda t: f"`{t}`") -> str:
    """Token-level change of a command line: `--stop-after-steps 10` -> `--stop-after-steps 20`."""
    a, b = [str(x) for x in old], [str(x) for x in new]
    parts = []
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(a=a, b=b, autojunk=False).get_opcodes():
        if tag == "equal":
            continue
        # The flag in front of a changed argument says what the argument is.
        if tag == "replace" and i1 > 0 and a[i1 - 1].startswith("-"):
            i1, j1 = i1 - 1, j1 - 1
        if tag == "replace":
            parts.append(f"{code(' '.join(a[i1:i2]))} -> {code(' '.join(b[j1:j2]))}")
        elif tag == "delete":
            parts.append(f"removed {code(' '.join(a[i1:i2]))}")
        else:
            after = f" after {code(a[i1 - 1])}" if i1 > 0 else " at the start"
            parts.append(f"added {code(' '.join(b[j1:j2]))}{after}")
    return "; ".join(parts)


def _step_delta(fname: str, old: Any, new: Any) -> str:
    """One changed step field, as a phrase."""
    shown = _display_field(fname)
    if fname.endswith("argv") and isinstance(old, list) and isinstance(new, list):
        return f"argv {_argv_delta(old, new)}"
    if fname == "enabled":
        return "now runs in this mode" if new else "now skipped in this mode"
    return f"{shown} {_fmt(old)} -> {_fmt(new)}"


def _display_field(fname: str) -> str:
    for prefix in ("run.", "collect."):
        if fname.startswith(prefix):
            return fname[len(prefix):]
    return "paths" if fname == "remove" else fname


def _fmt(v: Any) -> str:
    if v is ABSENT or v is None:
        return "(none)"
    if isinstance(v, str):
        return v
    return _short(v, 120)


@dataclass
class StepStates:
    """What the saved run can still say about each step of the new plan."""
    blocking: dict[str, str]  # step -> why the run no longer describes it
    harvest: dict[str, str]  # step -> its output rules changed (its harvest is stale)
    notes: list[str]  # changes that do not matter to what ran (time limits it stayed within)
    removed: dict[str, list[str]] = dc_field(default_factory=dict)  # ran, now gone -> steps after it


def _step_states(old_run: Any, new_run: Any, ev: Mapping[str, Any], old_plan: Any, new_plan: Any
                 ) -> StepStates:
    """Compare every step of the new plan with what ran.

    With the run's own context (`*_run`: plans rebuilt with its builtins and overrides) the saved
    fingerprints say exactly whether a step ran as the new spec defines it, and whether the old spec
    is what ran. Without it, the two spec sides (fixed builtins) are compared instead."""
    ev_steps = ev.get("steps") or {}
    in_context = new_run is not None
    ev_fp: Mapping[str, str] = (ev.get("fingerprints") or {}) if in_context else {}
    current, before_plan = (new_run, old_run) if in_context else (new_plan, old_plan)
    ran = {s["name"]: s for s in (before_plan.steps if before_plan else [])}
    old_side = {s["name"]: s for s in (old_plan.steps if old_plan else [])}
    new_side = {s["name"]: s for s in new_plan.steps}
    states = StepStates({}, {}, [])
    for step in current.steps:
        name = step["name"]
        fp_run = ev_fp.get(name)
        did_run = (ev_steps.get(name) or {}).get("status") not in (None, "skipped", "not_run")
        if not step.get("enabled", True) and not did_run:
            continue  # skipped in this mode by the new spec and not run then either: nothing differs
        if name not in ev_steps and fp_run is None:
            states.blocking[name] = f"leg `{name}` is new: the run has no record of it"
            continue
        before = ran.get(name)
        if before is not None and fp_run is not None and before_plan.fingerprints.get(name) != fp_run:
            before = None  # the old side's definition is not what ran either
        if fp_run is not None and fp_run == current.fingerprints.get(name):
            pass  # the run ran exactly the new definition
        elif before is None:
            states.blocking[name] = (f"leg `{name}` as it ran matches neither side of this diff "
                                     f"(the evidence was made with another version of the spec)")
            continue
        else:
            deltas = _field_diffs(_without_output(before), _without_output(step))
            if deltas:
                blocks, message = _leg_change(name, deltas, ev_steps.get(name) or {})
                if blocks:
                    states.blocking[name] = message
                else:
                    states.notes.append(message)
        # Output rules are not in the fingerprint: compare the spec sides for them.
        if name in old_side and name in new_side:
            a = (old_side[name].get("run") or {}).get("output")
            b = (new_side[name].get("run") or {}).get("output")
            if a != b:
                fields = ", ".join(_display_field("run." + f) for f, _, _ in
                                   _field_diffs({"output": a or {}}, {"output": b or {}}))
                states.harvest[name] = (
                    f"leg `{name}`'s output rules changed ({fields}): the saved harvest was made with "
                    f"the old rules (`engine replay` re-harvests the raw log)")
    # A leg that ran and is gone changes everything after it (a wipe that no longer happens).
    names = {s["name"] for s in current.steps}
    order = list(ev_steps)
    for name, rec in ev_steps.items():
        if name not in names and rec.get("kind", "run") in ("run", "remove") and \
                rec.get("status") not in (None, "skipped", "not_run"):
            states.removed[name] = order[order.index(name) + 1:]
    return states


def _without_output(step: Mapping[str, Any]) -> dict[str, Any]:
    out = _step_body(step)
    if "run" in out:
        out["run"] = {k: v for k, v in out["run"].items() if k != "output"}
    return out


def _leg_change(name: str, deltas: list[tuple[str, Any, Any]], ran: Mapping[str, Any]
                ) -> tuple[bool, str]:
    """(blocks, message) for a leg that changed since the run. Only time limits changed and the leg
    finished inside the new ones: it did exactly what it would do under the new spec, so it does not
    block (a shorter timeout it would have hit does)."""
    phrase = "; ".join(_step_delta(f, a, b) for f, a, b in deltas)
    if all(f in _TIME_FIELDS for f, _, _ in deltas):
        new_timeout = {f: b for f, _, b in deltas}.get("run.timeout_s")
        seconds = ran.get("seconds")
        finished = ran.get("status") == "ok" and not ran.get("timed_out")
        if finished and isinstance(seconds, (int, float)) and (
                new_timeout is None or (isinstance(new_timeout, (int, float)) and seconds < new_timeout)):
            return False, f"leg `{name}` changed only its time limits ({phrase}); it finished in {seconds:g} s"
    return True, f"leg `{name}` changed since the run ({phrase})"


def review_evidence(report: Report, old: Side, new: Side, run_dir: str, ev: Mapping[str, Any]
                    ) -> EvidenceReview:
    """Evaluate every added or changed check on a saved run, old and new side by side; say plainly
    where a changed leg or value means the run cannot answer for a check."""
    from engine.checks import evaluate
    from engine.functions import OPTIONS
    mode = str(ev.get("mode"))
    notes: list[str] = []
    spec_name = (ev.get("spec") or {}).get("name")
    if spec_name and spec_name != report.name:
        notes.append(f"the run is of spec `{spec_name}`, not `{report.name}`")
    checks: list[CheckReview] = []
    if mode not in new.plans:
        notes.append(f"the run's mode `{mode}` is not in the new spec: nothing to compare")
        return EvidenceReview(run_dir, _run_label(ev), mode, notes, checks)
    old_plan, new_plan = old.plans.get(mode), new.plans[mode]
    old_run, new_run = _replan(old.spec, ev), _replan(new.spec, ev)
    if new_run is None:
        notes.append("could not rebuild the new spec's plan with the run's overrides; "
                     "legs and values are compared between the two spec sides instead")
    states = _step_states(old_run, new_run, ev, old_plan, new_plan)
    blocking, harvest = states.blocking, states.harvest
    notes += states.notes
    ev_values: Mapping[str, Any] = ev.get("values") or {}
    now_values = (new_run or new_plan).values
    order = [s["name"] for s in new_plan.steps]
    changing_kinds = {s["name"] for s in new_plan.steps if s["kind"] in ("run", "remove")}

    def blockers_of(check: Mapping[str, Any]) -> list[str]:
        out: list[str] = []
        read_steps: list[str] = []
        for path in _reads(check):
            if path[0] == "values" and len(path) > 1:
                x = path[1]
                if new_run is None and x in BUILTIN_NAMES:
                    continue
                was, now = ev_values.get(x, ABSENT), now_values.get(x, ABSENT)
                if was != now and not _redacted_pair(was, now):
                    out.append(f"value `{x}` was {_fmt(was)} in the run and is {_fmt(now)} in the new spec"
                               if was is not ABSENT else f"value `{x}` did not exist in the run")
            elif path[0] in ("steps", "state") and len(path) > 1:
                read_steps.append(path[1])
                if path[0] == "steps" and path[1] in harvest and (len(path) < 3 or path[2] in _HARVESTED):
                    out.append(harvest[path[1]])
        # A leg's results depend on every run/remove step before it (leg 2 resumes from leg 1's store).
        # Said once: a changed leg the check reads makes an upstream change beside the point.
        last = max((order.index(s) for s in read_steps if s in order), default=-1)
        direct = [blocking[s] for s in order[:last + 1] if s in blocking and s in read_steps]
        upstream = [f"{blocking[s]}, and it ran before what this check reads" for s in order[:last + 1]
                    if s in blocking and s not in read_steps and s in changing_kinds]
        gone = [f"leg `{r}` ran before what this check reads and is gone from the new spec"
                for r, after in states.removed.items() if any(s in after for s in read_steps)]
        return list(dict.fromkeys(out + (direct or upstream) + gone))

    def run(check: Mapping[str, Any] | None) -> dict | None:
        return evaluate([dict(check)], ev, OPTIONS)[0] if check else None

    by_old = {c["name"]: c for c in (old_plan.checks if old_plan else [])}
    by_new = {c["name"]: c for c in new_plan.checks}
    mode_changes = report.raw_modes.get(mode, [])
    touched: dict[str, str] = {}
    for c in mode_changes:
        if c.section != "checks" or c.op == "removed":
            continue
        if c.op == "added" or c.field in _EXPR_FIELDS:
            touched[c.subject] = c.op
    for name, op in touched.items():
        review = CheckReview(name, op, blockers_of(by_new[name]))
        if not review.blockers:
            review.new = run(by_new[name])
            review.old = run(by_old.get(name)) if op == "changed" else None
        checks.append(review)
    # Unchanged checks whose legs or values this change touches: the run cannot vouch for them either.
    for name, check in by_new.items():
        if name in touched:
            continue
        reasons = blockers_of(check)
        if reasons:
            checks.append(CheckReview(name, "affected", reasons))
    return EvidenceReview(run_dir, _run_label(ev), mode, notes, checks)


def _redacted_pair(a: Any, b: Any) -> bool:
    return "<redacted>" in (a, b)


# ================================================================ rendering

def _operands(result: Mapping[str, Any], limit: int = 4) -> str:
    """`resumed_from_step = 120, stop1 = 120`: the values a check compared, each under the shortest
    suffix of its path that is unique among them."""
    from engine.checks import MISSING, NOT_EVALUATED
    pairs = [(t, v) for t, v in result.get("explain") or []
             if _PATH.fullmatch(t) and v != NOT_EVALUATED]
    pairs = list(dict.fromkeys(pairs))
    names = [t.split(".") for t, _ in pairs]
    shown = []
    for (_, value), parts in zip(pairs, names):
        n = 1
        while n < len(parts) and sum(1 for p in names if p[-n:] == parts[-n:]) > 1:
            n += 1
        shown.append(f"{'.'.join(parts[-n:])} = {'missing' if value == MISSING else value}")
    more = f", ... ({len(shown) - limit} more)" if len(shown) > limit else ""
    return ", ".join(shown[:limit]) + more


_PATH = re.compile(r'[A-Za-z_]\w*(\.(?:[A-Za-z_]\w*|"[^"]*")|\[\d+\])*')


def _outcome_phrase(result: Mapping[str, Any], where: str = "") -> str:
    """`PASS on run X (soak): a = 1` / `NO_DATA on run X: no data: ... is missing`."""
    head = result["outcome"] + (f" on {where}" if where else "")
    if result["outcome"] in ("NO_DATA", "SKIPPED", "ERROR"):
        return f"{head}: {result.get('reason')}"
    operands = _operands(result)
    return f"{head}: {operands}" if operands else head


# Text marks and Markdown words for each kind of line.
_MARKS = {"added": ("+", "**added**"), "removed": ("-", "**removed**"), "changed": ("~", "**changed**"),
          "reordered": ("~", "**reordered**"), "blocked": ("!", "**not comparable**"),
          "note": ("*", "**note**"), "plain": ("*", "")}


class _Out:
    """Lines in text (for a terminal) or Markdown (for a PR comment), with one set of calls."""

    def __init__(self, markdown: bool):
        self.md = markdown
        self.lines: list[str] = []

    def code(self, value: Any) -> str:
        """A name, expression or value: a code span in Markdown (fenced past any backtick inside)."""
        text = _fmt(value)
        if not self.md:
            return text
        fence = "`" * (max((len(m) for m in re.findall(r"`+", text)), default=0) + 1)
        pad = " " if text.startswith("`") or text.endswith("`") else ""
        return f"{fence}{pad}{text}{pad}{fence}"

    def blank(self) -> None:
        if self.lines and self.lines[-1] != "":
            self.lines.append("")

    def head(self, text: str) -> None:
        self.blank()
        self.lines.append(f"### {text}" if self.md else f"{text}:")
        if self.md:
            self.lines.append("")

    def section(self, text: str) -> None:
        if self.md:
            self.blank()
            self.lines += [f"**{text}**", ""]
        else:
            self.lines.append(f"  {text}:")

    def item(self, kind: str, text: str) -> None:
        mark, word = _MARKS[kind]
        if self.md:
            self.lines.append(f"- {word} {text}" if word else f"- {text}")
        else:
            self.lines.append(f"    {mark} {text}")

    def sub(self, label: str, text: str) -> None:
        self.lines.append(f"  - {label}: {text}" if self.md else f"        {label}: {text}")

    def before_after(self, old: Any, new: Any) -> None:
        """A changed expression or sentence: old and new on lines of their own."""
        a, b = _fmt_def(old), _fmt_def(new)
        if self.md:
            self.lines += ["  ```diff", f"  - {a}", f"  + {b}", "  ```"]
        else:
            self.lines += [f"        - {a}", f"        + {b}"]


def _fmt_def(v: Any) -> str:
    if v is ABSENT or v is None:
        return "(none)"
    return _words(v) if isinstance(v, str) else json.dumps(v, sort_keys=True)


def _render_change(out: _Out, c: Change) -> None:
    if c.section == "spec":
        note = f" ({c.extra['note']})" if c.extra.get("note") else ""
        if c.subject.startswith("values.") or c.subject == "description":
            out.item(c.op, f"{out.code(c.subject)}{note}:")
            out.before_after(c.old, c.new)
        else:
            out.item(c.op, f"{out.code(c.subject)}: {out.code(c.old)} -> {out.code(c.new)}")
    elif c.section == "values":
        if c.op == "added":
            out.item(c.op, f"{out.code(c.subject)} = {out.code(c.new)}")
        elif c.op == "removed":
            out.item(c.op, f"{out.code(c.subject)} (was {out.code(c.old)})")
        elif c.old == c.new:  # they differ only in a secret's text, which is never shown
            out.item(c.op, f"{out.code(c.subject)}: changed (in a secret, not shown)")
        elif _scalar_list(c.old) and _scalar_list(c.new):  # argument lists: which tokens moved
            out.item(c.op, f"{out.code(c.subject)}: {_argv_delta(c.old, c.new, out.code)}")
        else:
            out.item(c.op, f"{out.code(c.subject)}: {out.code(c.old)} -> {out.code(c.new)}")
    elif c.section == "steps":
        _render_step_change(out, c)
    elif c.section == "checks":
        _render_check_change(out, c)


def _render_step_change(out: _Out, c: Change) -> None:
    name = out.code(c.subject)
    if c.op == "reordered":
        out.item(c.op, f"order: {', '.join(c.old)} -> {', '.join(c.new)}")
        return
    if c.op in ("added", "removed"):
        s = c.new if c.op == "added" else c.old
        skipped = "" if s.get("enabled", True) else f" (skipped in this mode: when {out.code(s['when'])})"
        out.item(c.op, f"{name} [{s['kind']}]{skipped}")
        if c.op == "removed":
            return
        if s["kind"] == "run":
            out.sub("argv", out.code(" ".join(str(a) for a in s["argv"])))
            out.sub("time", f"timeout {s['timeout_s']:g} s + grace {s['grace_s']:g} s")
        elif s["kind"] == "remove":
            out.sub("paths", out.code(", ".join(s["remove"])))
        else:
            out.sub("collect", out.code(json.dumps(s["collect"], sort_keys=True)))
        return
    label = _display_field(c.field)
    if c.old == c.new:  # they differ only in a secret's text, which is never shown
        out.item(c.op, f"{name} {label}: changed (in a secret, not shown)")
    elif c.field == "when":
        out.item(c.op, f"{name} when:")
        out.before_after(c.old, c.new)
    elif c.field.endswith("argv") and isinstance(c.old, list) and isinstance(c.new, list):
        out.item(c.op, f"{name} argv: {_argv_delta(c.old, c.new, out.code)}")
    elif c.field == "enabled":
        out.item(c.op, f"{name}: {'now runs in this mode' if c.new else 'now skipped in this mode'}")
    elif _scalar_list(c.old) and _scalar_list(c.new) and _only_added_removed(c.old, c.new):
        added = [x for x in c.new if x not in c.old]
        removed = [x for x in c.old if x not in c.new]
        # Quoted: list items like "CKPT " often end in a space that matters.
        parts = ([f"added {', '.join(out.code(json.dumps(x)) for x in added)}"] if added else []) + \
                ([f"removed {', '.join(out.code(json.dumps(x)) for x in removed)}"] if removed else [])
        out.item(c.op, f"{name} {label}: {'; '.join(parts)}")
    else:
        out.item(c.op, f"{name} {label}: {out.code(c.old)} -> {out.code(c.new)}")


def _scalar_list(v: Any) -> bool:
    return isinstance(v, list) and all(isinstance(x, (str, int, float, bool)) for x in v)


def _only_added_removed(a: list, b: list) -> bool:
    """Kept items in the same order, some added or removed: then listing those is the whole story."""
    kept_a = [x for x in a if x in b]
    kept_b = [x for x in b if x in a]
    return kept_a == kept_b and (len(kept_a) < len(a) or len(kept_b) < len(b))


def _render_check_change(out: _Out, c: Change) -> None:
    name = out.code(c.subject)
    if c.op == "added":
        f = c.new
        out.item(c.op, f"{name} [{f.get('severity') or 'gate'}]")
        out.sub("why", _words(f.get("why", "")))
        out.sub("expr", out.code(f["expr"]))
        if f.get("when"):
            out.sub("when", out.code(f["when"]))
    elif c.op == "removed":
        out.item(c.op, f"{name} [{c.old.get('severity') or 'gate'}]")
        out.sub("expr", out.code(c.old["expr"]))
    elif c.field in _EXPR_FIELDS or c.field == "why":
        out.item(c.op, f"{name} {c.field}:")
        out.before_after(c.old, c.new)
    else:
        out.item(c.op, f"{name} {c.field}: {out.code(c.old)} -> {out.code(c.new)}")


_SECTIONS = ("values", "steps", "checks")


def _render_changes(out: _Out, changes: list[Change]) -> None:
    for section in _SECTIONS:
        part = [c for c in changes if c.section == section]
        if part:
            out.section(section)
            for c in part:
                _render_change(out, c)


def _budget_line(b: Budget) -> str:
    """`worst case 610 s -> 645 s of budget_s 900 s, headroom 290 s -> 255 s`."""
    def moved(old: float | None, new: float | None, unit: str = " s") -> str:
        shown = [("none" if v is None else f"{v:g}{unit}") for v in (old, new)]
        return shown[1] if old == new else f"{shown[0]} -> {shown[1]}"

    def headroom(budget: float | None, worst: float) -> float | None:
        return None if budget is None else budget - worst

    if b.old_budget is None and b.old_worst == 0.0:  # an added mode: only its own numbers
        b = Budget(b.new_budget, b.new_worst, b.new_budget, b.new_worst)
    elif b.new_budget is None and b.new_worst == 0.0:  # a removed mode
        b = Budget(b.old_budget, b.old_worst, b.old_budget, b.old_worst)
    line = f"worst case {moved(b.old_worst, b.new_worst)} of budget_s {moved(b.old_budget, b.new_budget)}"
    left_old, left_new = headroom(b.old_budget, b.old_worst), headroom(b.new_budget, b.new_worst)
    if left_new is not None:
        line += f", headroom {moved(left_old, left_new)}"
        if left_new < 0:
            line += f" (OVER BUDGET by {-left_new:g} s)"
    return line


def summary(report: Report) -> str:
    """One line: what kind of things changed, counted by distinct name."""
    # An added/removed mode's own values are part of that mode, counted as the mode.
    changes = report.spec_changes + report.common + \
        [c for m in report.modes if m.status == "both" for c in m.changes]
    parts = []
    for status in ("added", "removed"):
        modes = [m.mode for m in report.modes if m.status == status]
        if modes:
            parts.append(f"mode {status}: {', '.join(modes)}")
    for section in ("checks", "steps", "values"):
        ops: dict[str, set[str]] = {}
        for c in changes:
            if c.section == section:
                ops.setdefault(c.op, set()).add(c.subject or "order")
        if ops:
            parts.append(f"{section}: " + ", ".join(f"{len(v)} {k}" for k, v in sorted(ops.items())))
    if report.spec_changes:
        parts.append(f"spec: {len(report.spec_changes)} changed")
    over = [m.mode for m in report.modes if m.budget and m.budget.new_budget is not None
            and m.budget.new_worst > m.budget.new_budget]
    if over:
        parts.append(f"OVER BUDGET in {', '.join(over)}")
    return "; ".join(parts) if parts else "no semantic change"


def render(report: Report, markdown: bool = False) -> str:
    """The whole diff as text (terminal) or Markdown (PR comment / job summary)."""
    out = _Out(markdown)
    verdict = summary(report)
    if markdown:
        out.lines += [f"## Spec diff {out.code(report.name)}", "",
                      f"{out.code(report.old_label)} -> {out.code(report.new_label)}", "",
                      f"**{verdict}**" if report.changed else "No semantic change."]
    else:
        out.lines += [f"engine diff {report.name}: {report.old_label} -> {report.new_label}", verdict]
    if report.spec_changes:
        out.head("spec")
        for c in report.spec_changes:
            _render_change(out, c)
    if report.common:
        out.head(f"every mode ({', '.join(report.common_modes)})")
        _render_changes(out, report.common)
    unchanged = []
    for md in report.modes:
        if md.status == "both" and not report.raw_modes.get(md.mode) and md.budget is None:
            unchanged.append(md.mode)
            continue
        if md.status == "both" and not md.changes and md.budget is None:
            continue  # everything it had is in "every mode"
        out.head({"both": f"mode {md.mode}", "added": f"mode {md.mode} (added)",
                  "removed": f"mode {md.mode} (removed)"}[md.status])
        _render_changes(out, md.changes)
        if md.budget is not None:
            if out.md:
                out.blank()
            out.lines.append(f"**budget**: {_budget_line(md.budget)}" if out.md
                             else f"  budget: {_budget_line(md.budget)}")
    if unchanged and report.changed:
        out.blank()
        out.lines.append(f"unchanged modes: {', '.join(unchanged)}")
    if report.evidence is not None:
        _render_evidence(out, report.evidence)
    return "\n".join(out.lines).rstrip() + "\n"


def _render_evidence(out: _Out, ev: EvidenceReview) -> None:
    out.head(f"evidence: {ev.label}, {ev.run_dir}")
    for note in ev.notes:
        out.item("note", note)
    if not ev.checks:
        out.item("plain", "no added or changed check to evaluate on this run")
    for r in ev.checks:
        name = out.code(r.name)
        what = {"added": "new check", "changed": "changed check", "affected": "unchanged check"}[r.status]
        if r.blockers:
            out.item("blocked", f"{what} {name}: this run cannot say how it fares, because")
            for b in r.blockers:
                out.lines.append(f"  - {b}" if out.md else f"        - {b}")
        elif r.status == "added":
            out.item("plain" if out.md else "added",
                     f"new check {name} would {_outcome_phrase(r.new, ev.label)}")
        else:
            same = r.old is not None and r.old["outcome"] == r.new["outcome"]
            out.item("plain" if out.md else "changed", f"changed check {name} on {ev.label}: "
                                f"{'same outcome' if same else 'outcome changes'}")
            out.sub("old", _outcome_phrase(r.old) if r.old else "(not evaluated)")
            out.sub("new", _outcome_phrase(r.new))


# ================================================================ command line

def add_diff_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register `engine diff` on the `engine` subparsers; it dispatches to diff_main."""
    help_text = "semantic diff of a spec: two files, or a spec at a git revision vs the working tree"
    p = subparsers.add_parser(
        "diff", help=help_text, description=help_text,
        epilog="exit codes: 0 no semantic change, 1 a semantic change, 2 invalid spec or usage")
    p.add_argument("old", metavar="OLD|SPEC", help="the old spec, or with --base the spec in the working tree")
    p.add_argument("new", nargs="?", metavar="NEW", help="the new spec (not with --base)")
    p.add_argument("--base", metavar="REV",
                   help="compare the spec (and what it extends/includes) at this git revision")
    p.add_argument("--evidence", metavar="RUN_DIR",
                   help="evaluate added/changed checks against this saved run")
    p.add_argument("--markdown", action="store_true", help="Markdown (for a PR comment / job summary)")
    p.add_argument("--mode", help="only this mode (default: every mode of either side)")
    p.set_defaults(func=diff_main)
    return p


def diff_main(args: argparse.Namespace, stdout: Any = None, stderr: Any = None) -> int:
    """`engine diff`: print the diff; 0 no semantic change, 1 changed, 2 invalid spec or usage."""
    stdout = stdout or sys.stdout
    stderr = stderr or sys.stderr
    try:
        report = build_report(args.old, getattr(args, "new", None), getattr(args, "base", None),
                              getattr(args, "evidence", None), getattr(args, "mode", None))
    except DiffError as exc:
        print(str(exc), file=stderr, flush=True)
        return EXIT_INVALID
    md = getattr(args, "markdown", False)
    if isinstance(md, str) and md not in ("", "-"):  # a path, as `engine run --markdown FILE` takes
        Path(md).parent.mkdir(parents=True, exist_ok=True)
        Path(md).write_text(render(report, markdown=True), encoding="utf-8")
        stdout.write(render(report))
    else:
        stdout.write(render(report, markdown=bool(md)))
    stdout.flush()
    return EXIT_CHANGED if report.changed else EXIT_SAME


def build_report(old: str, new: str | None, base: str | None, evidence: str | None = None,
                 mode: str | None = None) -> Report:
    """Load both sides as asked, compare, and (with `evidence`) review the saved run."""
    if base is not None and new is not None:
        raise DiffError("engine diff: give either OLD NEW or SPEC --base REV, not both")
    if base is None and new is None:
        raise DiffError("engine diff: give OLD NEW, or SPEC --base REV")
    with tempfile.TemporaryDirectory(prefix="specprobe-diff-") as tmp:
        if base is not None:
            spec = Path(old)
            where = materialise(spec, base, Path(tmp))
            shown = _shown(spec)
            rel = _repo_rel(spec)
            left = Side(f"{base}:{rel}", None) if where is None else \
                load_side(where, f"{base}:{rel}", Path(tmp), f"{base}:")
            right = load_side(spec, shown) if spec.exists() else Side(f"{shown} (deleted)", None)
            if left.spec is None and right.spec is None:
                raise DiffError(f"{old}: exists neither at {base} nor in the working tree")
        else:
            left = load_side(Path(old), _shown(Path(old)))
            right = load_side(Path(new), _shown(Path(new)))
        report = compare(left, right, mode)
        if evidence is not None:
            from engine import evidence as evmod
            try:
                doc = evmod.load(evidence)
            except evmod.EvidenceError as exc:
                raise DiffError(str(exc)) from None
            report.evidence = review_evidence(report, left, right, _shown(Path(evidence)), doc)
    return report


def _shown(path: Path) -> str:
    from engine.spec import display_path
    return display_path(path)


def _repo_rel(spec: Path) -> str:
    try:
        root = repo_root(spec.parent if spec.parent.is_dir() else Path.cwd())
        return spec.resolve().relative_to(root).as_posix()
    except (DiffError, ValueError):
        return spec.as_posix()


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m engine.diff ...` (the same as `engine diff ...`)."""
    parser = argparse.ArgumentParser(prog="engine")
    add_diff_parser(parser.add_subparsers(dest="command", required=True))
    try:
        args = parser.parse_args(["diff", *(sys.argv[1:] if argv is None else argv)])
    except SystemExit as exc:
        return int(exc.code or 0)
    return diff_main(args)


if __name__ == "__main__":
    sys.exit(main())
