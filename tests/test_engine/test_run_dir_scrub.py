"""The run dir's files after a hostile leg: what the scrubber leaves (no secret in any form, in any
name), what it never makes (a setuid file of the engine's), what it cannot check (an ERROR naming the
files, never a PASS), and what it costs (a sparse 16 GB file: its data only, once).

The engine runs as root here and in CI: a leg drops to `nobody` with setpriv, and the engine itself
runs as `nobody` where a Python that `nobody` can run is at hand. Real engines, real files."""

from __future__ import annotations

import base64
import json
import os
import pwd
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator

import pytest
from engine_helpers import ROOT, python_leg, write_spec
from legs.plan_stub import PlanStub

from engine import limits
from engine import secrets as secrets_module
from engine.run.record import Record
from engine.secrets import REDACTED, Scrubber, TreeScrubber

TOKEN = "hf_RUNDIR_scrub_TOKEN_7d3a9c1e5b"
IS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0
SETPRIV = shutil.which("setpriv")


def nobody() -> tuple[int, int]:
    entry = pwd.getpwnam("nobody")
    return entry.pw_uid, entry.pw_gid


def as_nobody() -> list[str]:
    uid, gid = nobody()
    return [str(SETPRIV), f"--reuid={uid}", f"--regid={gid}", "--clear-groups"]


def scrub_spec(path: Path, steps: list[dict], **values: object) -> Path:
    """A spec that hands the legs TOKEN as `api_token`, readable by `nobody`."""
    write_spec(path, steps, name="scrubbed", budget_s=10_000, values={"api_token": TOKEN, **values})
    path.chmod(0o644)
    return path


