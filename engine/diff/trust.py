"""A saved run's account of itself, as the review takes it: never from the change under review.

A saved run says which legs it ran (its `fingerprints` and `definitions`) and with which spec files (their
sha256 under `spec.files`); `engine check` believes it, and so did the review. A change can edit those
fields: leg 2's `--resume must` made `auto`, and the run's fingerprints rewritten to match, re-check as a
run of the new legs. So a saved run that the change renewed is taken as:

- the base's own run when it is one (the same start, or the same steps): its document is the base's,
  whatever the change wrote over it, and a rewritten account is said;
- otherwise a new run, whose legs are recomputed from the spec its files are: this change's, or the base
  revision's (a run of the base's legs). A run of spec files that are neither cannot be placed: refused.
"""

from __future__ import annotations

from dataclasses import dataclass
from dataclasses import field as dc_field
from typing import Any, Mapping

from engine.diff.saved_run import replan_quietly
from engine.spec.plan import step_definition

# The parts of a document that describe the run rather than record it: what `engine check` compares.
ACCOUNT = ("fingerprints", "definitions", "output_rules", "spec")


@dataclass
class Trusted:
    doc: Mapping[str, Any] | None  # the document the review judges
    renewed: bool  # a new run (not the base's run with edits)
    rewritten: list[str] = dc_field(default_factory=list)  # what the change edited of the base's run
    refused: str = ""  # why the new run's legs cannot be recomputed


def _same_run(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """One run, however its account reads: the same start, or the same record of its steps."""
    started, steps = a.get("started_at"), a.get("steps")
    return bool(started and started == b.get("started_at")) or bool(steps and steps == b.get("steps"))


def _files(spec: Any) -> list[str]:
    return sorted(spec.files.values()) if spec is not None else []


def recomputed(doc: Mapping[str, Any], spec: Any) -> dict[str, Any] | None:
    """`doc` with its account of its legs recomputed from `spec` (planned as the run was: its mode and
    overrides); None when the spec cannot be planned so."""
    plan = replan_quietly(spec, doc)
    if plan is None:
        return None
    return {
        **doc,
        "fingerprints": dict(plan.fingerprints),
        "definitions": {s["name"]: step_definition(s) for s in plan.steps},
        "output_rules": {s["name"]: (s.get("run") or {}).get("output") for s in plan.steps if "run" in s},
    }


def trusted(
    now: Mapping[str, Any] | None,
    at_base: Mapping[str, Any] | None,
    renewed: bool,
    old_spec: Any,
    new_spec: Any,
    label: str,
) -> Trusted:
    """The saved run as the review judges it (see the module's docstring)."""
    if now is None or not renewed:
        return Trusted(now, renewed)
    named = (now.get("spec") or {}).get("name") if isinstance(now.get("spec"), Mapping) else None
    if new_spec is not None and named != new_spec.data.get("name"):
        return Trusted(now, renewed)  # another spec's run: `engine check` refuses it, which passes nothing
    if at_base is not None and _same_run(now, at_base):
        edited = [k for k in sorted(set(now) | set(at_base)) if now.get(k) != at_base.get(k)]
        return Trusted(at_base, False, edited)
    ran = sorted(((now.get("spec") or {}).get("files") or {}).values())
    for spec in (new_spec, old_spec):
        if ran and ran == _files(spec):
            doc = recomputed(now, spec)
            if doc is not None:
                return Trusted(doc, True)
    return Trusted(
        now,
        True,
        refused=f"{label} (renewed in this change) was made with spec files that are neither the base's nor "
        "this change's (their sha256 under `spec.files`): which legs it ran cannot be recomputed, and its "
        "own account of them is not taken",
    )
