"""Which gates can run at all: a `when` false in every mode, and under every environment the spec
names, is a gate that is SKIPPED on every run (`engine review` says so).

The spec's values decide most `when`s (`mode == 'soak'`, `values.gate_peak`); a value an environment
variable may set (`env: {SPECPROBE_TARGET: target}`) is tried at each case a `switch:` on it lists, so a
gate meant for GPU targets is not taken for one that never runs. A `when` that reads the run is
evaluated on the saved run in its mode; in a mode with no saved run it might be true.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

from engine.diff.model import FIXED_BUILTINS, envs_text
from engine.diff.variants import environments
from engine.expr import functions
from engine.expr.trace import check_document, trace
from engine.spec.plan import default_builtins
from engine.spec.values import layer, resolve
from engine.text import code


def _values(spec: Any, mode: str, environ: Mapping[str, str]) -> dict[str, Any] | None:
    """A mode's values under an environment, as `engine diff` plans them (fixed per-run builtins);
    None when the spec cannot be planned so (a case a switch lacks)."""
    builtins = {**default_builtins(spec, mode), **FIXED_BUILTINS, "mode": mode}
    try:
        resolved = resolve(layer(spec.data, mode, environ, {}, builtins), spec.locate)
    except Exception:  # an environment the spec cannot take: not a way it runs
        return None
    return None if resolved.errors else resolved.values


def _when_false(check: Mapping[str, Any], doc: Mapping[str, Any]) -> bool:
    """The check's `when` is exactly false on `doc` (true, absent data or an error: not false)."""
    try:
        value, missing, _ = trace(check["when"], doc, functions.OPTIONS, explain=False, lets=check.get("let"))
    except Exception:  # an error is no proof that it never runs
        return False
    return value is False and not missing


def never_runs(
    spec: Any, plans: Mapping[str, Any], names: Iterable[str], run: Mapping[str, Any] | None = None
) -> dict[str, str]:
    """Check -> a phrase, for each of `names` whose `when` is false in every mode of `plans`, under every
    environment the spec names (`environments`). A `when` that reads the run is evaluated on the saved
    `run` in its mode; in a mode with no run it could be true, so it is not said to never run."""
    wanted, envs = set(names), environments(spec.data)
    ran = check_document(run) if run is not None else None
    false: dict[str, bool] = {}
    whens: dict[str, str] = {}
    for mode, plan in plans.items():
        base = {**ran, "mode": mode} if ran is not None and ran.get("mode") == mode else {"mode": mode}
        docs = [{**base, "values": v} for env in envs if (v := _values(spec, mode, env)) is not None]
        seen = set()
        for check in plan.checks:
            name = check["name"]
            if name in wanted and check.get("when") and not check.get("disabled"):
                seen.add(name)
                whens.setdefault(name, check["when"])
                if false.get(name, True):
                    false[name] = bool(docs) and all(_when_false(check, d) for d in docs)
        for name in wanted - seen:
            false[name] = False  # in this mode it runs (no `when`), or does not exist
    names_of = spec.data.get("env") or {}
    cases: dict[str, set[str]] = {}
    for env in envs:
        for var, case in env.items():
            cases.setdefault(str(names_of.get(var)), set()).add(case)
    whatever = "".join(f" and every {code(n)} ({', '.join(sorted(c))})" for n, c in sorted(cases.items()))
    modes = ", ".join(plans)
    return {
        name: f"`when: {whens[name]}` is false in every mode ({modes}){whatever}: the check never runs"
        for name, never in false.items()
        if never
    }


# ---------------------------------------------------------------- where a gate runs, mode by mode


def when_value(check: Mapping[str, Any], plan: Any) -> bool | None:
    """Whether a check runs in a plan's mode, by the spec's values: True (no `when`, or one that is true),
    False (a `when` exactly false: SKIPPED), None when its `when` reads the run or fails."""
    if not check.get("when"):
        return True
    doc = {"mode": plan.mode, "values": plan.values}
    try:
        value, missing, _ = trace(check["when"], doc, functions.OPTIONS, explain=False, lets=check.get("let"))
    except Exception:  # an error decides nothing here; the judge reports it on a run
        return None
    if missing or not isinstance(value, bool):
        return None
    return value


Pairs = Mapping[str, tuple[str, Mapping[str, str], Any, Any]]  # key -> (mode, environment, old plan, new plan)


def false_where(pairs: Pairs, names: Iterable[str], side: int = 1) -> dict[str, list[str]]:
    """Check -> the keys of `pairs` where its `when` is false on the new side (`side` 1) or the old (0)."""
    wanted, out = set(names), {}
    for key, (_, _, *plans) in pairs.items():
        for check in plans[side].checks if plans[side] is not None else []:
            if check["name"] in wanted and when_value(check, plans[side]) is False:
                out.setdefault(check["name"], []).append(key)
    return out


def newly_skipped(pairs: Pairs, names: Iterable[str]) -> dict[str, list[str]]:
    """Check -> the keys where its `when` is false now and was not before (it ran, or might have); a
    check new since the base asked nothing there before and is left out."""
    now, before = false_where(pairs, names), false_where(pairs, names, side=0)

    def existed(name: str, key: str) -> bool:
        old = pairs[key][2]
        return old is not None and any(c["name"] == name and not c.get("disabled") for c in old.checks)

    return {
        n: keys for n, ks in now.items() if (keys := [k for k in ks if k not in before.get(n, []) and existed(n, k)])
    }


def where_text(keys: Iterable[str], pairs: Pairs) -> str:
    """`mode smoke`, `mode soak on target gpu, real`: the modes (and targets) `keys` name, a mode said
    alone when every target of it is among them."""
    chosen = set(keys)
    by_mode: dict[str, list[str]] = {}
    for key, (mode, *_) in pairs.items():
        by_mode.setdefault(mode, []).append(key)
    parts = []
    for mode, all_keys in by_mode.items():
        hit = [k for k in all_keys if k in chosen]
        if not hit:
            continue
        envs = [pairs[k][1] for k in hit]
        alone = len(hit) == len(all_keys) or not any(envs)
        parts.append(f"mode {mode}" if alone else f"mode {mode} on {envs_text(envs)}")
    return "; ".join(parts)
