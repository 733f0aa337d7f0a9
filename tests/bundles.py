"""The saved runs of the P4 specs (`evidence/<spec stem>/`: the evidence.json and raw logs of a real `engine run`
on the embedded default) as tests use them: the specs' checks, private copies of a bundle, `engine check` on a
copy, and the evidence's parts.

Import as `from bundles import ...` (pytest puts tests/ on sys.path).
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any
from unittest import mock

from engine_helpers import Engine

from engine import cli
from engine.cli import main as engine_main
from engine.judge.verdict import Exit
from engine.spec.load import load_spec
from engine.spec.plan import build_plan

ROOT = Path(__file__).resolve().parents[1]
SPECS_DIR = ROOT / "specs"
EVIDENCE_DIR = ROOT / "evidence"
SPECS = ("p4_smoke", "p4_soak", "p4_preempt")


# ------------------------------------------------------------------ the spec side


@lru_cache(maxsize=None)
def spec_checks(stem: str) -> tuple[dict, ...]:
    """The spec's checks as the engine resolves them (environment ignored: default mode)."""
    plan = build_plan(load_spec(SPECS_DIR / f"{stem}.yaml"), environ={})
    return tuple(plan.checks)


def check_names(stem: str) -> list[str]:
    return [c["name"] for c in spec_checks(stem)]


def check_by_name(stem: str, name: str) -> dict:
    return next(c for c in spec_checks(stem) if c["name"] == name)


# ------------------------------------------------------------------ bundles and `engine check`


def copy_bundle(stem: str, dest: Path) -> Path:
    """A private copy of the saved bundle; the original is never written to."""
    target = dest / stem
    shutil.copytree(EVIDENCE_DIR / stem, target)
    return target


def read_evidence(bundle: Path) -> dict:
    # json.loads accepts NaN/Infinity, exactly as engine/run/evidence.py's load() does.
    return json.loads((bundle / "evidence.json").read_text(encoding="utf-8"))


def write_evidence(bundle: Path, doc: dict) -> None:
    # allow_nan (the default) writes a bare `NaN`, which the engine's loader reads back as a float.
    (bundle / "evidence.json").write_text(json.dumps(doc, indent=1), encoding="utf-8")


@dataclass
class Checked:
    rc: int
    record: dict
    out: str
    err: str

    @property
    def outcomes(self) -> dict[str, str]:
        return {r["name"]: r["outcome"] for r in self.record["checks"]}

    def result(self, name: str) -> dict:
        return next(r for r in self.record["checks"] if r["name"] == name)


_VALID_SPECS: dict[str, Any] = {}
_valid_spec = cli._valid_spec


def _valid_spec_once(path: str) -> Any:
    """`engine check`'s loading and validation of a shipped spec, done once per process: the hundreds of tampered
    bundles are each judged by the real command against the same unchanged file, whose validation is most of a
    check's cost."""
    if path not in _VALID_SPECS:
        _VALID_SPECS[path] = _valid_spec(path)
    return _VALID_SPECS[path]


def engine_check(engine: Engine, stem: str, bundle: Path) -> Checked:
    """`engine check specs/<stem>.yaml --evidence <bundle>` through the `engine` fixture; the check record."""
    before = set(bundle.glob("check-*.json"))
    with mock.patch.object(cli, "_valid_spec", _valid_spec_once):
        ran = engine("check", str(SPECS_DIR / f"{stem}.yaml"), "--evidence", str(bundle))
    new = sorted(set(bundle.glob("check-*.json")) - before)
    assert ran.code != Exit.USAGE, f"engine check refused the bundle (stale evidence?):\n{ran}"
    assert len(new) == 1, f"expected one new check-<stamp>.json in {bundle}, found {new}"
    record = json.loads(new[0].read_text(encoding="utf-8"))
    return Checked(ran.code, record, ran.out, ran.err)


class Baselines(dict):
    """Outcome of every check on each untampered bundle, computed once per spec on first use."""

    def __init__(self, base: Path) -> None:
        super().__init__()
        self.base = base

    def __missing__(self, stem: str) -> dict[str, str]:
        bundle = copy_bundle(stem, self.base)
        rc = engine_main(["check", str(SPECS_DIR / f"{stem}.yaml"), "--evidence", str(bundle)])
        records = list(bundle.glob("check-*.json"))
        assert rc != Exit.USAGE and records, f"{stem}: engine check refused the saved bundle"
        record = json.loads(records[0].read_text(encoding="utf-8"))
        assert rc == Exit.PASS, f"{stem}: the untampered bundle does not pass: {record['verdict']}"
        self[stem] = {r["name"]: r["outcome"] for r in record["checks"]}
        return self[stem]


# ------------------------------------------------------------------ evidence accessors


def run_json(doc: dict, leg: str) -> dict:
    return doc["steps"][leg]["harvest"]["run_json"]


def hub(doc: dict, name: str) -> dict:
    return doc["state"][name]


def val(doc: dict, name: str) -> Any:
    return doc["values"][name]


def first_resume(doc: dict) -> dict:
    """The run's first resume, {leg, stop, next}: leg 1's stop in a segment probe, its kill in p4_preempt."""
    return val(doc, "resumes")[0]
