"""Which gates can run at all: a `when` false in every mode, and under every environment the spec
names, is a gate that is SKIPPED on every run (`engine review` says so).

The spec's values decide most `when`s (`mode == 'soak'`, `values.gate_peak`); a value an environment
variable may set (`env: {SPECPROBE_TARGET: target}`) is tried at each case a `switch:` on it lists, so a
gate meant for GPU targets is not taken for one that never runs. A `when` that reads the run is
evaluated on the saved run in its mode; in a mode with no saved run it might be true.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

from engine.diff.model import FIXED_BUILTINS
from engine.expr import functions
from engine.expr.trace import check_document, trace
from engine.spec.plan import default_builtins
from engine.spec.values import layer, resolve
from engine.text import code

# At most this many environments per mode (products of switch cases) are tried.
_MAX_VARIANTS = 32


def environments(data: Mapping[str, Any]) -> list[dict[str, str]]:
    """The environments a spec can be planned under as far as it says: none, and each case a `switch:`
    lists for a value the spec lets an environment variable set (`SPECPROBE_TARGET`: local, gpu, real)."""
    cases: dict[str, set[str]] = {}
    blocks = [data.get("values") or {}] + [m for m in (data.get("modes") or {}).values() if isinstance(m, Mapping)]
    for block in blocks:
        for raw in block.values() if isinstance(block, Mapping) else []:
            if isinstance(raw, Mapping) and set(raw) == {"switch", "cases"} and isinstance(raw["cases"], Mapping):
                cases.setdefault(str(raw["switch"]), set()).update(str(k) for k in raw["cases"])
    out: list[dict[str, str]] = [{}]
    for var, name in (data.get("env") or {}).items():
        out += [{**env, var: case} for env in out for case in sorted(cases.get(str(name), ()))]
    return out[:_MAX_VARIANTS]


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
