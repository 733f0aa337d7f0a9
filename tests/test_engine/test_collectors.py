"""engine/run/collectors.py: built-in collectors and entry-point discovery."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from engine.judge.verdict import Exit
from engine.run.collectors import CollectorError, collect, known_collectors

ROOT = Path(__file__).resolve().parents[2]
LEG = str(Path(__file__).parents[1] / "legs" / "leg.py")


def test_json_file_reads_relative_to_cwd(tmp_path: Path) -> None:
    (tmp_path / "state.json").write_text(json.dumps({"step": 10, "files": ["a"]}))
    assert collect("json_file", {"path": "state.json"}, {"cwd": str(tmp_path)}) == {"step": 10, "files": ["a"]}


def test_json_file_missing_names_the_file(tmp_path: Path) -> None:
    with pytest.raises(CollectorError, match=r"json_file: .*nope\.json: no such file"):
        collect("json_file", {"path": str(tmp_path / "nope.json")}, {})


def test_json_file_invalid_names_line_and_column(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{\n  "a": 1,\n  "b": }\n')
    with pytest.raises(CollectorError, match=r"bad\.json:3:8: invalid JSON"):
        collect("json_file", {"path": str(bad)}, {})


def test_command_parses_the_last_non_empty_line() -> None:
    args = {"argv": [sys.executable, LEG, "listing repo...", '{"checkpoints": [10, 20]}', ""]}
    assert collect("command", args, {}) == {"checkpoints": [10, 20]}


def test_command_parses_whole_pretty_printed_output() -> None:
    code = "import json; print(json.dumps({'a': [1, 2]}, indent=2))"
    assert collect("command", {"argv": [sys.executable, "-c", code]}, {}) == {"a": [1, 2]}


def test_command_failure_names_the_command_and_rc() -> None:
    with pytest.raises(CollectorError, match=r"exited with rc 4; last line: 'no repo'"):
        collect("command", {"argv": [sys.executable, LEG, "no repo", "@rc:4"]}, {})


def test_command_timeout_is_an_error() -> None:
    with pytest.raises(CollectorError, match="timed out after 0.5 s"):
        collect("command", {"argv": [sys.executable, LEG, "@forever"], "timeout_s": 0.5, "grace_s": 0.5}, {})


def test_command_env_and_non_json_output() -> None:
    args = {"argv": [sys.executable, LEG, "@env:SPECPROBE_X"], "env": {"SPECPROBE_X": "42"}}
    with pytest.raises(CollectorError, match="SPECPROBE_X=42"):
        collect("command", args, {})


def test_unknown_collector_lists_the_known_ones() -> None:
    with pytest.raises(
        CollectorError,
        match=r"unknown collector 'nope'; known: .*command.*"
        r"json_file",
    ):
        collect("nope", {}, {})


def test_known_collectors_include_builtins_and_entry_points() -> None:
    names = known_collectors()
    assert {"json_file", "command"} <= set(names)
    # pyproject.toml registers the trainer's `hub` collector in the specprobe.collectors group.
    assert "hub" in names
    assert names == sorted(names)


# ---------------------------------------------------------------- a plugin that never returns

BLOCKING_PLUGIN = """
def collect(args, context):
    with open(args["fifo"], "rb") as f:  # a FIFO nobody writes: the open blocks until a writer comes
        return {"read": f.read().decode()}
"""

SPEC_WITH_PLUGIN = """\
version: 1
name: bounded
budget_s: 200
steps:
  - name: leg1
    run: {{argv: {argv}, timeout_s: 30, grace_s: 5}}
  - name: state
    collect: {{collector: blocking, args: {{fifo: {fifo}}}, timeout_s: 2}}
checks:
  - name: leg1_ran
    why: the leg before the collector ran
    expr: "steps.leg1.rc == `0`"
"""


def installed_plugin(site: Path) -> Path:
    """A plugin installed for real into `site`: its module and a dist-info whose entry_points.txt registers it
    in the specprobe.collectors group (what importlib.metadata reads from every folder on the path)."""
    info = site / "blocking_collector-1.0.dist-info"
    info.mkdir(parents=True)
    (site / "blocking_collector.py").write_text(BLOCKING_PLUGIN)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: blocking-collector\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[specprobe.collectors]\nblocking = blocking_collector:collect\n")
    return site


def test_a_plugin_collector_that_blocks_fails_its_step_at_its_timeout_and_the_verdict_is_written(
    tmp_path: Path,
) -> None:
    site = installed_plugin(tmp_path / "site")
    fifo = tmp_path / "state.fifo"
    os.mkfifo(fifo)
    spec = tmp_path / "s.yaml"
    spec.write_text(SPEC_WITH_PLUGIN.format(argv=json.dumps([sys.executable, LEG, "ran"]), fifo=json.dumps(str(fifo))))
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{site}"}
    t0 = time.monotonic()
    # Without a bound the engine waits on the FIFO forever: the timeout here is what would fail the test.
    r = subprocess.run(
        [sys.executable, "-m", "engine.cli", "run", str(spec), "--run-dir", "r"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    took = time.monotonic() - t0
    assert r.returncode == Exit.FAILED, r.stdout + r.stderr
    assert r.stdout.splitlines()[-1].startswith('VERDICT bounded FAIL ["step:state"]'), r.stdout
    doc = json.loads((tmp_path / "r" / "evidence.json").read_text())
    assert doc["steps"]["state"]["status"] == "failed"
    assert doc["steps"]["state"]["error"].startswith(
        "collector 'blocking' did not finish within 2 s (its step's collect.timeout_s, default 600 s)"
    )
    assert took < 60, f"the run took {took:.0f} s"


def test_a_plugin_collector_returns_its_document_or_its_error_through_the_bound(tmp_path: Path) -> None:
    site = installed_plugin(tmp_path / "site")
    fifo = tmp_path / "answered.fifo"
    os.mkfifo(fifo)
    sys.path.insert(0, str(site))
    writer = subprocess.Popen([sys.executable, "-c", f"open({str(fifo)!r}, 'w').write('hello')"])
    try:
        assert collect("blocking", {"fifo": str(fifo)}, {}, timeout_s=60) == {"read": "hello"}
        with pytest.raises(CollectorError, match=r"^collector 'blocking' failed: FileNotFoundError: .*absent\.fifo"):
            collect("blocking", {"fifo": str(tmp_path / "absent.fifo")}, {}, timeout_s=60)
    finally:
        writer.kill()  # a writer nobody read from would wait on the FIFO forever
        writer.wait(timeout=30)
        sys.path.remove(str(site))
        sys.modules.pop("blocking_collector", None)
