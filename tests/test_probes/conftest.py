"""The probe drivers' runs, made once per test session and shared by the tests that read them (probe_helpers.py
says how a session runs). Each set is built by the first xdist worker that asks, under a file lock, and read by the
others from its pickle (trainer_helpers.shared): a worker that only compares checkpoints imports no trainer."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from probe_helpers import Run, dcp_session, in_process, split_run, whole_run
from spec_runs import SpecRun, run_spec, work_dir
from trainer_helpers import shared


def _probe(request: pytest.FixtureRequest) -> str:
    """The probe whose spec a test_spec_* module runs: its mark, `pytest.mark.probe_spec("<probe>")`."""
    return request.node.get_closest_marker("probe_spec").args[0]


@pytest.fixture(scope="module")
def cwd(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The working directory of the spec runs of a test_spec_* module's probe, shared by the session."""
    return work_dir(tmp_path_factory, _probe(request))


@pytest.fixture
def spec_run(request: pytest.FixtureRequest, cwd: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[..., SpecRun]:
    """`engine run` of the module's probe spec: spec_run(MODE, expect=EXIT CODE), from the probe's working
    directory (spec_runs.run_spec); its exit code asserted, the whole run shown when it differs."""
    probe = _probe(request)

    def run(mode: str, *, expect: int) -> SpecRun:
        ran = run_spec(probe, mode, cwd, monkeypatch)
        assert ran.code == expect, ran
        return ran

    return run


# ---- the shared runs -------------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def hf_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Run]:
    return shared("probes-hf", tmp_path_factory, _hf_runs)


def _hf_runs(d: Path) -> dict[str, Run]:
    from probes.drivers.hf_trainer import main

    return {
        "reference": whole_run(main, d / "reference"),
        "default": split_run(main, d / "default", 10),
        "broken_max_steps_stop": split_run(main, d / "max_steps", 10, ["--mode", "broken_max_steps_stop"]),
        "broken_no_optimizer_state": split_run(main, d / "no_opt", 10, ["--mode", "broken_no_optimizer_state"]),
        # a stop at a step the save schedule never saves at: only the callback can make that checkpoint
        "off_schedule": Run(d / "off", [in_process(main, ["--output-dir", str(d / "off"), "--save-steps", "50"], 7)]),
    }


@pytest.fixture(scope="session")
def lightning_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Run]:
    return shared("probes-lightning", tmp_path_factory, _lightning_runs)


def _seeded_and_unseeded(main: Callable, d: Path, stop: int, unseeded: str) -> dict[str, Run]:
    """The runs of a loop whose shuffle is seeded by default and not in mode `unseeded`: its reference twice (is it
    deterministic?), split at `stop`, and the unseeded mode's own reference and split at `stop`."""
    mode = ["--mode", unseeded]
    return {
        "reference": whole_run(main, d / "reference"),
        "reference_again": whole_run(main, d / "reference_again"),
        "default": split_run(main, d / "default", stop),
        "unseeded_reference": whole_run(main, d / "unseeded_reference", mode),
        unseeded: split_run(main, d / "unseeded", stop, mode),
    }


def _lightning_runs(d: Path) -> dict[str, Run]:
    from probes.drivers.lightning_loop import main

    return {
        **_seeded_and_unseeded(main, d, 8, "broken_unseeded_epoch"),
        "mid_epoch": split_run(main, d / "mid_epoch", 12),
    }


@pytest.fixture(scope="session")
def accelerate_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Run]:
    return shared("probes-accelerate", tmp_path_factory, _accelerate_runs)


def _accelerate_runs(d: Path) -> dict[str, Run]:
    from probes.drivers.accelerate_loop import main

    return {
        **_seeded_and_unseeded(main, d, 10, "broken_unseeded_sampler"),
        "broken_checkpoint_naming": split_run(main, d / "naming", 10, ["--mode", "broken_checkpoint_naming"]),
    }


@pytest.fixture(scope="session")
def dcp_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Run]:
    return shared("probes-dcp", tmp_path_factory, _dcp_runs)


def _dcp_runs(d: Path) -> dict[str, Run]:

    def argv(name: str, *extra: str) -> list[str]:
        return ["--output-dir", str(d / name), *extra]

    hold = ["--hold-in-save", "10", "--hold-s", "60"]
    kill = "DCP_SAVE_FINISH step=10"
    broken = ["--mode", "broken_pointer_before_save"]

    def killed_then_resumed(name: str, *mode: str) -> Run:
        run = Run(d / name, [dcp_session(argv(name, *mode, *hold), kill_on=kill)])
        ckpt = run.out / "ckpt"
        run.after_first = {
            "latest": (ckpt / "latest").read_text().strip(),
            "step-10 complete": (ckpt / "step-10" / ".metadata").exists(),
        }
        run.sessions.append(dcp_session(argv(name, *mode, "--resume")))
        return run

    return {
        "reference": Run(d / "reference", [dcp_session(argv("reference"))]),
        "default": Run(
            d / "default", [dcp_session(argv("default"), stop=10), dcp_session(argv("default", "--resume"))]
        ),
        "killed_in_save": killed_then_resumed("killed"),
        "broken_pointer_before_save": killed_then_resumed("broken", *broken),
    }
