"""Every mode under every target: the plans a spec makes where an environment variable picks a case of
its values (`env: {SPECPROBE_TARGET: target}` with `switch: target` cases local, gpu, real).

A saved run is of one mode on one target, and the diff plans each mode with no environment (the
spec's default target). A change that only moves a value on another target (the gpu geometry's loss
ceiling, its parameter count) is invisible there; here each mode is planned again under each case a
`switch:` lists for a value a variable sets, both sides alike, and what differs from the mode's own
diff is that target's.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

from engine.diff.model import FIXED_BUILTINS, Change, ModeDiff, Side
from engine.spec.plan import build_plan

# At most this many environments per mode (products of switch cases) are tried.
MAX_VARIANTS = 32


def switched(data: Mapping[str, Any]) -> dict[str, list[str]]:
    """Value name -> the cases `switch:` lists on it, for each value the spec's `env:` lets a variable
    set (`target`: gpu, local, real)."""
    cases: dict[str, set[str]] = {}
    blocks = [data.get("values") or {}] + [m for m in (data.get("modes") or {}).values() if isinstance(m, Mapping)]
    for block in blocks:
        for raw in block.values() if isinstance(block, Mapping) else []:
            if isinstance(raw, Mapping) and set(raw) == {"switch", "cases"} and isinstance(raw["cases"], Mapping):
                cases.setdefault(str(raw["switch"]), set()).update(str(k) for k in raw["cases"])
    set_by_env = {str(name) for name in (data.get("env") or {}).values()}
    return {name: sorted(c) for name, c in cases.items() if name in set_by_env}


def environments(data: Mapping[str, Any]) -> list[dict[str, str]]:
    """The environments a spec can be planned under as far as it says: none, and each case a `switch:`
    lists for a value the spec lets an environment variable set (`SPECPROBE_TARGET`: local, gpu, real)."""
    cases = switched(data)
    out: list[dict[str, str]] = [{}]
    for var, name in (data.get("env") or {}).items():
        out += [{**env, var: case} for env in out for case in cases.get(str(name), ())]
    return out[:MAX_VARIANTS]


def _named(data: Mapping[str, Any], env: Mapping[str, str]) -> dict[str, str]:
    """{SPECPROBE_TARGET: gpu} -> {target: gpu}."""
    names = data.get("env") or {}
    return {str(names[var]): case for var, case in env.items() if var in names}


def default_env(side: Side) -> dict[str, str]:
    """The cases the spec's default target picks (`target: local`), for the values a variable may set."""
    plan = next(iter(side.plans.values()), None) if side.spec is not None else None
    if plan is None:
        return {}
    return {n: str(plan.values[n]) for n in switched(side.data) if n in plan.values}


def _plan(side: Side, mode: str, env: Mapping[str, str]) -> Any | None:
    try:
        return build_plan(side.spec, mode=mode, environ=env, builtins=FIXED_BUILTINS)
    except Exception:  # a case this side's switches lack: not a way this side runs
        return None


def plans(
    old: Side, new: Side, modes: list[str]
) -> tuple[dict[tuple[str, str], tuple[dict[str, str], Any, Any]], list[tuple[str, dict[str, str]]]]:
    """(mode, environment key) -> (the values it sets, old plan, new plan), for each mode both sides have,
    under each environment either side names that both can plan and that plans differently from the
    mode's own on some side (`target: local`, the default, is the mode itself); and (mode, the values)
    of each that the old side plans and the new one no longer can (a target taken away)."""
    envs: dict[str, dict[str, str]] = {}
    for side in (old, new):
        for env in environments(side.data)[1:]:
            envs.setdefault(repr(sorted(env.items())), env)
    out: dict[tuple[str, str], tuple[dict[str, str], Any, Any]] = {}
    lost: list[tuple[str, dict[str, str]]] = []
    defaults = (default_env(old), default_env(new))
    for mode in modes:
        for key, env in envs.items():
            named = _named(new.data, env) or _named(old.data, env)
            if all(d.get(n) == case for d in defaults for n, case in named.items()):
                continue  # the cases the default picks already (`target: local`): the mode itself
            a, b = _plan(old, mode, env), _plan(new, mode, env)
            if a is not None and b is None:
                lost.append((mode, named))
            if a is None or b is None:
                continue
            if a.values == old.plans[mode].values and b.values == new.plans[mode].values:
                continue
            out[(mode, key)] = (named, a, b)
    return out, lost


def residual(
    found: Mapping[tuple[str, str], tuple[dict[str, str], Any, Any]],
    mode_diffs: Mapping[str, ModeDiff],
    diff: Callable[[Any, Any], tuple[list[Change], Any]],
    key: Callable[[Change], str],
    where: Callable[[Change, str], str],
) -> list[tuple[ModeDiff, Any, Any, list[Change]]]:
    """One ModeDiff per (mode, environment) holding what differs from its mode's own diff, with both
    plans and every change it has (its shifts are judged on those): none where nothing does."""
    out = []
    for (mode, _), (named, a, b) in found.items():
        changes, budget = diff(a, b)
        for c in changes:
            c.where = where(c, mode)
        own = mode_diffs[mode]
        seen = {key(c) for c in own.changes}
        rest = [c for c in changes if key(c) not in seen]
        if budget == own.budget:
            budget = None
        if rest or budget is not None:
            out.append((ModeDiff(mode, "both", rest, budget, env=named), a, b, changes))
    return out
