"""A minimal stand-in for engine.spec.plan.Plan: the attributes the runner reads, built from dicts."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

LEG = str(Path(__file__).with_name("leg.py"))


@dataclass
class SpecStub:
    path: str = "specs/test.yaml"
    sha256: str = "0" * 64
    files: dict[str, str] = field(default_factory=dict)


@dataclass
class PlanStub:
    steps: list[dict[str, Any]]
    values: dict[str, Any] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)
    secret_names: list[str] = field(default_factory=list)
    fingerprints: dict[str, str] = field(default_factory=dict)
    name: str = "test_spec"
    mode: str = "smoke"
    spec: SpecStub = field(default_factory=SpecStub)

    def __post_init__(self) -> None:
        # plan.py names each step's kind once; the runner reads it and never works it out again.
        from engine.spec.plan import step_kind

        self.steps = [{**step, "kind": step_kind(step)} for step in self.steps]


def run_step(name: str, *actions: str, **run: Any) -> dict[str, Any]:
    """A resolved run step whose leg is leg.py with `actions`, defaults filled like plan.py does."""
    body = {"argv": [sys.executable, LEG, *actions], "grace_s": 30, "ok_exit_codes": [0]}
    body.update(run)
    return {"name": name, "kind": "run", "enabled": True, "file": "specs/test.yaml", "line": 1, "run": body}


def main() -> int:
    """`python plan_stub.py STEPS_JSON RUN_DIR`: execute a plan; 130 on Ctrl-C (like engine)."""
    from engine.run.runner import execute

    steps = json.loads(Path(sys.argv[1]).read_text())
    try:
        execute(PlanStub(steps=steps), sys.argv[2], is_tty=False)
    except KeyboardInterrupt:
        print("engine: interrupted", flush=True)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
