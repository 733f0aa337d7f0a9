"""probes.emit on its own: the lines it prints, the stop it decides, and what importing it costs."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import probes.emit
from probes.auto import _AfterImport
from probes.emit import STEP_MARKER, STOP_ENV, Emitter, ProbeConfigError, batch_digest, stop_at_step

ROOT = Path(__file__).resolve().parents[2]
ENGINE = [sys.executable, "-m", "engine.cli"]


def _reject_constant(name: str) -> None:
    raise ValueError(f"bare {name} is not JSON")


def strict_loads(text: str) -> dict:
    return json.loads(text, parse_constant=_reject_constant)


def emitter(stop_at: int | None = None, main: bool = True) -> tuple[Emitter, io.StringIO]:
    out = io.StringIO()
    return Emitter("loop", stop_at=stop_at, main=lambda: main, stream=out), out


def test_step_line_is_strict_json_with_a_nan_in_the_evidence_form() -> None:
    e, out = emitter()
    e.step(3, float("nan"), lr=float("inf"), epoch=0, samples=[4, 5])
    session, step = out.getvalue().splitlines()
    assert step.startswith(STEP_MARKER)
    doc = strict_loads(step[len(STEP_MARKER) :])
    assert doc == {
        "step": 3,
        "loss": {"$nonfinite": "NaN"},
        "lr": {"$nonfinite": "Infinity"},
        "epoch": 0,
        "samples": [4, 5],
    }
    assert strict_loads(session.split(" ", 1)[1])["start_step"] == 2


def test_stop_is_asked_at_the_stop_step_and_not_before() -> None:
    e, _ = emitter(stop_at=3)
    assert [e.step(s, 1.0) for s in (1, 2, 3)] == [False, False, True]
    assert e.stop_step == 3


def test_a_session_that_starts_past_the_stop_says_so_and_runs_on() -> None:
    e, out = emitter(stop_at=5)
    e.session(5)
    assert not e.step(6, 1.0)
    session = strict_loads(out.getvalue().splitlines()[0].split(" ", 1)[1])
    assert "will not stop there" in session["warning"]


def test_other_ranks_print_nothing_but_decide_the_same_stop() -> None:
    e, out = emitter(stop_at=2, main=False)
    assert [e.step(s, 1.0) for s in (1, 2)] == [False, True]
    assert out.getvalue() == ""


@pytest.mark.parametrize("raw", ["ten", "0", "-3", "2.5"])
def test_a_stop_step_that_is_not_a_positive_integer_is_refused(raw: str) -> None:
    with pytest.raises(ProbeConfigError, match=f"{STOP_ENV}='{raw}'"):
        stop_at_step({STOP_ENV: raw})
    assert stop_at_step({STOP_ENV: " 12 "}) == 12 and stop_at_step({}) is None


def test_plain_loop_helper_stops_and_names_the_checkpoint(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    monkeypatch.setenv(STOP_ENV, "2")
    monkeypatch.delenv("RANK", raising=False)
    probes.emit.new_session()
    assert probes.emit.step(1, 0.5, lr=0.1) is False
    assert probes.emit.step(2, 0.25, lr=0.1, batch={"x": [1, 2]}) is True
    probes.emit.stopped("ckpt/step-2")
    probes.emit.new_session()
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(" ", 1)[0] for line in lines] == [
        "SPECPROBE_SESSION",
        "SPECPROBE_STEP",
        "SPECPROBE_STEP",
        "SPECPROBE_STOP",
    ]
    assert strict_loads(lines[-1].split(" ", 1)[1]) == {"step": 2, "checkpoint": "ckpt/step-2", "saved": True}
    assert len(strict_loads(lines[2].split(" ", 1)[1])["batches"][0]) == 16


def test_stopped_before_a_stop_is_an_error() -> None:
    probes.emit.new_session()
    with pytest.raises(RuntimeError, match="before probes.emit.step"):
        probes.emit.stopped("x")


def test_batch_digest_follows_the_data_not_the_container() -> None:
    import torch

    a = {"input_ids": torch.arange(6).reshape(2, 3), "labels": torch.ones(2, dtype=torch.bfloat16)}
    same = {"labels": torch.ones(2, dtype=torch.bfloat16), "input_ids": torch.arange(6).reshape(2, 3)}
    other = {"input_ids": torch.arange(6).reshape(3, 2), "labels": torch.ones(2, dtype=torch.bfloat16)}
    assert batch_digest(a) == batch_digest(same)  # key order is not data
    assert batch_digest(a) != batch_digest(other)  # the shape is
    assert batch_digest(a["input_ids"][:, 1:]) == batch_digest(torch.tensor([[1, 2], [4, 5]]))  # a view's own values


def test_importing_the_emitter_and_the_one_line_needs_neither_library() -> None:
    code = (
        "import sys, probes.emit, probes.auto\n"
        "heavy = [m for m in ('torch', 'transformers', 'lightning', 'pytorch_lightning', 'numpy') if m in sys.modules]\n"
        "print(heavy)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"
    # and the process that trained nothing says that its one line reached no trainer
    assert "no transformers.Trainer or Lightning Trainer trained in this process" in r.stderr


def test_after_import_hook_runs_once_the_module_has_loaded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "probe_target_mod.py").write_text("CALLBACKS = ['default']\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen = []
    finder = _AfterImport("probe_target_mod", lambda m: (seen.append(list(m.CALLBACKS)), m.CALLBACKS.append("probe")))
    monkeypatch.setattr(sys, "meta_path", [finder, *sys.meta_path])
    import probe_target_mod  # noqa: F401  (the import under test)

    try:
        assert seen == [["default"]]  # after the module ran, not before
        assert sys.modules["probe_target_mod"].CALLBACKS == ["default", "probe"]
        assert finder not in sys.meta_path  # one module, once
        # tracebacks and inspect read a module's source through its loader: the wrapper passes that through
        assert sys.modules["probe_target_mod"].__loader__.get_source("probe_target_mod") == "CALLBACKS = ['default']\n"
    finally:
        sys.modules.pop("probe_target_mod", None)


SPEC = """\
version: 1
name: emitter_nan
description: a plain loop whose second loss is NaN
budget_s: 120
steps:
  - name: leg1
    run:
      argv: {argv}
      timeout_s: 60
      output:
        harvest:
          steps: {{marker: "SPECPROBE_STEP ", pick: all}}
checks:
  - name: the_nan_loss_is_not_finite
    why: a diverged step must read as non-finite, not as a missing or a numeric value
    expr: "is_finite(steps.leg1.harvest.steps[1].loss) == `false` && is_finite(steps.leg1.harvest.steps[0].loss)"
"""


def test_engine_harvests_a_nan_loss_as_not_finite_live_and_on_recheck(tmp_path: Path) -> None:
    code = "import probes.emit as p; p.step(1, 0.5); p.step(2, float('nan'))"
    (tmp_path / "s.yaml").write_text(SPEC.format(argv=json.dumps([sys.executable, "-c", code])))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = subprocess.run(
        [*ENGINE, "run", "s.yaml", "--run-dir", "r"], cwd=tmp_path, capture_output=True, text=True, timeout=120, env=env
    )
    assert run.returncode == 0, run.stdout + run.stderr
    check = subprocess.run(
        [*ENGINE, "check", "s.yaml", "--evidence", "r"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert check.returncode == 0, check.stdout + check.stderr
    stored = json.loads((tmp_path / "r" / "evidence.json").read_text())["steps"]["leg1"]["harvest"]["steps"]
    assert stored[1]["loss"] == {"$nonfinite": "NaN"} and stored[0]["loss"] == 0.5
