"""The declared floors are the tested ones: constraints/floors.txt, which .ci/floors installs, pins exactly the
lowest version that pyproject.toml allows for each dependency of the core and of the `trainer` and `hf` extras,
and .ci/floors runs test rooms that exist."""

from __future__ import annotations

import re
import shlex
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FLOORED_EXTRAS = ("trainer", "hf")  # `dev` is the test tools, not something a user installs against


def _name(raw: str) -> str:
    return re.sub(r"[-_.]+", "-", raw).lower()  # PEP 503: huggingface_hub and huggingface-hub are one project


def _release(version: str) -> tuple[int, ...]:
    parts = [int(p) for p in version.split(".")]
    while parts and parts[-1] == 0:  # 2.8 and 2.8.0 are one release
        parts.pop()
    return tuple(parts)


def declared_floors() -> dict[str, str | None]:
    """Each floored dependency of pyproject.toml and its `>=` bound (None where it declares none)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = project["dependencies"] + [r for extra in FLOORED_EXTRAS for r in project["optional-dependencies"][extra]]
    floors: dict[str, str | None] = {}
    for req in reqs:
        name, specs = re.fullmatch(r"([A-Za-z0-9_.-]+)\s*(.*)", req).groups()
        lows = [s.strip()[2:].strip() for s in specs.split(",") if s.strip().startswith(">=")]
        floors[_name(name)] = lows[0] if lows else None
    return floors


def pinned_floors() -> dict[str, str]:
    text = (ROOT / "constraints" / "floors.txt").read_text()
    return {_name(n): v for n, v in re.findall(r"^([A-Za-z0-9_.-]+)==(\S+)", text, re.M)}


def test_floors_pin_exactly_the_lowest_version_each_declared_dependency_allows():
    declared, pinned = declared_floors(), pinned_floors()
    assert [n for n, low in declared.items() if low is None] == []  # a dependency without a floor is untested
    assert sorted(pinned) == sorted(declared)
    assert {n: pinned[n] for n in declared if _release(pinned[n]) != _release(declared[n])} == {}


def test_the_floors_script_runs_test_rooms_that_exist():
    script = (ROOT / ".ci" / "floors").read_text().splitlines()
    pytest_line = next(line for line in script if line.startswith("pytest "))
    rooms = [a for a in shlex.split(pytest_line) if a.startswith("tests/")]
    assert rooms == ["tests/test_trainer", "tests/test_hub", "tests/test_engine"]
    assert [r for r in rooms if not (ROOT / r).is_dir()] == []