def nobody_leg(code: str) -> dict:
    """A step running `python -c CODE` as `nobody`."""
    return {"name": "leg", "run": {"argv": [*as_nobody(), "${python}", "-c", code], "timeout_s": 60}}


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A folder `nobody` can use (pytest's tmp_path is root's alone)."""
    path = Path(tempfile.mkdtemp(prefix="specprobe-scrub-"))
    path.chmod(0o777)
    try:
        yield path
    finally:
        subprocess.run(["chmod", "-R", "u+rwx", str(path)], check=False)
        shutil.rmtree(path, ignore_errors=True)


def nobody_python() -> tuple[str, dict[str, str]] | None:
    """A Python `nobody` can run the engine with (this one, or the system's with this one's
    packages on its path), and its environment; None when there is none."""
    import site

    path = os.pathsep.join([str(ROOT), *site.getsitepackages()])
    for python in (sys.executable, "/usr/bin/python3"):
        probe = subprocess.run(
            # It must also start itself again: the engine starts its reaper and each leg's supervisor so.
            [
                *as_nobody(),
                python,
                "-c",
                "import subprocess, sys; subprocess.run([sys.executable, '-c', "
                "'import engine.cli, psutil, jmespath, yaml, jsonschema'], check=True)",
            ],
            env={**os.environ, "PYTHONPATH": path, "HOME": "/tmp"},
            capture_output=True,
            cwd="/",
        )
        if probe.returncode == 0:
            return python, {"PYTHONPATH": path, "HOME": "/tmp"}
    return None


needs_root = pytest.mark.skipif(not (IS_ROOT and SETPRIV), reason="needs root and setpriv")


# ---------------------------------------------------------------- who owns a masked copy


@needs_root
def test_a_setuid_file_a_leg_planted_as_nobody_stays_nobodys_when_masked(engine, shared_dir: Path) -> None:
    plant = "import os; p='${run_dir}/planted'; open(p, 'w').write('token=${api_token}'); os.chmod(p, 0o4755)"
    spec = scrub_spec(shared_dir / "s.yaml", [nobody_leg(plant)])
    (shared_dir / "r").mkdir(mode=0o777)
    (shared_dir / "r").chmod(0o777)
    engine("run", str(spec), "--run-dir", "r", "--force", cwd=shared_dir, expect=0)
    planted = shared_dir / "r" / "planted"
    st = planted.stat()
    assert planted.read_text() == "token=" + (REDACTED + "*" * 40)[: len(TOKEN)]
    # The copy is the original's owner's, with the bits that owner gave it: never root's with setuid.
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (*nobody(), 0o4755)


@needs_root
def test_a_masked_copy_the_engine_cannot_give_the_original_owner_keeps_no_setuid_or_setgid(shared_dir: Path) -> None:
    victim = shared_dir / "tool"
    victim.write_text(f"#!/bin/sh\necho {TOKEN}\n")
    victim.chmod(0o6755)  # root's, setuid and setgid, in a folder nobody may write
    code = f"from engine.secrets import TreeScrubber; print(TreeScrubber({str(shared_dir)!r}, [{TOKEN!r}]).scrub())"
    found = nobody_python()
    if found is None:
        pytest.skip("no Python that nobody can run the engine with")
    python, env = found
    proc = subprocess.run([*as_nobody(), python, "-c", code], env={**os.environ, **env}, capture_output=True, text=True)
    assert proc.stdout.strip() == "['tool']", proc.stdout + proc.stderr
    st = victim.stat()
    assert st.st_uid == nobody()[0] and TOKEN not in victim.read_text()
    assert stat.S_IMODE(st.st_mode) == 0o755  # nobody's copy of root's setuid file is no setuid file


# ---------------------------------------------------------------- what the engine cannot read


@needs_root
def test_files_the_engine_cannot_check_make_the_verdict_an_error_naming_them(
    engine, engine_process, shared_dir: Path
) -> None:
    found = nobody_python()
    if found is None:
        pytest.skip("no Python that nobody can run the engine with")
    python, env = found
    hide = (
        "import os; d='${run_dir}'; open(d + '/locked', 'w').write('${api_token}'); os.chmod(d + '/locked', 0);"
        "os.mkdir(d + '/ro'); open(d + '/ro/f', 'w').write('${api_token}'); os.chmod(d + '/ro', 0o555)"
    )
    spec = scrub_spec(shared_dir / "s.yaml", [python_leg(hide)])
    as_nobody_engine = (*as_nobody(), python, "-m", "engine.cli")
    proc = engine_process("run", str(spec), "--run-dir", "r", cwd=shared_dir, command=as_nobody_engine, env=env)
    assert proc.code == 4, proc
    verdict = proc.out.strip().splitlines()[-1]
    assert verdict.startswith("VERDICT scrubbed ERROR the run dir holds 2 files the engine could not check for secrets")
    assert "locked: Permission denied" in verdict
    assert "ro/f: it holds a secret, and its masked copy could not be written: Permission denied" in verdict
    doc = json.loads((shared_dir / "r" / "evidence.json").read_text())
    assert doc["verdict"]["outcome"] == "ERROR" and len(doc["unscrubbed"]) == 2
    assert TOKEN not in proc.out + proc.err
    # A re-check of the saved run says the same: the files may still hold the secret.
    check = engine("check", str(spec), "--evidence", "r", cwd=shared_dir, expect=4)
    assert "could not check for secrets" in check.out, check


def test_a_pass_that_runs_out_of_the_steps_time_names_what_it_did_not_check(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(limits, "SCRUB_MIN_S", 0.0)
    record = Record.open(tmp_path, PlanStub(steps=[], values={"api_token": TOKEN}), {}, print)
    (tmp_path / "checkpoint.bin").write_bytes(os.urandom(1 << 20) + TOKEN.encode())
    step = {"name": "leg", "run": {"timeout_s": 5, "grace_s": 1}}
    kept: dict = {}
    record.after_step(step, kept, started=time.monotonic() - 60)  # the leg used its 5 s long ago
    doc: dict = {}
    assert record.unchecked == ["checkpoint.bin: not checked: the pass over the run dir ran out of its time"]
    assert "scrub_s" in kept
    monkeypatch.setattr(limits, "SCRUB_MIN_S", 120.0)
    record.finish(doc)  # the end of the run has its own time: it is checked, and masked, then
    assert "unscrubbed" not in doc and TOKEN.encode() not in (tmp_path / "checkpoint.bin").read_bytes()


# ---------------------------------------------------------------- what a pass costs


def test_a_sparse_16_gb_file_costs_its_data_and_is_read_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    big = tmp_path / "big"
    with open(big, "wb") as fh:
        fh.truncate(16 << 30)
        fh.seek(8 << 30)
        fh.write(TOKEN.encode())
    if big.stat().st_blocks * 512 > 1 << 20:
        pytest.skip("this file system keeps no holes")
    scrubber = TreeScrubber(tmp_path, [TOKEN])
    assert scrubber.scrub() == ["big"] and scrubber.problems == {}
    assert scrubber.bytes_read < 1 << 20  # the data around the secret, not 16 GB of zeros
    assert big.stat().st_size == 16 << 30 and big.stat().st_blocks * 512 < 1 << 20  # the copy keeps the holes
    with open(big, "rb") as fh:
        fh.seek(8 << 30)
        assert fh.read(len(TOKEN)) == (REDACTED + "*" * 40)[: len(TOKEN)].encode()
    # Found clean once its times have settled, it is not read again while its inode, size and times hold.
    monkeypatch.setattr(secrets_module, "RACY_NS", -(10**15))
    scrubber.scrub()
    assert scrubber.scrub() == [] and scrubber.files_read == 0 and scrubber.bytes_read == 0


def test_a_file_changed_just_before_a_pass_is_hashed_again_and_a_rewrite_is_searched(tmp_path: Path) -> None:
    log = tmp_path / "rank0.log"
    log.write_text("x" * len(TOKEN) + "\n")
    scrubber = TreeScrubber(tmp_path, [TOKEN])
    assert scrubber.scrub() == []
    # It changed less than 2 s before it was looked at: on a file system whose clock ticks coarsely a
    # write in the same tick leaves its times as they were, so its times are not trusted yet.
    assert scrubber.scrub() == [] and scrubber.files_read == 1
    before = log.stat()
    log.write_text(TOKEN + "\n")  # the same size, and its mtime put back
    os.utime(log, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert scrubber.scrub() == ["rank0.log"] and TOKEN not in log.read_text()


def test_a_long_pass_is_said_on_the_console_and_every_step_records_its_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(limits, "SCRUB_SAY_S", 0.0)
    said: list[str] = []
    record = Record.open(tmp_path, PlanStub(steps=[], values={"api_token": TOKEN}), {}, said.append)
    (tmp_path / "data.bin").write_bytes(os.urandom(3 << 20))
    kept: dict = {}
    record.after_step({"name": "leg", "run": {"timeout_s": 60}}, kept, time.monotonic())
    assert isinstance(kept["scrub_s"], float)
    assert any(line.startswith("   checked the run dir for secrets in ") and "3.1 MB" in line for line in said), said


# ---------------------------------------------------------------- forms and names


def _base64_part(prefix: bytes, data: bytes, encode=base64.b64encode) -> tuple[bytes, bytes]:
    """base64 of prefix + data + more, and its characters that only `data`'s bits make."""
    encoded = encode(prefix + data + b"tail")
    return encoded, encoded[-(-8 * len(prefix) // 6) : 8 * (len(prefix) + len(data)) // 6]


def wide_texts(secret: str) -> dict[str, tuple[bytes, bytes]]:
    """Name -> (a text holding `secret` encoded, the part of it only the secret's bytes make)."""
    data = secret.encode()
    texts = {f"base64 after {n} bytes": _base64_part(b"x" * n, data) for n in range(3)}
    texts["url-safe base64"] = _base64_part(b"\xfb\xff", data, base64.urlsafe_b64encode)
    encoded, part = _base64_part(b"bob:", data)
    texts["a basic auth header"] = (b"Authorization: Basic " + encoded, part)
    for name, whole in {
        "hex": data.hex().encode(),
        "HEX": data.hex().upper().encode(),
        "every byte %XX": "".join(f"%{b:02X}" for b in data).encode(),
        "every byte %xx": "".join(f"%{b:02x}" for b in data).encode(),
        "UTF-16-LE": secret.encode("utf-16-le"),
        "UTF-16-BE": secret.encode("utf-16-be"),
    }.items():
        texts[name] = (whole, whole)
    return texts


def pieces_left(text: bytes, part: bytes, n: int = 11) -> list[bytes]:
    """The pieces of `n` bytes of `part` (an encoding of the secret) still in `text`."""
    return [part[i : i + n] for i in range(len(part) - n + 1) if part[i : i + n] in text]


def test_every_encoding_of_a_secret_is_masked_in_a_leg_s_output() -> None:
    scrubber = Scrubber([TOKEN])
    for name, (text, part) in wide_texts(TOKEN).items():
        masked = scrubber.scrub(text.decode("latin-1")).encode("latin-1")
        assert REDACTED.encode() in masked and pieces_left(masked, part) == [], name


def test_every_encoding_of_a_secret_is_masked_in_the_files_legs_wrote(tmp_path: Path) -> None:
    texts = wide_texts(TOKEN)
    blob = b"\x00\x01header".join(text for text, _ in texts.values())
    (tmp_path / "dump.bin").write_bytes(blob)
    assert TreeScrubber(tmp_path, [TOKEN]).scrub() == ["dump.bin"]
    left = (tmp_path / "dump.bin").read_bytes()
    assert len(left) == len(blob)
    assert {name: pieces_left(left, part) for name, (_, part) in texts.items() if pieces_left(left, part)} == {}


def test_hashes_and_ordinary_words_stay_readable_beside_the_wide_forms() -> None:
    scrubber = Scrubber([TOKEN])
    text = "sha256 " + "ab" * 32 + " loss 1.2345 step 12/200000 tok/s 1234 checkpoint-000120 done\n"
    assert scrubber.scrub(text) == text


def test_a_secret_in_a_file_or_folder_name_is_renamed_and_said(engine, tmp_path: Path) -> None:
    make = (
        "import os; d='${run_dir}/cache_${api_token}'; os.makedirs(d); open(d + '/${api_token}.json', 'w').write('{}')"
    )
    spec = scrub_spec(tmp_path / "s.yaml", [python_leg(make)])
    proc = engine("run", str(spec), "--run-dir", "r", cwd=tmp_path, expect=0)
    names = [str(p.relative_to(tmp_path / "r")) for p in (tmp_path / "r").rglob("*")]
    assert [n for n in names if "RUNDIR" in n] == []
    assert "cache_<redacted>" in names and "cache_<redacted>/<redacted>.json" in names
    assert "   renamed cache_<redacted>: its name held a secret" in proc.out
    assert "   renamed cache_<redacted>/<redacted>.json: its name held a secret" in proc.out
    doc = json.loads((tmp_path / "r" / "evidence.json").read_text())
    assert doc["steps"]["leg"]["names_masked"] == ["cache_<redacted>", "cache_<redacted>/<redacted>.json"]


def test_a_password_in_a_url_value_reaches_neither_the_terminal_the_evidence_nor_the_log(
    engine, tmp_path: Path
) -> None:
    password = "s3cr3t-Pa55word-42"
    url = f"https://bob:{password}@git.example.com/org/repo.git"
    show = "import sys; print('cloning', sys.argv[1]); print('password is', sys.argv[1].split(':')[2].split('@')[0])"
    spec = scrub_spec(tmp_path / "s.yaml", [python_leg(show, "${repo}")], repo="none")
    proc = engine("run", str(spec), "--run-dir", "r", "--set", f"repo={url}", "-v", cwd=tmp_path, expect=0)
    stored = [p.read_text(errors="replace") for p in (tmp_path / "r").rglob("*") if p.is_file()]
    assert [text for text in [proc.out, proc.err, *stored] if password in text] == []
    assert (
        "cloning https://bob:<redacted>@git.example.com/org/repo.git"
        in (tmp_path / "r" / "logs" / "leg.log").read_text()
    )
    doc = json.loads((tmp_path / "r" / "evidence.json").read_text())
    assert doc["values"]["repo"] == "https://bob:<redacted>@git.example.com/org/repo.git"
