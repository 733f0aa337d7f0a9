"""The plan: a spec resolved for one mode — values, steps with defaults filled in, checks, budget.

The runner executes a Plan and nothing else, so everything it needs (argv, timeouts, enabled flags)
is decided here, once, and `engine plan` can show it before anything runs. Here too: the run's
secret filter (`masking`), each step's definition as the evidence stores it (`stored_definitions`,
next to its `fingerprint`), and a saved run's plan under the current spec (`replan`), which the
re-check, the report's plots and the review all start from.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from jmespath import exceptions as jexc

from engine import defaults
from engine.expr import functions
from engine.expr.trace import trace
from engine.secrets import REDACTED, PlanSecrets, Scrubber, is_secret, redact, redact_text
from engine.spec import expand, plotdefs, require, resolved
from engine.spec.load import Spec, family_of
from engine.spec.located import SpecError, SpecErrors
from engine.spec.values import (
    PER_RUN_BUILTINS,
    UnknownVariable,
    UsageError,
    layer,
    parse_sets,
    resolve,
    substitute_text,
    template,
    unknown_message,
)
from engine.text import compact
from engine.types import Check, Step

__all__ = [
    "Plan",
    "UsageError",
    "build_plan",
    "default_builtins",
    "masking",
    "mode_names",
    "pick_mode",
    "replan",
    "stored_definitions",
    "values_summary",
]

KINDS = ("run", "remove", "collect")
# Blocks a step of any kind may carry beside its kind's: what makes it a reference, what it snapshots.
# Keys of a step that are not templated: `when` is JMESPath over values, the rest are labels.
_UNTEMPLATED = ("name", "when", "description")


def run_stamp() -> str:
    """The UTC second a run (or a re-check) started, as it appears in run ids and file names."""
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())


def mode_names(data: Mapping[str, Any]) -> list[str]:
    return [k for k in (data.get("modes") or {}) if k != "default"]


def pick_mode(data: Mapping[str, Any], mode: str | None, environ: Mapping[str, str]) -> str:
    """--mode, else the spec's mode_env variable, else modes.default; "default" when there are no modes."""
    known = mode_names(data)
    env_var = data.get("mode_env")
    chosen, how = mode, "--mode"
    if chosen is None and env_var and environ.get(env_var):
        chosen, how = environ[env_var], env_var
    if chosen is None:
        chosen, how = (data.get("modes") or {}).get("default"), "modes.default"
    if chosen is None:
        if not known:
            return "default"
        if len(known) == 1:
            return known[0]
        raise UsageError(f"no mode given and no modes.default; known modes: {', '.join(known)}")
    if known and chosen not in known:
        raise UsageError(f"unknown mode {chosen!r} (from {how}); known modes: {', '.join(known)}")
    if not known and chosen != "default":
        raise UsageError(f"unknown mode {chosen!r} (from {how}); this spec has no modes")
    return chosen


def default_builtins(spec: Spec, mode: str) -> dict[str, Any]:
    run_id = run_stamp()
    work = os.getcwd()
    return {
        "python": sys.executable,
        "work_dir": work,
        "spec_dir": str(spec.path.resolve().parent),
        "run_dir": str(Path(work) / "runs" / f"{spec.data.get('name', 'spec')}-{run_id}"),
        "run_id": run_id,
        "mode": mode,
    }


