"""bench/stage_walk.py, the trace of a run's data through the engine's stages, on its own small spec:
what it counts is what the engine does (the masking sits in the run's record, not in the runner), and
its readings nest as its docstring says, so the tables in docs/performance.md mean what they claim."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
PLAN = "plan through Runner.execute"


def _bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("stage_walk", ROOT / "bench" / "stage_walk.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def walks(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    bench = _bench()
    readings = {"default": {}, "strict": {"strict": True}, "own": {"own": True}}
    return {name: bench.walk(tmp_path_factory.mktemp(name), **flags) for name, flags in readings.items()}


def test_the_plan_is_masked_by_the_record_and_never_by_the_runner(walks: dict[str, Any]) -> None:
    default, own = walks["default"], walks["own"]
    masked = ("engine.run.record", "Record.mask", "engine.secrets", "Scrubber.scrub_obj")
    assert masked in default.carried[PLAN]
    assert {caller for caller, *_ in own.edges[PLAN]} <= {"engine.run.runner"}
    assert [edge for edge in own.edges[PLAN] if edge[2] in ("engine.secrets", "engine.secret_forms")] == []


def test_the_readings_nest_inside_the_default_count(walks: dict[str, Any]) -> None:
    default, strict, own = walks["default"], walks["strict"], walks["own"]
    for label in default.edges:
        assert set(default.carried[label]) <= set(default.edges[label]), label
        assert set(strict.carried[label]) <= set(default.carried[label]), label
        assert set(own.edges[label]) <= set(default.edges[label]), label
    # What a call built from the plan (the record, its scrubber) is the plan only to the default reading.
    assert len(strict.carried[PLAN]) < len(default.carried[PLAN])
