"""`load_spec` + `validate` messages for a representative set of broken specs, against golden files.

Regenerate after an intended message change with SPECPROBE_UPDATE_GOLDEN=1 and review the diff.
"""

import os
from pathlib import Path

import pytest

from engine.spec.load import load_spec
from engine.spec.located import SpecErrors
from engine.spec.validate import validate

ROOT = Path(__file__).resolve().parents[2]
SPECS = sorted((ROOT / "tests" / "specs" / "validate").glob("*.yaml"))
GOLDEN = ROOT / "tests" / "golden" / "validate"


def messages(path: Path) -> str:
    try:
        errors = validate(load_spec(path.relative_to(ROOT)), environ={})
    except SpecErrors as e:
        errors = e.errors
    return "".join(f"{e}\n" for e in errors)


@pytest.mark.parametrize("spec", SPECS, ids=[p.stem for p in SPECS])
def test_validate_messages_match_golden(spec, monkeypatch):
    monkeypatch.chdir(ROOT)  # messages name files relative to the cwd
    got = messages(spec)
    golden = GOLDEN / f"{spec.stem}.txt"
    if os.environ.get("SPECPROBE_UPDATE_GOLDEN"):
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_text(got)
    assert got == golden.read_text()


def test_every_golden_file_has_a_spec():
    assert sorted(p.stem for p in GOLDEN.glob("*.txt")) == [p.stem for p in SPECS]


def test_every_message_is_located():
    for spec in SPECS:
        for line in (GOLDEN / f"{spec.stem}.txt").read_text().splitlines():
            file, lineno, col, rest = line.split(":", 3)
            assert file.startswith("tests/specs/validate/") and int(lineno) >= 1 and int(col) >= 1, line
            assert rest.startswith(" $"), line
