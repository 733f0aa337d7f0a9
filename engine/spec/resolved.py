"""A step after its `${x}` were substituted, checked against the spec's JSON Schema: every field must now have
its real type (`timeout_s` a number, not "abc"), which the schema could not ask of a template."""

from __future__ import annotations

import functools
import json
from typing import Any

import jsonschema

from engine.spec.load import Spec, best_error, validator
from engine.spec.located import SpecError

# The optional blocks a step may carry beside its kind (run / remove / collect); checked with it.
STEP_BLOCKS = ("reference", "snapshot")

_VALUE_REF = {"$ref": "#/$defs/value_ref"}


def _no_refs(schema: Any) -> Any:
    """The schema with every `anyOf: [X, value_ref]` reduced to X: after substitution a `${x}` is no longer allowed."""
    if isinstance(schema, list):
        return [_no_refs(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _no_refs(v) for k, v in schema.items()}
    if isinstance(out.get("anyOf"), list) and _VALUE_REF in schema["anyOf"]:
        rest = [s for s in out.pop("anyOf") if s != _VALUE_REF]
        if len(rest) == 1:
            out.update(rest[0])
        else:
            out["anyOf"] = rest
    return out


@functools.cache
def _resolved_step_validator() -> Any:
    defs = _no_refs(validator().schema["$defs"])
    # A fresh validator, not evolve(): evolve keeps the resolver of the original root schema.
    return jsonschema.Draft202012Validator({"$ref": "#/$defs/step", "$defs": defs})


def check_step(spec: Spec, index: int, step: dict[str, Any], mode: str, kind: str) -> list[SpecError]:
    """After substitution, fields must have their real types (e.g. timeout_s a number, not "abc")."""
    part = {k: v for k, v in step.items() if k in ("name", "when", "description", *STEP_BLOCKS, kind)}
    try:
        problems = _cached_step_problems(json.dumps(part))
    except TypeError:  # a value JSON cannot hold (a YAML date): checked as it is
        problems = _step_problems(part)
    return [
        spec.error(("steps", index) + path, f"in mode {mode!r} after substitution: {message}")
        for path, message in problems
    ]


def _step_problems(step: Any) -> tuple[tuple[tuple, str], ...]:
    """(path, message) of each schema problem of one resolved step."""
    return tuple(
        (tuple(e.absolute_path), e.message) for e in map(best_error, _resolved_step_validator().iter_errors(step))
    )


@functools.lru_cache(maxsize=4096)
def _cached_step_problems(step_json: str) -> tuple[tuple[tuple, str], ...]:
    # By the step's JSON: a diff or a review plans the same steps for both sides and every mode, and
    # the schema walk is most of what a plan costs.
    return _step_problems(json.loads(step_json))
