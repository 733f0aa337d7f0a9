"""The shapes that flow between the layers (spec -> plan -> legs -> evidence -> verdict), as
TypedDicts: plain dicts at run time (they are stored as JSON as they are), named in signatures so
the contract is written where it is used rather than only in prose.
"""

from __future__ import annotations

from typing import Any, NotRequired, TypedDict


class RunBody(TypedDict, total=False):
    """A resolved step's `run:` section, every default filled in (engine/defaults.py)."""

    argv: list[str]
    timeout_s: float
    grace_s: float
    ok_exit_codes: list[int]
    env: dict[str, str]
    cwd: str | None
    precondition: str | None
    stop_on_failure: bool
    signals: list[dict[str, Any]]
    progress: dict[str, Any] | None
    on_failure: dict[str, Any] | None
    output: dict[str, Any]


class Step(TypedDict, total=False):
    """One resolved step of a plan: exactly one of `run`, `remove`, `collect`, named by `kind`."""

    name: str
    kind: str  # run | remove | collect
    description: str
    when: str | None
    enabled: bool
    file: str
    line: int
    run: RunBody
    remove: list[str]
    collect: dict[str, Any]


class Check(TypedDict):
    """One check of a plan, with where the spec writes it."""

    name: str
    why: str
    expr: str
    when: str | None
    severity: str  # gate | warn
    file: str | None
    line: int | None
    let: NotRequired[dict[str, str]]  # name -> JMESPath, read as let.<name>
    disabled: NotRequired[str]  # the reason, when the spec disables this (inherited) check
    disabled_at: NotRequired[str]  # file:line of that `disable:` entry


class CheckResult(TypedDict):
    """One check evaluated over the evidence (engine/judge/checks.py)."""

    name: str
    why: str
    expr: str
    severity: str
    file: str | None
    line: int | None
    outcome: str  # PASS | FAIL | NO_DATA | SKIPPED | ERROR | DISABLED
    value: Any
    missing: list[str]
    explain: list[list[str]]  # [sub-expression text, its value]; let.<name> values first
    reason: str  # for DISABLED: where and why it was disabled
    let: NotRequired[dict[str, str]]


class HarvestProblem(TypedDict):
    """Marker lines of a run step that did not parse, or disagree (engine/run/output.py)."""

    step: str
    harvest: str  # the harvest rule's name
    kind: str  # malformed | conflict
    lines: list[int]  # line numbers in the step's log
    fails: bool  # false where the rule opted in (on_malformed: skip, on_conflict: pick)
    message: str


class Verdict(TypedDict, total=False):
    """The run's verdict (engine/judge/verdict.py); `message` only for PRECONDITION, `harvest` only when
    a step had a harvest problem."""

    outcome: str  # PASS | FAIL | PRECONDITION | INTERRUPTED
    failed: list[str]
    warnings: list[str]
    disabled: list[str]  # checks the spec disables (never failures), only when there are some
    exit_code: int
    seconds: float
    message: str
    harvest: list[HarvestProblem]
    reused: list[dict[str, Any]]  # {step, from}: steps an earlier run ran (`engine run --from`), only then
