"""The diff's data: both sides, the changes found, the evidence review's findings."""

from __future__ import annotations

import os
from dataclasses import dataclass
from dataclasses import field as dc_field
from typing import Any, Mapping, Sequence

from engine.spec.load import Spec
from engine.spec.plan import Plan
from engine.spec.values import BUILTINS, PER_RUN_BUILTINS
from engine.types import CheckResult


class DiffError(Exception):
    """Bad usage, an unreadable revision, an invalid spec: the message says which (exit 2)."""


# Every run gets its own of these; both sides get the same placeholders so they never differ.
FIXED_BUILTINS: dict[str, str] = {name: f"<{name}>" for name in PER_RUN_BUILTINS}
BUILTIN_NAMES = BUILTINS
ABSENT = object()  # a key one side lacks (None is a legitimate value)
# Fields holding JMESPath: compared by syntax tree, and what a saved run is asked about.
EXPR_FIELDS = ("expr", "when")


@dataclass
class Side:
    """One side of the diff: the loaded spec (None when the file does not exist there) and its plans."""

    label: str
    spec: Spec | None
    plans: dict[str, Plan] = dc_field(default_factory=dict)  # mode -> its plan
    tmp: str | None = None  # where a git revision was written out (its paths are shown as `rev_prefix`)
    rev_prefix: str = ""  # `origin/main:`
    # The spec's data with this change's step renames applied (rename.py), and those renames.
    renamed: dict | None = None
    renames: dict[str, str] = dc_field(default_factory=dict)

    @property
    def data(self) -> dict:
        if self.renamed is not None:
            return self.renamed
        return self.spec.data if self.spec is not None else {}

    def shown(self, text: str) -> str:
        """Paths in `text` as a reader knows them: `REV:specs/x.yaml`, not a temporary directory."""
        if self.tmp is None:
            return text
        # load_spec shows paths relative to the cwd when below it, else absolute: undo every form.
        forms = {self.tmp, os.path.realpath(self.tmp), os.path.relpath(self.tmp)}
        for form in sorted(forms, key=len, reverse=True):
            text = text.replace(form + os.sep, self.rev_prefix)
        return text

    def place(self, path: tuple) -> str:
        """`file:line` of the node at `path` in this side's spec (or of its nearest written ancestor)."""
        if self.spec is None:
            return ""
        file, line, _ = self.spec.locate(path)
        return f"{self.shown(file)}:{line}"


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
    where: str = ""  # `file:line` it comes from (the old side's for a removed thing), spec or lib fragment


@dataclass
class Budget:
    old_budget: float | None
    old_worst: float
    new_budget: float | None
    new_worst: float


def env_text(env: Mapping[str, str]) -> str:
    """`target gpu`: the values an environment sets, by the values' names."""
    return ", ".join(f"{name} {case}" for name, case in sorted(env.items()))


def envs_text(envs: Sequence[Mapping[str, str]]) -> str:
    """`target gpu, real`: several environments that each set the same one value, said once."""
    names = {tuple(sorted(e)) for e in envs}
    if len(names) == 1 and len(next(iter(names))) == 1:
        (name,) = next(iter(names))
        return f"{name} {', '.join(dict.fromkeys(e[name] for e in envs))}"
    return "; ".join(dict.fromkeys(env_text(e) for e in envs))


@dataclass
class ModeDiff:
    mode: str
    status: str  # both | added | removed
    changes: list[Change] = dc_field(default_factory=list)
    budget: Budget | None = None  # when the worst case or the budget moved
    # check -> its strictness.Shift (what it asks of a run, old against new, from the spec's own values
    # in this mode): every check whose expr/when/let changed or that reads a value that changed. Typed
    # Any: strictness reads this module, not the other way round.
    shifts: dict[str, Any] = dc_field(default_factory=dict)
    # The values an environment variable sets for this diff ({"target": "gpu"}), by the values' names;
    # empty for the mode as planned with no environment. Such a diff holds only what differs from the
    # mode's own (a change seen under every target is the mode's).
    env: dict[str, str] = dc_field(default_factory=dict)

    @property
    def key(self) -> str:
        """`smoke`, or `smoke (target gpu)`: how this diff is keyed and headed."""
        return f"{self.mode} ({env_text(self.env)})" if self.env else self.mode


@dataclass
class CheckReview:
    name: str
    # added | changed (its expr/when/let/severity) | moved (unchanged, reads a value that changed) |
    # removed | disabled | affected (unchanged, but reads a leg that changed)
    status: str
    blockers: list[str] = dc_field(default_factory=list)  # why the saved run cannot answer
    old: CheckResult | None = None  # result of the old definition on the run (with the old values)
    new: CheckResult | None = None  # ... of the new one (with the new values)
    shift: Any = None  # its strictness.Shift: old -> new on the run (or from the spec's values)
    where: str = ""  # file:line of the check (the old side's when removed)
    why: str = ""  # a removed or disabled check's reason for being


@dataclass
class EvidenceReview:
    run_dir: str
    label: str  # "run <start, to the minute> (<mode>)"
    mode: str
    notes: list[str]
    checks: list[CheckReview]


@dataclass
class Report:
    old_label: str
    new_label: str
    name: str
    spec_changes: list[Change]
    common: list[Change]  # identical in every mode both sides have (shown once)
    common_modes: list[str]
    modes: list[ModeDiff]
    raw_modes: dict[str, list[Change]]  # per ModeDiff.key, before factoring (what evidence review reads)
    evidence: EvidenceReview | None = None
    status: str = "both"  # both | new (no such spec at the base) | deleted
    # Changes seen under every environment the spec names beyond the modes' own (every `target` but the
    # default), shown once, and the keys of the diffs they were factored out of.
    env_common: list[Change] = dc_field(default_factory=list)
    env_common_keys: list[str] = dc_field(default_factory=list)
    # ModeDiff.key -> (mode, the values its environment sets, old plan, new plan) of each mode both sides
    # have under each other target (variants.py), the old plan with this change's renames applied.
    env_plans: dict[str, tuple[str, dict[str, str], Any, Any]] = dc_field(default_factory=dict)
    # The old side as compared: with the step renames of this change applied (rename.py).
    old_side: Any = None
    default_env: dict[str, str] = dc_field(default_factory=dict)  # the spec's default target (`target local`)

    @property
    def changed(self) -> bool:
        return bool(
            self.spec_changes
            or self.common
            or self.env_common
            or any(m.changes or m.status != "both" for m in self.modes)
        )
