"""A leg renamed throughout a spec: found, and taken out of the diff as one change.

Renaming `leg3` to `leg_last` touches its steps (`leg3`, `wipe_before_leg3`, `hub_after_leg3`), the values
that name it (`final_leg`, `stops`), every check that reads it (`steps.leg3...`) and every check named
after it (`...[leg=leg3]`). Compared name by name that is a gate removed for each of those checks, a
rewritten one for each expression and a leg change: a reviewer who is shown a dozen false risks learns
to approve them all. So checks and steps are matched by what they do: a renaming is a whole word
replaced everywhere, and it is taken as one when every step it renames does exactly what a step of the
new side of that name does, in every mode. The old side is then compared with the renaming applied;
whatever else changed is still a change.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Mapping

from engine.spec.plan import Plan, fingerprint, step_definition

# Keys whose text is a location, never something the spec says.
_LOCATIONS = ("file",)


def _pattern(renames: Mapping[str, str]) -> re.Pattern[str]:
    # A whole word: `leg3` in `hub_after_leg3` and `steps.leg3.rc`, not in `leg30`. The longest first,
    # so that a name containing another is replaced as itself.
    words = sorted(renames, key=len, reverse=True)
    return re.compile(r"(?<![A-Za-z0-9])(" + "|".join(re.escape(w) for w in words) + r")(?![A-Za-z0-9])")


def substitute(obj: Any, renames: Mapping[str, str]) -> Any:
    """`obj` (spec data, a plan's steps, checks, values) with every renamed word replaced, in its
    strings and its keys."""
    if not renames:
        return obj
    pattern = _pattern(renames)

    def text(s: str) -> str:
        return pattern.sub(lambda m: renames[m.group(1)], s)

    def walk(o: Any) -> Any:
        if isinstance(o, str):
            return text(o)
        if isinstance(o, list):
            return [walk(x) for x in o]
        if isinstance(o, dict):
            return {(text(k) if isinstance(k, str) else k): (v if k in _LOCATIONS else walk(v)) for k, v in o.items()}
        return o

    return walk(obj)


def _names(plan: Plan) -> list[str]:
    return [s["name"] for s in plan.steps]


def _consistent(old: Plan, new: Plan, renames: Mapping[str, str]) -> bool:
    """Every step the renaming renames lands on a step of the new side that does exactly what it did."""
    by_name = {s["name"]: s for s in new.steps}
    before = set(_names(old))
    for step in old.steps:
        moved = substitute(step, renames)
        if moved["name"] == step["name"]:
            continue
        twin = by_name.get(moved["name"])
        if twin is None or moved["name"] in before or step_definition(moved) != step_definition(twin):
            return False
    return True


def detect(old: Mapping[str, Plan], new: Mapping[str, Plan]) -> dict[str, str]:
    """Old word -> new word for each step renamed consistently in every mode both sides have; {} when
    none is. The shortest names are tried first: renaming `leg3` renames `hub_after_leg3` with it."""
    modes = [m for m in new if m in old]
    if not modes:
        return {}
    first_old, first_new = _names(old[modes[0]]), _names(new[modes[0]])
    removed = sorted((n for n in first_old if n not in first_new), key=len)
    added = sorted((n for n in first_new if n not in first_old), key=len)
    renames: dict[str, str] = {}
    for gone in removed:
        if renames and substitute(gone, renames) in added:
            continue  # renamed with a shorter word already
        for came in added:
            if came in renames.values():
                continue
            trial = {**renames, gone: came}
            if all(_consistent(old[m], new[m], trial) for m in modes):
                renames = trial
                break
    return renames


def renamed_steps(plan: Plan, renames: Mapping[str, str]) -> list[tuple[str, str]]:
    """(old name, new name) of each step of `plan` the renaming renames."""
    return [(n, m) for n in _names(plan) if (m := substitute(n, renames)) != n]


def apply(plan: Plan, renames: Mapping[str, str]) -> Plan:
    """The plan as it reads with the renaming done: its values, steps, checks and fingerprints."""
    if not renames:
        return plan
    steps = substitute(plan.steps, renames)
    return dataclasses.replace(
        plan,
        values=substitute(plan.values, renames),
        sources=substitute(plan.sources, renames),
        secret_names=substitute(plan.secret_names, renames),
        steps=steps,
        checks=substitute(plan.checks, renames),
        fingerprints={s["name"]: fingerprint(s) for s in steps},
    )
