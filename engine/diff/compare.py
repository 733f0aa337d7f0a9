"""Comparing two loaded sides: values, steps and checks per mode, spec-level keys, budgets; then
changes equal in every mode are factored out so a reviewer reads them once."""

from __future__ import annotations

import functools
import json
from typing import Any, Callable, Mapping, Sequence

import jmespath

from engine.diff import rename, variants
from engine.diff.model import ABSENT, BUILTIN_NAMES, EXPR_FIELDS, Budget, Change, DiffError, ModeDiff, Report, Side
from engine.diff.strictness import Shift, reads, shift
from engine.judge.recheck import flatten
from engine.secrets import REDACTED, is_secret, redact
from engine.spec.load import family_of
from engine.spec.plan import masking
from engine.text import argv_delta, scalar_list, words

# Step fields that are labels or locations, never behaviour.
_STEP_IGNORED = ("name", "file", "line")
# Fields compared by their words (JMESPath ones, EXPR_FIELDS, by syntax tree).
_PROSE_FIELDS = ("why", "description", "precondition")


def _expr_tree(text: Any) -> Any:
    """JMESPath by syntax tree: `a==b` and `a == b` (or a re-folded YAML string) are the same check."""
    if not isinstance(text, str):
        return text
    try:
        return json.dumps(jmespath.compile(text).parsed, sort_keys=True)
    except Exception:  # an unparsable expression compares as its words
        return words(text)


def _normal(field_name: str, value: Any) -> Any:
    last = field_name.rsplit(".", 1)[-1]
    if last in EXPR_FIELDS or field_name.startswith("let."):
        return _expr_tree(value)
    if last in _PROSE_FIELDS:
        return words(value)
    return value


def same(field_name: str, a: Any, b: Any) -> bool:
    if a is ABSENT or b is ABSENT:
        return a is b
    return _normal(field_name, a) == _normal(field_name, b)


# Fields a reviewer reads first: whether it runs, what it runs, how long it may take; output last.
_FIELD_ORDER = (
    "kind",
    "enabled",
    "when",
    "run.argv",
    "run.env",
    "run.cwd",
    "run.timeout_s",
    "run.grace_s",
    "run.ok_exit_codes",
    "run.precondition",
    "run.stop_on_failure",
    "run.signals",
    "run.progress",
    "run.on_failure",
    "run.output",
    "remove",
    "collect",
)


def _field_rank(name: str) -> int:
    for i, prefix in enumerate(_FIELD_ORDER):
        if name == prefix or name.startswith(prefix + "."):
            return i
    return len(_FIELD_ORDER)


