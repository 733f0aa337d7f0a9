"""A run dir that cannot take another byte (a full disk, a file-size limit) stops the run with a
clear ERROR verdict naming the file, and leaves the evidence written before it valid on disk.

The limit is real: the engine runs under RLIMIT_FSIZE (what every CI machine can do unprivileged;
a write past it fails with EFBIG, SIGXFSZ being ignored), and, where the machine lets a user mount a
small tmpfs in a namespace of its own, on a really full file system (ENOSPC)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from engine_helpers import file_size_limit, write_spec

ROOT = Path(__file__).resolve().parents[2]
LEG = str(Path(__file__).parents[1] / "legs" / "leg.py")
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}
KiB = 1024


def leg(name: str, *actions: str, marker_json: int = 0) -> dict:
    argv = [sys.executable, LEG, *actions]
    if marker_json:  # a RUN_JSON of about this many bytes: the evidence grows by it, the spec does not
        argv = [sys.executable, "-c", f"import json; print('RUN_JSON ' + json.dumps({{'pad': 'p' * {marker_json}}}))"]
    return {
        "name": name,
        "run": {
            "argv": argv,
            "timeout_s": 120,
            "grace_s": 5,
            "output": {"harvest": {"run_json": {"marker": "RUN_JSON "}}},
        },
    }


FULL = {
    "name": "full",
    "budget_s": 10_000,
    "checks": [{"name": "ran", "why": "the first leg ran", "expr": "steps.leg1.rc == `0`"}],
}


def stray_temp_files(run_dir: Path) -> list[str]:
    return [p.name for p in run_dir.rglob(".evidence.*")]


def test_a_log_that_cannot_grow_stops_the_run_with_an_error_verdict_naming_it(engine_process, tmp_path):
    # 20,000 lines of 100 bytes: the log hits the 1 MiB limit long before the leg ends.
    spec = write_spec(
        tmp_path / "s.yaml", [leg("leg1", "@repeat:20000:" + "y" * 100, "@forever"), leg("leg2", "never")], **FULL
    )
    proc = engine_process("run", str(spec), "--run-dir", "r", cwd=tmp_path, preexec=file_size_limit(1024 * KiB))
    log = tmp_path / "r" / "logs" / "leg1.log"
    assert "Traceback" not in proc.err and proc.code == 4, proc
    verdict_line = proc.out.strip().splitlines()[-1]
    assert verdict_line.startswith(f"VERDICT full ERROR could not write {log}: File too large (EFBIG)")
    assert "the run stopped at step leg1" in verdict_line
    doc = json.loads((tmp_path / "r" / "evidence.json").read_text())  # a small file: still writable
    assert doc["verdict"]["outcome"] == "ERROR" and doc["verdict"]["exit_code"] == 4
    assert doc["record_error"]["path"] == str(log) and doc["record_error"]["step"] == "leg1"
    leg1 = doc["steps"]["leg1"]
    # The leg was stopped, not left printing into the void until its timeout.
    assert leg1["status"] == "failed" and leg1["terminated_by"] == "record_error" and leg1["rc"] == -15
    assert "File too large" in leg1["error"]
    assert doc["steps"]["leg2"]["status"] == "not_run"
    assert {c["outcome"] for c in doc["checks"]} == {"SKIPPED"}
    assert log.stat().st_size <= 1024 * KiB and stray_temp_files(tmp_path / "r") == []


def test_evidence_that_cannot_grow_keeps_its_last_complete_version(engine_process, tmp_path):
    # Each leg adds a 20 KiB RUN_JSON to the evidence; it outgrows the 64 KiB limit at leg 3 or 4.
    spec = write_spec(tmp_path / "s.yaml", [leg(f"leg{i}", marker_json=20 * KiB) for i in range(1, 7)], **FULL)
    proc = engine_process("run", str(spec), "--run-dir", "r", cwd=tmp_path, preexec=file_size_limit(64 * KiB))
    target = tmp_path / "r" / "evidence.json"
    assert "Traceback" not in proc.err and proc.code == 4, proc
    verdict_line = proc.out.strip().splitlines()[-1]
    assert verdict_line.startswith(f"VERDICT full ERROR could not write {target}: File too large (EFBIG)")
    assert f"ERROR: the verdict could not be stored: could not write {target}" in proc.out
    doc = json.loads(target.read_text())  # the last version that fit, whole
    statuses = [doc["steps"][f"leg{i}"]["status"] for i in range(1, 7)]
    done = statuses.index("not_run")
    assert 2 <= done <= 4 and set(statuses[:done]) == {"ok"} and set(statuses[done:]) == {"not_run"}
    assert doc["steps"]["leg1"]["harvest"]["run_json"]["pad"] == "p" * 20 * KiB
    assert "verdict" not in doc and stray_temp_files(tmp_path / "r") == []


def _private_tmpfs_works() -> bool:
    unshare = shutil.which("unshare")
    if unshare is None or not sys.platform.startswith("linux"):
        return False
    probe = subprocess.run(
        [unshare, "--user", "--map-root-user", "--mount", "sh", "-c", "mount -t tmpfs -o size=64k tmpfs /mnt"],
        capture_output=True,
    )
    return probe.returncode == 0


@pytest.mark.skipif(not _private_tmpfs_works(), reason="no unprivileged tmpfs (user namespaces) on this machine")
def test_a_really_full_disk_takes_the_same_path(tmp_path):
    write_spec(tmp_path / "s.yaml", [leg("leg1", "@repeat:20000:" + "y" * 100, "@forever")], **FULL)
    disk, kept = tmp_path / "disk", tmp_path / "kept"
    disk.mkdir()
    # In a mount namespace of its own: a 256 KiB tmpfs as the run dir's disk, copied out afterwards.
    script = (
        'mount -t tmpfs -o size=256k tmpfs "$1" && cd "$2" && "$3" -m engine.cli run s.yaml --run-dir "$1/r" '
        '--markdown "$1/m.md"; '
        'rc=$?; cp -a "$1/r" "$4"; exit $rc'
    )
    proc = subprocess.run(
        [
            "unshare",
            "--user",
            "--map-root-user",
            "--mount",
            "sh",
            "-c",
            script,
            "sh",
            disk,
            tmp_path,
            sys.executable,
            kept,
        ],
        env=ENV,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.returncode == 4, proc.stdout + proc.stderr
    assert (
        proc.stdout.strip()
        .splitlines()[-1]
        .startswith(f"VERDICT full ERROR could not write {disk}/r/logs/leg1.log: No space left on device (ENOSPC)")
    )
    assert f"could not write the report {disk}/m.md" in proc.stderr  # said, and the exit code stays 4
    json.loads((kept / "evidence.json").read_text())  # whatever version it is, it is whole
    assert stray_temp_files(kept) == []