def _with_defaults(obj: Mapping[str, Any] | None, defaults: Mapping[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(dict(defaults))
    out.update(obj or {})
    return out


def _fill_run(run: dict[str, Any]) -> dict[str, Any]:
    out = _with_defaults(run, defaults.RUN)
    out["output"] = _with_defaults(run.get("output"), defaults.OUTPUT)
    out["output"]["harvest"] = {
        k: _with_defaults(v, defaults.HARVEST) for k, v in (out["output"]["harvest"] or {}).items()
    }
    out["signals"] = [_with_defaults(s, defaults.SIGNAL) for s in out["signals"] or []]
    if out["progress"] is not None:
        out["progress"] = _with_defaults(out["progress"], defaults.PROGRESS)
    diag = (out["on_failure"] or {}).get("diagnostics")
    if diag is not None:
        out["on_failure"] = {"diagnostics": _with_defaults(diag, defaults.DIAGNOSTICS)}
    out["env"] = {
        k: v if isinstance(v, str) else json.dumps(v) if isinstance(v, bool) else str(v) for k, v in out["env"].items()
    }
    out["argv"] = [str(a) for a in out["argv"]] if isinstance(out["argv"], list) else out["argv"]
    return out


def step_kind(step: Mapping[str, Any]) -> str:
    """`run`, `remove` or `collect`: the step's `kind` once resolved, else the key it has."""
    if step.get("kind") in KINDS:
        return step["kind"]
    for kind in KINDS:
        if kind in step:
            return kind
    raise ValueError(f"step {step.get('name')!r} ({step.get('file')}:{step.get('line')}) has none of {KINDS}")


def _seconds(x: Any, minimum: float) -> float | None:
    ok = isinstance(x, (int, float)) and not isinstance(x, bool) and minimum <= x < float("inf")
    return float(x) if ok else None


def command_timeout(collect: Mapping[str, Any]) -> float | None:
    """Worst case of a built-in command collection: args.timeout_s + args.grace_s (their defaults if absent);
    None if either is not a usable number (validate reports it)."""
    args = collect.get("args") or {}
    t = _seconds(args.get("timeout_s", defaults.COMMAND_COLLECT_TIMEOUT_S), 1e-9)
    g = _seconds(args.get("grace_s", defaults.COMMAND_COLLECT_GRACE_S), 0)
    return None if t is None or g is None else t + g


def step_cost(step: Mapping[str, Any]) -> float:
    """Worst-case seconds of a resolved step if it runs."""
    kind = step["kind"]
    if kind == "run":
        return float(step["run"]["timeout_s"]) + float(step["run"]["grace_s"])
    if kind == "collect":
        c = step["collect"]
        if c.get("timeout_s") is not None:
            return float(c["timeout_s"])
        if c.get("collector") == "command":
            t = command_timeout(c)
            return defaults.COMMAND_COLLECT_TIMEOUT_S if t is None else t
    return 0.0


# The keys of `progress:` that only shape what its line says (the leg's own total, its phases).
PROGRESS_DISPLAY = ("total", "phases")


def snapshot_block(given: Any) -> dict[str, Any]:
    """`snapshot:` as written (a path, a list, or `{paths, max_bytes}`) -> `{paths: [...]}` plus
    `max_bytes` when given (a default filled in would move the fingerprint when it changes)."""
    paths = given.get("paths") if isinstance(given, dict) else given
    out: dict[str, Any] = {"paths": [paths] if isinstance(paths, str) else list(paths)}
    if isinstance(given, dict) and given.get("max_bytes") is not None:
        out["max_bytes"] = given["max_bytes"]
    return out


def step_definition(step: Mapping[str, Any]) -> dict[str, Any]:
    """What a resolved step does: everything but its location, its output rules and how its
    progress line reads (`PROGRESS_DISPLAY`). Output rules are left out so `engine replay` with new
    harvest rules still matches the same leg; the progress display, so that a better-worded line
    does not void the saved runs of a leg that runs exactly as it did."""
    out = {k: v for k, v in step.items() if k not in ("file", "line")}
    if "run" in out:
        out["run"] = {k: v for k, v in out["run"].items() if k != "output"}
        progress = out["run"].get("progress")
        if isinstance(progress, Mapping):
            out["run"]["progress"] = {k: v for k, v in progress.items() if k not in PROGRESS_DISPLAY}
    return out


def fingerprint(step: Mapping[str, Any]) -> str:
    """sha256 of the canonical JSON of a step's definition (`step_definition`)."""
    text = json.dumps(step_definition(step), sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def masking(plan: PlanSecrets, environ: Mapping[str, str]) -> Scrubber:
    """The secret filter of a run of `plan` where the environment is `environ`: its secret values,
    the environment's secret-named variables (HF_TOKEN) and each step's secret-named `env`
    (engine/secrets.py). Built here for every user: the run's record (engine/run/record.py) masks all
    it writes with it, and a saved run's definitions are compared as it masked them."""
    return Scrubber.for_plan(plan, environ)


def stored_definitions(plan: PlanSecrets, environ: Mapping[str, str]) -> dict[str, Any]:
    """Each step's definition (`step_definition`, what its fingerprint hashes) as a run's evidence
    stores it: masked by `masking(plan, environ)`. A saved run's `definitions` are compared with these;
    unmasked, a secret would differ from its `<redacted>` every time."""
    mask = masking(plan, environ)
    return {s["name"]: mask.scrub_obj(step_definition(s)) for s in plan.steps}


def stored_output_rules(plan: PlanSecrets, environ: Mapping[str, str]) -> dict[str, Any]:
    """Each run step's output rules as a run's evidence stores them (`output_rules`), masked the same way."""
    mask = masking(plan, environ)
    return {s["name"]: mask.scrub_obj((s.get("run") or {}).get("output")) for s in plan.steps if "run" in s}


def secret_value_names(data: Mapping[str, Any], values: Mapping[str, Any], sources: Mapping[str, str]) -> list[str]:
    """The values that hold a secret: a secret-looking name, or a value the spec's `env:` fed from
    a secret-named variable (`env: {GITHUB_TOKEN: repo}` makes `repo` the token)."""
    from_secret_env = {name for var, name in (data.get("env") or {}).items() if is_secret(str(var))}
    return sorted(k for k in values if is_secret(k) or (k in from_secret_env and sources.get(k) == "env"))


def values_lines(values: Mapping[str, Any], sources: Mapping[str, str], secret_names: Iterable[str] = ()) -> list[str]:
    """The `values:` block of `engine plan` and `engine run`: each value (secrets redacted) and
    the layer it came from."""
    shown = redact(values, secret_names)
    width = max((len(k) for k in shown), default=0)
    return ["values:"] + [
        f"  {k:<{width}} = {json.dumps(v, default=str)}  [{sources.get(k, '?')}]" for k, v in shown.items()
    ]


def values_summary(
    values: Mapping[str, Any],
    sources: Mapping[str, str],
    mode: str,
    env_vars: Mapping[str, str] | None = None,
    secret_names: Iterable[str] = (),
) -> str:
    """The one line `engine run` prints instead of the `values:` block (`-v` prints the block): how
    many values, and each one overridden with where (`--set`, or the environment variable of
    `env_vars`, value name -> variable), secrets redacted."""
    shown, env_vars = redact(values, secret_names), env_vars or {}
    overridden = [
        f"{k}={compact(shown[k], 60)} ({'--set' if src == '--set' else f'env {env_vars.get(k, src)}'})"
        for k, src in sources.items()
        if src in ("--set", "env") and k in shown
    ]
    return f"{len(values)} values (mode {mode}); " + (
        f"overridden: {', '.join(overridden)}" if overridden else "none overridden"
    )


@dataclass
class Plan:
    spec: Spec
    name: str
    mode: str
    values: dict[str, Any]
    sources: dict[str, str]
    secret_names: list[str]
    steps: list[Step]
    checks: list[Check]
    budget_s: float | None
    worst_case_s: float
    fingerprints: dict[str, str] = field(default_factory=dict)
    plots: list[plotdefs.PlotDef] = field(default_factory=list)  # for this mode, `for_each` series expanded

    def contributions(self) -> list[tuple[str, float]]:
        """(step, worst-case seconds) of the enabled steps that cost time, biggest first."""
        costs = [(s["name"], step_cost(s)) for s in self.steps if s["enabled"]]
        return sorted([c for c in costs if c[1] > 0], key=lambda c: -c[1])

    def describe(self) -> str:
        """Human-readable plan for `engine plan`; secrets are redacted."""
        lines = [f"spec {self.name} ({self.spec.path}) mode {self.mode}"]
        budget = "none" if self.budget_s is None else f"{self.budget_s:g} s"
        headroom = "" if self.budget_s is None else f", headroom {self.budget_s - self.worst_case_s:g} s"
        lines.append(f"budget {budget}, worst case {self.worst_case_s:g} s{headroom}")
        lines.append("")
        lines += values_lines(self.values, self.sources, self.secret_names)
        lines.append("")
        lines.append("steps:")
        for i, s in enumerate(self.steps, 1):
            state = "" if s["enabled"] else "  (skipped: when is not true)"
            lines.append(f"  {i}. {s['name']} [{s['kind']}] {s['file']}:{s['line']}{state}")
            lines.extend("     " + x for x in self._step_lines(s))
        lines.append("")
        lines.append("checks:")
        for c in self.checks:
            when = f" when {c['when']}" if c.get("when") else ""
            disabled = f"  (DISABLED: {c['disabled']})" if c.get("disabled") else ""
            lines.append(f"  - {c['name']} [{c['severity']}] {c['expr']}{when}{disabled}")
            lines.extend(f"      let {k} = {t}" for k, t in (c.get("let") or {}).items())
        return redact_text("\n".join(lines), self.values, self.secret_names) + "\n"

    def _step_lines(self, s: Mapping[str, Any]) -> list[str]:
        return self._kind_lines(s) + _block_lines(s)

    def _kind_lines(self, s: Mapping[str, Any]) -> list[str]:
        if s["kind"] == "remove":
            return [f"remove {p}" for p in s["remove"]] + [
                f"(outside the work and run dirs only under {d})" for d in s.get("remove_also_under", [])
            ]
        if s["kind"] == "collect":
            c = s["collect"]
            return [f"collector {c['collector']} args {json.dumps(c.get('args') or {})}"]
        r = s["run"]
        out = [
            "argv: " + " ".join(_quote(a) for a in r["argv"]),
            f"timeout {r['timeout_s']:g} s + grace {r['grace_s']:g} s, ok exit codes {r['ok_exit_codes']}",
        ]
        if r["cwd"]:
            out.append(f"cwd: {r['cwd']}")
        if r["env"]:
            out.append("env: " + " ".join(f"{k}={REDACTED if is_secret(k) else v}" for k, v in r["env"].items()))
        if r["precondition"]:
            out.append(f"precondition: {r['precondition']}")
        for sig in r["signals"]:
            if sig.get("hold_at"):
                out.append(
                    f"signal {sig['signal']} after {sig['after_s']:g} s at the leg's hold point {sig['hold_at']}"
                )
                continue
            held = "held there, then " if sig.get("hold") else ""
            out.append(f"signal {held}{sig['signal']} after {sig['after_s']:g} s on /{sig['match']}/")
        if r["output"]["harvest"]:
            out.append(
                "harvest: "
                + ", ".join(
                    f"{k} <- {v['marker']!r} ({_harvest_opts(v)})"
                    if v.get("marker") is not None
                    else f"{k} <- /{v['match']}/ ({v['pick']})"
                    for k, v in r["output"]["harvest"].items()
                )
            )
        if r["output"].get("fail_on"):
            out.append("fails on a line matching: " + ", ".join(f"/{p}/" for p in r["output"]["fail_on"]))
        if r["output"].get("warn_on"):
            out.append("warns on a line matching: " + ", ".join(f"/{p}/" for p in r["output"]["warn_on"]))
        return out


def _block_lines(s: Mapping[str, Any]) -> list[str]:
    """What `engine plan` says of a step's reference and snapshot blocks."""
    out = []
    ref = s.get("reference") or {}
    if ref.get("dir"):
        out.append(f"reference in {ref['dir']} (reused while its definition and inputs are unchanged)")
        inputs = ref.get("inputs") or {}
        out += [
            f"  input {kind}: {', '.join(map(str, inputs[kind]))}"
            for kind in ("git", "packages", "files")
            if inputs.get(kind)
        ]
    elif ref.get("of"):
        out.append(f"part of the reference {ref['of']} (reused with it)")
    snap = s.get("snapshot")
    if snap:
        out.append(f"snapshot before it runs: {', '.join(map(str, snap['paths']))}")
    return out


def _harvest_opts(rule: Mapping[str, Any]) -> str:
    """`last`, plus the opt-ins that keep a harvest problem from failing the verdict."""
    opts = [str(rule["pick"])]
    for key in ("on_conflict", "on_malformed"):
        if rule.get(key, defaults.HARVEST[key]) != defaults.HARVEST[key]:
            opts.append(f"{key} {rule[key]}")
    return ", ".join(opts)


def _quote(a: str) -> str:
    return a if a and all(c.isalnum() or c in "-_./=:,@%+${}" for c in a) else json.dumps(a)


def _enabled(spec: Spec, index: int, when: str | None, values: Mapping[str, Any]) -> tuple[bool, SpecError | None]:
    """A step's `when` over the values: exactly true runs it, exactly false skips it. Anything else (a
    null from a missing key, a number, a string) is a spec error, never a quiet skip."""
    if when is None:
        return True, None
    where = ("steps", index, "when")
    bad = functions.problems(when)
    if bad:
        return False, spec.error(where, bad[0])
    try:
        value, missing, _ = trace(when, dict(values), functions.OPTIONS, explain=False)
    except (jexc.JMESPathError, TypeError, ValueError) as e:
        return False, spec.error(where, f"{when!r} failed: {' '.join(str(e).split())}")
    if missing:
        what = (
            unknown_message(missing[0], values, ref=False)
            if missing[0] not in values and "." not in missing[0]
            else f"{missing[0]}, which is missing"
        )
        return False, spec.error(where, f"step condition {when!r} reads {what}")
    if not isinstance(value, bool):
        return False, spec.error(where, f"step condition {when!r} must yield true or false, got {compact(value, 80)}")
    return value, None


def _resolve_check(
    spec: Spec, i: int, c: Mapping[str, Any], values: Mapping[str, Any], element: expand.Element | None = None
) -> tuple[dict[str, Any], list[SpecError]]:
    """One check (one expansion of a `for_each` check): `${x}` spliced into expr/when/let, the
    element's references in its `why`, where it is written."""
    file, line, _ = spec.locate(("checks", i))
    name = element.name(c["name"]) if element else c["name"]
    owner = name if element else ""
    check: dict[str, Any] = {
        "name": name,
        "why": c["why"],
        "expr": c["expr"],
        "when": c.get("when"),
        "severity": c.get("severity", "gate"),
        "file": file,
        "line": line,
    }
    errors: list[SpecError] = []
    if element:
        try:
            check["why"] = expand.bind(c["why"], element, splice=False)
        except ValueError as e:
            errors.append(spec.error(("checks", i, "why"), f"in {owner}: {e}"))
    # A value named in the reason reads as its text ("under ${loss_ceiling}" -> "under 10.7"): a `${x}` shown as
    # written would tell a reader nothing, and an unknown name would pass unnoticed. Not a run's own values: the
    # reason of a check is the same in every run of the spec.
    stable = {k: v for k, v in values.items() if k not in PER_RUN_BUILTINS}
    try:
        check["why"] = substitute_text(check["why"], stable, ("checks", i, "why"))
    except UnknownVariable as e:
        errors.append(spec.error(("checks", i, "why"), unknown_message(e.name, stable)))
    texts = [("expr", c["expr"], ("checks", i, "expr")), ("when", c.get("when"), ("checks", i, "when"))]
    lets = dict(c.get("let") or {})
    texts += [(f"let.{k}", t, ("checks", i, "let", k)) for k, t in lets.items()]
    for key, text, path in texts:
        if not isinstance(text, str):
            continue
        done, problem = expand.splice(text, values, path, element, owner)
        if problem:
            errors.append(spec.error(*problem))
        elif key.startswith("let."):
            lets[key[4:]] = done
        else:
            check[key] = done
    if lets:
        check["let"] = lets
    return check, errors


def _expanded(spec: Spec, values: Mapping[str, Any]) -> tuple[list[dict[str, Any]], dict[str, int], list[SpecError]]:
    """Every check, a `for_each` one as one check per element; and the checks that override one
    expansion (`name[var=label]` with `override: true`), by name -> index, applied after."""
    checks: list[dict[str, Any]] = []
    overrides: dict[str, int] = {}
    declared = list(enumerate(spec.data.get("checks") or []))
    too_many = expand.over_limit([(("checks", i), c.get("for_each")) for i, c in declared], values)
    if too_many:
        return [], {}, [spec.error(*too_many)]
    errors: list[SpecError] = []
    for i, c in declared:
        if family_of(c["name"]) is not None:
            overrides[c["name"]] = i
            continue
        elements: list[expand.Element | None] = [None]
        if c.get("for_each"):
            found, problems = expand.elements(c["for_each"], values, ("checks", i, "for_each"))
            errors += [spec.error(*p) for p in problems]
            elements = list(found)
        for element in elements:
            check, errs = _resolve_check(spec, i, c, values, element)
            checks.append(check)
            errors += errs
    return checks, overrides, errors


def _expansions_of(family: str, checks: list[dict[str, Any]]) -> str:
    names = [c["name"] for c in checks if family_of(c["name"]) == family]
    return ", ".join(names) or "none"


def resolve_checks(spec: Spec, values: Mapping[str, Any]) -> tuple[list[Check], list[SpecError]]:
    """The spec's checks for one mode: each `for_each` check expanded into one check per element,
    `${x}` spliced into expr/when/let, where each is written, and the reason of each disabled one
    (`disable:` names a check, a whole `for_each` family, or one expansion)."""
    checks, overrides, errors = _expanded(spec, values)
    mode = values.get("mode")
    at = {c["name"]: k for k, c in enumerate(checks)}
    for name, i in overrides.items():
        family = family_of(name)
        if name not in at:
            errors.append(
                spec.error(
                    ("checks", i, "name"),
                    f"check {name!r} overrides an expansion {family!r} does not have in mode {mode!r}; "
                    f"its expansions: {_expansions_of(str(family), checks)}",
                )
            )
            continue
        checks[at[name]], errs = _resolve_check(spec, i, spec.data["checks"][i], values)
        errors += errs
    disabled = spec.data.get("disable") or {}
    for key in disabled:
        family = family_of(key)
        if family is not None and key not in at:
            errors.append(
                spec.error(
                    ("disable", key),
                    f"disable names {key!r}, an expansion {family!r} does not have in mode {mode!r}; "
                    f"its expansions: {_expansions_of(family, checks)}",
                    key=True,
                )
            )
    for check in checks:
        key = check["name"] if check["name"] in disabled else family_of(check["name"])
        if key in disabled:
            dfile, dline, _ = spec.locate_key(("disable", key))
            check["disabled"] = disabled[key]
            check["disabled_at"] = f"{dfile}:{dline}"
    return checks, errors  # type: ignore[return-value]


def resolve_step(
    spec: Spec, index: int, raw: dict[str, Any], values: Mapping[str, Any], mode: str
) -> tuple[dict[str, Any], list[SpecError]]:
    """One step, templated with `values`, defaults filled, `enabled` decided; plus its errors."""
    errors: list[SpecError] = []
    body = {k: v for k, v in raw.items() if k not in _UNTEMPLATED}
    try:
        body = template(body, values, ("steps", index), spec.locate)
    except SpecError as e:
        return {}, [e]
    kind = step_kind(raw)
    step: dict[str, Any] = {"name": raw["name"], "kind": kind}
    if raw.get("description"):
        step["description"] = raw["description"]
    step.update(body)
    errors.extend(resolved.check_step(spec, index, {**step, "name": raw["name"]}, mode, step_kind(step)))
    if errors:
        return {}, errors
    if kind == "run":
        step["run"] = _fill_run(step["run"])
    elif kind == "remove":
        spec_ = step["remove"]
        paths = spec_.get("paths") if isinstance(spec_, dict) else spec_
        step["remove"] = [paths] if isinstance(paths, str) else list(paths)
        if isinstance(spec_, dict) and spec_.get("also_under"):
            # Only when given: a new key in every remove step would change every fingerprint.
            step["remove_also_under"] = list(spec_["also_under"])
    else:
        step["collect"] = {"args": {}, **step["collect"]}
    if "snapshot" in step:
        step["snapshot"] = snapshot_block(step["snapshot"])
    step["when"] = raw.get("when")
    step["enabled"], err = _enabled(spec, index, raw.get("when"), values)
    if err:
        errors.append(err)
    file, line, _ = spec.locate(("steps", index))
    step["file"], step["line"] = file, line
    return step, errors


def build_plan(
    spec: Spec,
    mode: str | None = None,
    sets: Sequence[str] = (),
    environ: Mapping[str, str] | None = None,
    builtins: Mapping[str, Any] | None = None,
) -> Plan:
    """Resolve `spec` for one mode. UsageError for a bad mode/--set; SpecErrors for spec problems."""
    env = os.environ if environ is None else environ
    data = spec.data
    chosen = pick_mode(data, mode, env)
    b = default_builtins(spec, chosen)
    b.update(builtins or {})
    b["mode"] = chosen
    defs = layer(data, chosen, env, parse_sets(sets), b)
    resolved = resolve(defs, spec.locate)
    if resolved.errors:
        raise SpecErrors(resolved.errors)
    values = resolved.values
    errors: list[SpecError] = []
    steps = []
    for i, raw in enumerate(data.get("steps") or []):
        step, errs = resolve_step(spec, i, raw, values, chosen)
        errors.extend(errs)
        if step:
            steps.append(step)
    if errors:
        raise SpecErrors(sorted(errors, key=SpecError.sort_key))
    checks, errors = resolve_checks(spec, values)
    plots, problems = plotdefs.resolve(data, values, spec.locate_key)
    errors += [spec.error(*p) for p in problems]
    secrets = secret_value_names(data, values, resolved.sources)
    errors += [
        require.requirement_error(spec, i, found, [chosen])
        for i, found in require.unmet(spec, values, steps, chosen, secrets)
    ]
    if errors:
        raise SpecErrors(sorted(errors, key=SpecError.sort_key))
    plan = Plan(
        spec=spec,
        name=data.get("name", ""),
        mode=chosen,
        values=values,
        sources=resolved.sources,
        secret_names=secrets,
        steps=steps,
        checks=checks,
        budget_s=data.get("budget_s"),
        worst_case_s=0.0,
        fingerprints={s["name"]: fingerprint(s) for s in steps},
        plots=plots,
    )
    plan.worst_case_s = sum(c for _, c in plan.contributions())
    return plan


def _yaml_scalar(value: Any) -> str:
    """A --set text that parses back to `value` (--set values are YAML scalars; JSON is YAML, but
    YAML spells the non-finite floats .nan/.inf)."""
    if isinstance(value, float) and value != value:
        return ".nan"
    if isinstance(value, float) and value in (float("inf"), float("-inf")):
        return ".inf" if value > 0 else "-.inf"
    return json.dumps(value)


def replan(
    spec: Spec, evidence: Mapping[str, Any], environ: Mapping[str, str] | None = None, sets: Sequence[str] = ()
) -> Plan:
    """The plan a saved run would have had with the CURRENT spec: same mode, same --set and
    env overrides, same builtins (run_dir, run_id, ... differ per run by design), then `sets` (a
    resumed run's own --set) over them. SpecErrors or UsageError when the current spec cannot be
    planned that way."""
    environ = os.environ if environ is None else environ
    values: Mapping[str, Any] = evidence.get("values") or {}
    sources: Mapping[str, str] = evidence.get("sources") or {}
    env_names = {name: var for var, name in (spec.data.get("env") or {}).items()}
    saved_sets, overrides = [], {}
    for name, source in sources.items():
        if source not in ("--set", "env") or name not in values:
            continue
        value = values[name]
        if REDACTED in str(value) and name in env_names and env_names[name] in environ:
            # Secrets are not stored; the caller's environment is the only place they live.
            overrides[env_names[name]] = environ[env_names[name]]
        else:
            saved_sets.append(f"{name}={_yaml_scalar(value)}")
    # Builtins differ per run by design; the re-check reuses the run's own.
    builtins = {k: values[k] for k in PER_RUN_BUILTINS if k in values and sources.get(k) == "builtin"}
    return build_plan(spec, mode=evidence.get("mode"), sets=[*saved_sets, *sets], environ=overrides, builtins=builtins)
