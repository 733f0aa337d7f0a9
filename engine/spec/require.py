"""Requirements a spec states about itself (`require:`): JMESPath over the plan, before anything runs.

A check asks a question of the evidence a run leaves; a requirement asks one of the spec, over its
resolved `values`, its `mode` and its `steps` (in order, each as the plan resolved it: name, kind,
enabled, and its run/remove/collect). A library states there how the values a spec that extends it
writes must follow the steps it writes (the P4 library: every leg that a later leg resumes from is
listed in `stops`), so that a spec that forgets one is refused by `engine validate` and whenever it is
planned, instead of leaving that leg unchecked. The engine knows nothing of what the requirement
means: it evaluates it, and the refusal quotes the requirement's `why` with the values of its `let`s
(the leg that is missing) and where the values it reads are set.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from engine.expr.functions import OPTIONS
from engine.expr.trace import NOT_EVALUATED, check_document, trace
from engine.secrets import redact_text
from engine.spec.load import Spec
from engine.spec.located import SpecError, display_path
from engine.text import compact

# What a requirement's expression reads: the plan, not a run's evidence.
ROOTS = ("values", "mode", "steps")
# Sub-values of a requirement without `let`s that its refusal shows (the lets are all shown).
EXPLAIN_SHOWN = 6
# A value an expression reads (`values.stops[*].leg` reads stops), to say where the spec sets it.
_VALUE_READ = re.compile(r"(?<![\w.])values\.([A-Za-z_][A-Za-z0-9_]*)")


def document(values: Mapping[str, Any], steps: Sequence[Mapping[str, Any]], mode: str) -> dict[str, Any]:
    """What a requirement reads: {values, mode, steps: [each resolved step but its file and line]}."""
    shown = [{k: v for k, v in step.items() if k not in ("file", "line")} for step in steps]
    return check_document({"values": dict(values), "mode": mode, "steps": shown})


def unmet(
    spec: Spec,
    values: Mapping[str, Any],
    steps: Sequence[Mapping[str, Any]],
    mode: str,
    secret_names: Iterable[str] = (),
) -> list[tuple[int, str]]:
    """(index in `require`, what it found) of each requirement of `spec` that is not exactly true
    for this plan; what it found has every secret value redacted."""
    rules = spec.data.get("require") or []
    if not rules:
        return []
    doc = document(values, steps, mode)
    secrets = list(secret_names)
    out = []
    for i, rule in enumerate(rules):
        found = _evaluate(rule, doc)
        if found is not None:
            out.append((i, redact_text(found, values, secrets)))
    return out


def _evaluate(rule: Mapping[str, Any], doc: Mapping[str, Any]) -> str | None:
    """None when the requirement holds, else what it found, in words."""
    lets = rule.get("let") or None
    try:
        value, missing, pairs = trace(rule["expr"], doc, OPTIONS, lets=lets)
    except Exception as exc:  # a function given the wrong type: the spec's problem, said as one
        missing = getattr(exc, "missing", [])
        if missing:
            return f"it reads {', '.join(missing)}, which the plan does not have"
        return f"it cannot be evaluated: {type(exc).__name__}: {' '.join(str(exc).split())}"
    if missing:
        return f"it reads {', '.join(missing)}, which the plan does not have"
    if value is True:
        return None
    lets_read = {f"let.{name}" for name in lets or ()}
    named = [f"{text} = {shown}" for text, shown in pairs if text in lets_read and shown != NOT_EVALUATED]
    shown = named or [f"{text} = {shown}" for text, shown in pairs[:EXPLAIN_SHOWN]]
    got = "" if value is False else f"got {compact(value, 80)}, not true"
    return "; ".join(shown + ([got] if got else [])) or "false"


def value_places(spec: Spec, rule: Mapping[str, Any], mode: str | None = None) -> list[str]:
    """`values.stops (specs/x.yaml:24)` for each value the requirement reads, where the spec sets it
    (in `mode`'s own block when it sets it there): what to fix."""
    texts = [rule.get("expr"), *(rule.get("let") or {}).values()]
    names = [name for text in texts for name in _VALUE_READ.findall(str(text))]
    data, places = spec.data, []
    for name in dict.fromkeys(names):
        in_mode = mode is not None and name in ((data.get("modes") or {}).get(mode) or {})
        path = ("modes", mode, name) if in_mode else ("values", name)
        if in_mode or name in (data.get("values") or {}):
            file, line, _ = spec.locate(path)
            places.append(f"values.{name} ({file}:{line})")
    return places


def requirement_error(spec: Spec, index: int, found: str, modes: Sequence[str] = ()) -> SpecError:
    """The refusal of the `index`-th requirement: located at the requirement, naming the spec it was
    evaluated for, the modes (none: every mode), its why, what it found and where what it reads is set."""
    rule = spec.data["require"][index]
    where = f" in mode {', '.join(modes)}" if modes else ""
    places = value_places(spec, rule, modes[0] if len(modes) == 1 else None)
    reads = f" (it reads {', '.join(places)})" if places else ""
    return spec.error(
        ("require", index),
        f"{display_path(spec.path)} breaks requirement {rule.get('name')!r}{where}: {found}. "
        f"{' '.join(str(rule.get('why', '')).split())}{reads}",
    )