def field_diffs(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[tuple[str, Any, Any]]:
    """(dotted field, old, new) for every field that differs, most telling fields first."""
    a, b = flatten(old), flatten(new)
    out = []
    keys = list(b) + [k for k in a if k not in b]
    for k in sorted(keys, key=_field_rank):  # stable: same-rank fields keep the spec's order
        va, vb = a.get(k, ABSENT), b.get(k, ABSENT)
        # `harvest: {}` on one side and `harvest.run_json.*` on the other: the sub-keys say it all.
        if (va is ABSENT and vb == {}) or (vb is ABSENT and va == {}):
            continue
        if not same(k, va, vb):
            out.append((k, va, vb))
    return out


def _step_body(step: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in step.items() if k not in _STEP_IGNORED}


def _step_summary(step: Mapping[str, Any]) -> dict[str, Any]:
    """What a reviewer needs to see of an added step."""
    out: dict[str, Any] = {"kind": step["kind"], "enabled": step.get("enabled", True), "when": step.get("when")}
    if step["kind"] == "run":
        r = step["run"]
        out.update(argv=r["argv"], timeout_s=r["timeout_s"], grace_s=r["grace_s"])
    elif step["kind"] == "remove":
        out["remove"] = step["remove"]
    else:
        out["collect"] = step["collect"]
    return out


# A check's labels and locations, and whether it is disabled (compared on its own, below).
_CHECK_IGNORED = ("name", "file", "line", "disabled", "disabled_at", "let")


def _check_body(check: Mapping[str, Any]) -> dict[str, Any]:
    """What a check says, without its name, location and disabled state (compared on its own); each
    named sub-expression is a field (`let.first2`), so a changed one shows alone."""
    body = {k: v for k, v in check.items() if k not in _CHECK_IGNORED}
    body.update({f"let.{k}": v for k, v in (check.get("let") or {}).items()})
    return body


def diff_values(old: Any, new: Any) -> list[Change]:
    a = {k: v for k, v in redact(old.values).items() if k not in BUILTIN_NAMES}
    b = {k: v for k, v in redact(new.values).items() if k not in BUILTIN_NAMES}
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
                out += [
                    Change(
                        "values",
                        "changed"
                        if va is not ABSENT and vb is not ABSENT
                        else ("added" if va is ABSENT else "removed"),
                        f"{k}.{f}",
                        old=va,
                        new=vb,
                    )
                    for f, va, vb in field_diffs(a[k], b[k])
                ] or [Change("values", "changed", k, old=a[k], new=b[k])]
            else:
                # A secret that changed is a change; its text is still never shown.
                out.append(Change("values", "changed", k, old=a[k], new=b[k]))
    return out


def _hider(plan: Any) -> Callable[[str, Any], Any]:
    """Shows a step field without secrets: secret values' text anywhere, and whole fields whose
    name looks secret (an `env.HF_TOKEN` written literally in the spec)."""
    mask = masking(plan, environ={})

    def hide(fname: str, value: Any) -> Any:
        if value is ABSENT:
            return value
        if any(is_secret(part) for part in fname.split(".")):
            return REDACTED
        return mask.scrub_obj(value)

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
        for fname, va, vb in field_diffs(_step_body(a[name]), _step_body(step)):
            # A change only in a secret's text is still a change; it just shows as redacted.
            change = Change("steps", "changed", name, fname, hide_old(fname, va), hide_new(fname, vb))
            if fname.startswith("run.output.harvest."):  # which rule (its marker) a reader is told of
                rules = (step["run"].get("output") or {}).get("harvest") or {}
                change.extra["rule"] = hide_new("", rules.get(fname.split(".")[3]) or {})
            out.append(change)
    out += [Change("steps", "removed", n, old=hide_old("", _step_summary(s))) for n, s in a.items() if n not in b]
    return out


def _same_check(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Two checks that ask exactly the same of a run (their `why` may read otherwise)."""
    fa, fb = _check_body(a), _check_body(b)
    fa.pop("why", None), fb.pop("why", None)
    if set(fa) != set(fb) or bool(a.get("disabled")) != bool(b.get("disabled")):
        return False
    return all(same(k, fa[k], fb[k]) for k in fa)


def _check_renames(a: Mapping[str, Any], b: Mapping[str, Any]) -> dict[str, str]:
    """New name -> old name of each check that is only renamed: gone under its old name, there under a
    new one, asking exactly the same (checks are matched by what they check, then by name)."""
    gone = [n for n in a if n not in b]
    out: dict[str, str] = {}
    for name in (n for n in b if n not in a):
        twin = next((g for g in gone if g not in out.values() and _same_check(a[g], b[name])), None)
        if twin is not None:
            out[name] = twin
    return out


def diff_checks(old_checks: Sequence[Mapping[str, Any]], new_checks: Sequence[Mapping[str, Any]]) -> list[Change]:
    a = {c["name"]: c for c in old_checks}
    b = {c["name"]: c for c in new_checks}
    renamed = _check_renames(a, b)
    out = []
    for name, check in b.items():
        if name in renamed:
            out.append(Change("checks", "renamed", name, old=renamed[name], new=name))
            continue
        if name not in a:
            out.append(Change("checks", "added", name, new=_check_body(check)))
            continue
        # Disabling drops a check from the active set as surely as deleting it (a DISABLED gate
        # never fails), so it is a change of its own, with its reason; enabling it again too.
        was, now = a[name].get("disabled"), check.get("disabled")
        if now is not None and was is None:
            out.append(Change("checks", "disabled", name, old=_check_body(a[name]), new=now))
        elif was is not None and now is None:
            out.append(Change("checks", "enabled", name, old=was, new=_check_body(check)))
        elif was is not None and not same("why", was, now):
            out.append(Change("checks", "changed", name, "disabled", was, now))
        fa, fb = _check_body(a[name]), _check_body(check)
        for fname in list(fb) + [k for k in fa if k not in fb]:
            va, vb = fa.get(fname, ABSENT), fb.get(fname, ABSENT)
            if fname == "severity":  # an unset severity is a gate
                va, vb = va or "gate", vb or "gate"
            if not same(fname, va, vb) and not (va in (None, ABSENT) and vb in (None, ABSENT)):
                out.append(Change("checks", "changed", name, fname, va, vb))
    taken = set(renamed.values())
    out += [Change("checks", "removed", n, old=_check_body(c)) for n, c in a.items() if n not in b and n not in taken]
    return out


def diff_plans(old: Any, new: Any) -> tuple[list[Change], Budget | None]:
    changes = diff_values(old, new) + diff_steps(old, new) + diff_checks(old.checks, new.checks)
    budget = None
    if old.worst_case_s != new.worst_case_s or old.budget_s != new.budget_s:
        budget = Budget(old.budget_s, old.worst_case_s, new.budget_s, new.worst_case_s)
    return changes, budget


_SPEC_KEYS = ("name", "description", "version", "budget_s", "mode_env")


def diff_spec_level(
    old: Mapping[str, Any], new: Mapping[str, Any], per_mode: Mapping[str, list[Change]]
) -> list[Change]:
    """Changes not tied to one mode: header keys, env mapping, default mode, value definitions that
    changed without changing any mode's resolved value (they matter under --set / env overrides)."""
    out = []
    for k in _SPEC_KEYS:
        va, vb = old.get(k, ABSENT), new.get(k, ABSENT)
        if not same(k, va, vb):
            out.append(Change("spec", "changed", k, old=va, new=vb))
    da = (old.get("modes") or {}).get("default", ABSENT)
    db = (new.get("modes") or {}).get("default", ABSENT)
    if da != db:
        out.append(Change("spec", "changed", "modes.default", old=da, new=db))
    ea, eb = old.get("env") or {}, new.get("env") or {}
    for var in list(eb) + [v for v in ea if v not in eb]:
        if ea.get(var, ABSENT) != eb.get(var, ABSENT):
            out.append(Change("spec", "changed", f"env.{var}", old=ea.get(var, ABSENT), new=eb.get(var, ABSENT)))
    moved = {c.subject.split(".")[0] for changes in per_mode.values() for c in changes if c.section == "values"}
    va, vb = old.get("values") or {}, new.get("values") or {}
    for name in list(vb) + [n for n in va if n not in vb]:
        if name in moved or name not in va or name not in vb:
            continue  # added/removed values and moved results are shown per mode
        if _definition(va[name]) != _definition(vb[name]):
            shown = (REDACTED, REDACTED) if is_secret(name) else (va[name], vb[name])
            out.append(
                Change(
                    "spec",
                    "changed",
                    f"values.{name}",
                    old=shown[0],
                    new=shown[1],
                    extra={"note": "definition changed; same result in every mode"},
                )
            )
    return out


def _mode_values(data: Mapping[str, Any], mode: str, op: str) -> list[Change]:
    """The values a mode sets itself: what a reviewer needs to see of a mode added or removed."""
    own = (data.get("modes") or {}).get(mode) or {}
    shown = redact(own)
    return [Change("values", op, k, **({"new": v} if op == "added" else {"old": v})) for k, v in shown.items()]


def _definition(raw: Any) -> Any:
    """A value definition with its `{eval: ...}` expressions compared by syntax tree."""
    if isinstance(raw, dict):
        return {k: (_expr_tree(v) if k == "eval" else _definition(v)) for k, v in raw.items()}
    if isinstance(raw, list):
        return [_definition(v) for v in raw]
    return raw


def _renamed(old: Side, new: Side) -> tuple[Side, list[Change]]:
    """The old side with this change's step renames applied (rename.py), and one change saying each."""
    if old.spec is None or new.spec is None or old.spec is new.spec:
        return old, []
    renames = rename.detect(old.plans, new.plans)
    if not renames:
        return old, []
    first = next(iter(old.plans.values()))
    changes = []
    for word, to in renames.items():
        steps = [pair for pair in rename.renamed_steps(first, {word: to}) if pair[0] != word]
        index = _index(new.data, "steps", to)
        where = new.place(("steps", index)) if index is not None else ""
        changes.append(Change("spec", "renamed", word, old=word, new=to, extra={"with": steps}, where=where))
    plans = {m: rename.apply(p, renames) for m, p in old.plans.items()}
    data = rename.substitute(old.data, renames)
    return Side(old.label, old.spec, plans, old.tmp, old.rev_prefix, renamed=data, renames=renames), changes


def _mode_diffs(old: Side, new: Side, modes: list[str]) -> tuple[list[ModeDiff], dict[str, list[Change]]]:
    mode_diffs: list[ModeDiff] = []
    raw: dict[str, list[Change]] = {}
    for m in modes:
        if m in old.plans and m in new.plans:
            changes, budget = diff_plans(old.plans[m], new.plans[m])
            raw[m] = changes
            mode_diffs.append(ModeDiff(m, "both", changes, budget))
        elif m in new.plans:
            p = new.plans[m]
            mode_diffs.append(
                ModeDiff(m, "added", _mode_values(new.data, m, "added"), Budget(None, 0.0, p.budget_s, p.worst_case_s))
            )
        else:
            p = old.plans[m]
            mode_diffs.append(
                ModeDiff(
                    m, "removed", _mode_values(old.data, m, "removed"), Budget(p.budget_s, p.worst_case_s, None, 0.0)
                )
            )
    return mode_diffs, raw


def _env_diffs(old: Side, new: Side, both: list[ModeDiff], raw: dict[str, list[Change]], report: Report) -> None:
    """Each mode under each target the spec names, where it differs from the mode's own diff: into
    `report.modes` (after the modes), `raw` and `report.env_plans`, the changes every one of them
    shares factored out into `report.env_common`."""
    if old.spec is None or new.spec is None or old.spec is new.spec or not both:
        return
    found, lost = variants.plans(old, new, [md.mode for md in both])
    report.modes += [ModeDiff(mode, "removed", env=env) for mode, env in lost]
    found = {k: (env, rename.apply(a, old.renames), b) for k, (env, a, b) in found.items()}
    for (mode, _), (env, a, b) in found.items():
        report.env_plans[ModeDiff(mode, "both", env=env).key] = (mode, env, a, b)
    own = {md.mode: md for md in both}
    extra = variants.residual(found, own, diff_plans, _key, lambda c, m: place(c, old, new, m))
    for md, a, b, changes in extra:
        raw[md.key] = md.changes
        touched = {c.subject for c in md.changes if c.section == "checks"}
        moved = {c.subject.split(".")[0] for c in md.changes if c.section == "values"}
        md.shifts = static_shifts(a, b, changes, only=functools.partial(_own, touched=touched, moved=moved))
        report.modes.append(md)
    mds = [md for md, *_ in extra]
    if len(mds) >= 2:
        shared = set.intersection(*({_key(c) for c in md.changes} for md in mds))
        report.env_common = [c for c in mds[0].changes if _key(c) in shared]
        report.env_common_keys = [md.key for md in mds]
        for md in mds:
            md.changes = [c for c in md.changes if _key(c) not in shared]


def _own(check: Mapping[str, Any], touched: set[str], moved: set[str]) -> bool:
    """A check a target's own changes touch: changed there, or reading a value that moved there."""
    return check["name"] in touched or any(p[0] == "values" and p[1:2] and p[1] in moved for p in reads(check))


def compare(old: Side, new: Side, only_mode: str | None = None) -> Report:
    """The semantic diff of two loaded sides: every mode, each under every target the spec names."""
    modes_old, modes_new = list(old.plans), list(new.plans)
    modes = modes_new + [m for m in modes_old if m not in new.plans]
    if only_mode is not None:
        if only_mode not in modes:
            raise DiffError(f"--mode {only_mode}: in neither side (modes: {', '.join(modes) or 'none'})")
        modes = [only_mode]
    old, renamed = _renamed(old, new)
    mode_diffs, raw = _mode_diffs(old, new, modes)
    # A whole spec added or removed (--base on a new file): show it against nothing, in full.
    if old.spec is None or new.spec is None:
        for md in mode_diffs:
            plan = (new if old.spec is None else old).plans[md.mode]
            empty = _EmptyPlan()
            pair = (empty, plan) if old.spec is None else (plan, empty)
            md.changes, _ = diff_plans(*pair)
            raw[md.mode] = md.changes
    for md in mode_diffs:
        for c in raw.get(md.mode, md.changes):
            c.where = place(c, old, new, md.mode)
        if md.status == "both":
            md.shifts = static_shifts(old.plans[md.mode], new.plans[md.mode], raw[md.mode])
    both = [md for md in mode_diffs if md.status == "both"]
    name = new.data.get("name") or old.data.get("name") or "spec"
    status = "new" if old.spec is None else "deleted" if new.spec is None else "both"
    report = Report(old.label, new.label, name, [], [], [], mode_diffs, raw, status=status, old_side=old)
    _env_diffs(old, new, both, raw, report)
    report.default_env = variants.default_env(new if new.spec is not None else old)
    if len(both) >= 2:
        keys = [{_key(c) for c in md.changes} for md in both]
        shared = set.intersection(*keys)
        report.common = [c for c in both[0].changes if _key(c) in shared]
        report.common_modes = [md.mode for md in both] if report.common else []
        for md in both:
            md.changes = [c for c in md.changes if _key(c) not in shared]
    spec_changes = diff_spec_level(old.data, new.data, raw) if old.spec and new.spec else []
    for c in spec_changes:
        c.where = place(c, old, new, None)
    report.spec_changes = renamed + spec_changes
    return report


def _index(data: Mapping[str, Any], section: str, name: str) -> int | None:
    for i, item in enumerate(data.get(section) or []):
        if isinstance(item, dict) and item.get("name") == name:
            return i
    return None


def place(c: Change, old: Side, new: Side, mode: str | None) -> str:
    """`file:line` a change comes from: the spec or lib fragment that writes it, on the new side (the
    old side for what was removed); "" when nothing written says it (a builtin, a default)."""
    side = old if c.op == "removed" else new
    if side.spec is None:
        return ""
    marks = side.spec.marks
    if c.section == "values":
        name, *rest = c.subject.split(".")
        for head in ((("modes", mode, name),) if mode else ()) + (("values", name),):
            if head in marks:
                return side.place(head + tuple(rest))
        return ""
    if c.section in ("steps", "checks"):
        if c.op == "reordered":
            return side.place(("steps",))
        # An expansion of a `for_each` check is written where its family is (or its own override).
        family = family_of(c.subject) if c.section == "checks" else None
        names = (c.subject, family) if family else (c.subject,)
        if c.op == "disabled":
            for name in names:
                if ("disable", name) in side.spec.key_marks:
                    file, line, _ = side.spec.locate_key(("disable", name))
                    return f"{side.shown(file)}:{line}"
        i = next((i for name in names if (i := _index(side.data, c.section, name)) is not None), None)
        if i is None:
            return ""
        field_path = tuple(c.field.split(".")) if c.op == "changed" and c.field else ()
        return side.place((c.section, i) + field_path)
    return side.place(tuple(c.subject.split(".")))


def static_shifts(
    old: Any, new: Any, changes: Sequence[Change], only: Callable[[Mapping[str, Any]], bool] | None = None
) -> dict[str, Shift]:
    """What each check a change touches asks of a run, old against new, from the spec's values in
    this mode: checks whose expr, when or let changed, and unchanged checks reading a value that moved
    (of those `only` keeps, when given)."""
    rewritten = {
        c.subject
        for c in changes
        if c.section == "checks" and c.op == "changed" and c.field.split(".")[0] in (*EXPR_FIELDS, "let")
    }
    va, vb = redact(old.values), redact(new.values)
    moved = {k for k in set(va) | set(vb) if va.get(k, ABSENT) != vb.get(k, ABSENT)}
    before = {c["name"]: c for c in old.checks}
    out: dict[str, Shift] = {}
    for check in new.checks:
        was = before.get(check["name"])
        if was is None or was.get("disabled") or check.get("disabled") or (only is not None and not only(check)):
            continue
        values_read = {p[1] for p in reads(check) + reads(was) if p[0] == "values" and len(p) > 1}
        if check["name"] in rewritten or values_read & moved:
            out[check["name"]] = shift(was, check, va, vb)
    return out


def _key(c: Change) -> str:
    """Identity for grouping the same change across modes: what a reader sees of it. An argument
    list is keyed by its token delta, so `added --verify-pushes after --prune` is one change
    even where the rest of the command differs by mode."""

    def j(v: Any) -> Any:
        return "<absent>" if v is ABSENT else v

    payload: Any = [j(c.old), j(c.new)]
    if c.op == "changed" and scalar_list(c.old) and scalar_list(c.new):
        payload = argv_delta(c.old, c.new)
    return json.dumps([c.section, c.op, c.subject, c.field, payload, c.extra, c.where], sort_keys=True, default=str)


class _EmptyPlan:
    """The plan of a spec that does not exist on one side."""

    values: dict[str, Any] = {}
    secret_names: list[str] = []
    steps: list[dict[str, Any]] = []
    checks: list[dict[str, Any]] = []
    budget_s = None
    worst_case_s = 0.0
    fingerprints: dict[str, str] = {}
