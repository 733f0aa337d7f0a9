"""Hostile specs, hostile legs and hostile evidence (issue 21): each case ends in a clear error
(exit 2 naming the input, or the leg's own harvest error), never a traceback, a hang, a leak or an
orphan. Everything runs for real: `engine` subprocesses, real legs, real signals."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest
import yaml

from engine import limits
from engine.cli import main
from engine.secrets import Scrubber
from engine.spec.values import layer, parse_sets

ROOT = Path(__file__).resolve().parents[2]
LEG = str(Path(__file__).parents[1] / "legs" / "leg.py")
ENGINE = [sys.executable, "-m", "engine.cli"]
TOKEN = "hf_HOSTILE_TOKEN_5b7c9d1e3f"


def write_spec(
    path: Path, steps: list[dict], checks: list[dict] | None = None, values: dict | None = None, **top: object
) -> Path:
    doc = {
        "version": 1,
        "name": "hostile",
        "budget_s": 1000,
        "values": values or {},
        "steps": steps,
        "checks": checks or [{"name": "ran", "why": "the leg ran", "expr": "steps.leg.rc == `0`"}],
    }
    doc.update(top)
    path.write_text(yaml.safe_dump(doc, sort_keys=False, width=10_000))
    return path


def leg(*actions: str, **run: object) -> dict:
    return {"name": "leg", "run": {"argv": ["${python}", LEG, *actions], "timeout_s": 60, **run}}


def engine(*args: str, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    """`engine ARGS` in this process (an escaping exception fails the test like a traceback)."""
    out, err = io.StringIO(), io.StringIO()
    saved_cwd, saved_env = os.getcwd(), dict(os.environ)
    os.chdir(cwd)
    os.environ.update(env or {})
    try:
        with redirect_stdout(out), redirect_stderr(err):
            rc = main(list(args))
    finally:
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)
    return subprocess.CompletedProcess(list(args), rc, out.getvalue(), err.getvalue())


def engine_process(*args: str, cwd: Path, timeout: float = 120, env: dict | None = None) -> subprocess.CompletedProcess:
    """`engine ARGS` as a subprocess: for the cases that would hang or eat the memory of the
    test process if the behaviour under test broke."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.run(ENGINE + list(args), cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)


def no_traceback(proc: subprocess.CompletedProcess) -> None:
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stdout + proc.stderr


def evidence(run_dir: Path) -> dict:
    return json.loads((run_dir / "evidence.json").read_text())


def pid_in(path: Path, timeout: float = 20.0) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().strip():
            return int(path.read_text())
        time.sleep(0.02)
    raise AssertionError(f"{path} never written")


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:  # a zombie answers kill(0) until init reaps it; it runs nothing
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def all_gone(pids: list[int], timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        alive = [p for p in pids if not gone(p)]
        if not alive:
            return []
        time.sleep(0.05)
    return [p for p in pids if not gone(p)]


def mask(n: int) -> str:
    """What a run-dir file holds where n bytes of a secret were."""
    return ("<redacted>" + "*" * n)[:n] if n >= 10 else "*" * n


def files_holding(root: Path, needle: bytes) -> list[str]:
    return [str(p) for p in root.rglob("*") if p.is_file() and not p.is_symlink() and needle in p.read_bytes()]


# ------------------------------------------------------------------ tracebacks -> clear errors


def test_run_json_nested_100000_deep_or_with_a_5000_digit_integer_is_a_harvest_error(tmp_path):
    code = (
        "print('DEEP ' + '[' * 100000 + ']' * 100000); print('BIG {\"n\": ' + '7' * 5000 + '}');"
        "print('FINE {\"n\": 1}')"
    )
    spec = write_spec(
        tmp_path / "s.yaml",
        [
            {
                "name": "leg",
                "run": {
                    "argv": ["${python}", "-c", code],
                    "timeout_s": 60,
                    "output": {
                        "harvest": {"deep": {"marker": "DEEP "}, "big": {"marker": "BIG "}, "fine": {"marker": "FINE "}}
                    },
                },
            }
        ],
        checks=[{"name": "fine", "why": "the sane marker is still read", "expr": "steps.leg.harvest.fine.n == `1`"}],
    )
    proc = engine("run", str(spec), "--run-dir", "r", cwd=tmp_path)
    no_traceback(proc)
    # The engine reads on and the sane marker passes its check; the two it could not read fail the
    # verdict as harvest problems (the value a check would read is not what the leg meant).
    assert proc.returncode == 5 and 'VERDICT hostile FAIL ["harvest:leg.deep", "harvest:leg.big"]' in proc.stdout
    assert "fine" in proc.stdout and evidence(tmp_path / "r")["checks"][0]["outcome"] == "PASS"
    errors = {e["name"]: e["error"] for e in evidence(tmp_path / "r")["steps"]["leg"]["harvest_errors"]}
    assert "nested" in errors["deep"] and "5,000 digits" in errors["big"], errors


def test_a_jmespath_expression_nested_3000_deep_is_invalid_not_a_crash(tmp_path):
    expr = "(" * 3000 + "steps.leg.rc" + ")" * 3000 + " == `0`"
    spec = write_spec(tmp_path / "s.yaml", [leg("hi")], checks=[{"name": "deep", "why": "w", "expr": expr}])
    proc = engine("validate", str(spec), cwd=tmp_path)
    no_traceback(proc)
    assert proc.returncode == 2 and "$.checks[0].expr" in proc.stdout and "nested" in proc.stdout


@pytest.mark.parametrize(
    "step,named",
    [
        (leg("a\0b"), "argv[2] contains a NUL byte"),
        (leg("hi", env={"BAD=NAME": "x"}), "environment variable name 'BAD=NAME' is not valid"),
        (leg("hi", env={"GOOD": "x\0y"}), "environment variable GOOD contains a NUL byte"),
    ],
)
def test_argv_nul_or_a_bad_environment_name_fails_the_step_with_a_message(tmp_path, step, named):
    spec = write_spec(tmp_path / "s.yaml", [step])
    proc = engine("run", str(spec), "--run-dir", "r", cwd=tmp_path)
    no_traceback(proc)
    assert proc.returncode == 5 and "VERDICT hostile FAIL" in proc.stdout
    assert named in evidence(tmp_path / "r")["steps"]["leg"]["error"]


@pytest.mark.parametrize("where", ["file", "/dev/null", "/proc/specprobe-run"])
def test_a_run_dir_that_cannot_be_one_is_refused_before_anything_runs(tmp_path, where):
    (tmp_path / "file").write_text("x")
    marker = tmp_path / "ran"
    spec = write_spec(tmp_path / "s.yaml", [leg(f"@pidfile:{marker}")])
    proc = engine("run", str(spec), "--run-dir", where, cwd=tmp_path)
    no_traceback(proc)
    assert proc.returncode == 2 and "--run-dir" in proc.stderr and "VERDICT" not in proc.stdout
    assert not marker.exists()


@pytest.mark.parametrize("flag", ["--junit", "--markdown"])
def test_an_unwritable_report_is_refused_before_the_legs_run(tmp_path, flag):
    (tmp_path / "afile").write_text("x")
    marker = tmp_path / "ran"
    spec = write_spec(tmp_path / "s.yaml", [leg(f"@pidfile:{marker}")])
    proc = engine("run", str(spec), "--run-dir", "r", flag, "afile/report", cwd=tmp_path)
    no_traceback(proc)
    assert proc.returncode == 2 and f"{flag} afile/report" in proc.stderr
    assert "VERDICT" not in proc.stdout and not marker.exists()


def test_a_report_that_became_unwritable_during_the_run_is_an_error_before_the_verdict(tmp_path):
    # The leg turns the report's directory into a file: the check at the start passed.
    (tmp_path / "out").mkdir()
    code = "import shutil; shutil.rmtree('out'); open('out', 'w').close()"
    spec = write_spec(
        tmp_path / "s.yaml", [{"name": "leg", "run": {"argv": ["${python}", "-c", code], "timeout_s": 60}}]
    )
    proc = engine("run", str(spec), "--run-dir", "r", "--junit", "out/junit.xml", cwd=tmp_path)
    no_traceback(proc)
    assert proc.returncode == 2 and "could not write the report out/junit.xml" in proc.stderr
    assert evidence(tmp_path / "r")["verdict"]["outcome"] == "PASS"  # the run itself is kept


@pytest.mark.parametrize(
    "content,says",
    [
        (b'{"evidence_version": 1, "x": ' + b"[" * 50_000 + b"]" * 50_000 + b"}", "nested"),
        (b'{"evidence_version": 1, "x": ' + b"[" * 500 + b"]" * 500 + b"}", "nested more than"),
        (json.dumps({"evidence_version": 1, "steps": [], "values": "x"}).encode(), "$.steps: expected an object"),
        (
            json.dumps({"evidence_version": 1, "steps": {"leg": {"status": 3, "log": "/etc/passwd"}}}).encode(),
            "$.steps.leg.status: expected a string",
        ),
        (b'{"evidence_version": 1, "mode": "\xff\xfe"}', "not UTF-8"),
    ],
)
def test_check_on_hostile_evidence_is_refused_naming_the_problem(tmp_path, content, says):
    spec = write_spec(tmp_path / "s.yaml", [leg("hi")])
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "evidence.json").write_bytes(content)
    proc = engine("check", str(spec), "--evidence", "r", cwd=tmp_path)
    no_traceback(proc)
    assert proc.returncode == 2 and says in proc.stderr and "evidence.json" in proc.stderr


def test_replay_reads_no_raw_log_outside_the_run_dir(tmp_path):
    spec = write_spec(tmp_path / "s.yaml", [leg("hi")])
    (tmp_path / "r").mkdir()
    doc = {"evidence_version": 1, "steps": {"leg": {"kind": "run", "status": "ok", "log": "../../etc/passwd"}}}
    (tmp_path / "r" / "evidence.json").write_text(json.dumps(doc))
    proc = engine("replay", str(spec), "--evidence", "r", cwd=tmp_path)
    no_traceback(proc)
    assert proc.returncode == 2 and "is not a path inside the run directory" in proc.stderr


def failed_run(tmp_path: Path) -> Path:
    """A saved run of a failed leg (its failure lines are re-harvested by a replay)."""
    spec = write_spec(tmp_path / "s.yaml", [leg("Error: the leg failed", "@rc:1")])
    assert engine("run", str(spec), "--run-dir", "r", cwd=tmp_path).returncode == 5
    return tmp_path / "r"


@pytest.mark.parametrize(
    "make, says",
    [
        (lambda log: log.symlink_to("/proc/self/environ"), "outside"),
        (lambda log: log.symlink_to("/dev/zero"), "outside"),
        (lambda log: os.mkfifo(log), "not a regular file (a FIFO)"),
        (lambda log: log.symlink_to(log.parent.parent.parent / "elsewhere.log"), "outside"),
    ],
    ids=["environ", "device", "fifo", "file-outside"],
)
def test_replay_refuses_a_bundle_log_that_is_not_a_regular_file_inside_it(tmp_path, make, says):
    run = failed_run(tmp_path)
    (tmp_path / "elsewhere.log").write_text(f"Error HF_TOKEN={TOKEN}\n")
    log = run / "logs" / "leg.log"
    log.unlink()
    make(log)
    proc = engine("replay", str(tmp_path / "s.yaml"), "--evidence", "r", cwd=tmp_path, env={"HF_TOKEN": TOKEN})
    no_traceback(proc)
    assert proc.returncode == 2 and proc.stderr.startswith("raw log r/logs/leg.log: ") and says in proc.stderr
    assert TOKEN not in proc.stdout + proc.stderr
    assert not list(run.glob("replay-*")) and files_holding(run, TOKEN.encode()) == []


def test_replay_reads_a_log_linked_inside_its_bundle(tmp_path):
    run = failed_run(tmp_path)
    (run / "logs" / "leg.log").rename(run / "logs" / "kept.log")
    (run / "logs" / "leg.log").symlink_to("kept.log")
    proc = engine("replay", str(tmp_path / "s.yaml"), "--evidence", "r", cwd=tmp_path)
    no_traceback(proc)
    assert proc.returncode == 5 and len(list(run.glob("replay-*.json"))) == 1


def test_check_refuses_an_evidence_file_that_links_out_of_its_bundle(tmp_path):
    run = failed_run(tmp_path)
    (run / "evidence.json").rename(tmp_path / "evidence.json")
    (run / "evidence.json").symlink_to(tmp_path / "evidence.json")
    proc = engine("check", str(tmp_path / "s.yaml"), "--evidence", "r", cwd=tmp_path)
    no_traceback(proc)
    assert proc.returncode == 2 and f"resolves to {tmp_path / 'evidence.json'}, outside r" in proc.stderr


def test_what_a_replay_writes_from_a_bundle_passes_the_secret_filter(tmp_path):
    # The bundle's own log holds this machine's token (a bundle may hold anything): the replay's
    # record, its reports and its terminal output show it redacted.
    run = failed_run(tmp_path)
    (run / "logs" / "leg.log").write_text(f"Error: login {TOKEN} refused\n", encoding="utf-8")
    proc = engine(
        "replay",
        str(tmp_path / "s.yaml"),
        "--evidence",
        "r",
        "--junit",
        "j.xml",
        "--markdown",
        "m.md",
        cwd=tmp_path,
        env={"HF_TOKEN": TOKEN},
    )
    no_traceback(proc)
    assert proc.returncode == 5
    (record,) = run.glob("replay-*.json")
    assert json.loads(record.read_text())["steps"]["leg"]["failure_lines"] == ["Error: login <redacted> refused"]
    assert TOKEN not in proc.stdout + proc.stderr
    assert files_holding(tmp_path, TOKEN.encode()) == [str(run / "logs" / "leg.log")]


def test_a_re_check_record_is_never_written_through_a_link_the_bundle_planted(tmp_path):
    # The record's temporary name is predictable (the second it is written in): a bundle could hold
    # a link there to any file of the reviewer's; the record goes through a file of its own.
    from datetime import datetime, timedelta, timezone

    run = failed_run(tmp_path)
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me\n")
    now = datetime.now(timezone.utc)
    for second in range(30):
        stamp = (now + timedelta(seconds=second)).strftime("%Y%m%dT%H%M%SZ")
        (run / f"check-{stamp}.json.tmp").symlink_to(victim)
    proc = engine("check", str(tmp_path / "s.yaml"), "--evidence", "r", cwd=tmp_path)
    no_traceback(proc)
    assert proc.returncode == 5 and victim.read_text() == "keep me\n"
    (record,) = run.glob("check-*.json")
    assert json.loads(record.read_text())["kind"] == "check"


def test_a_yaml_alias_bomb_is_refused_quickly(tmp_path):
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 9)]
    text = "version: 1\nname: bomb\nbudget_s: 10\nvalues:\n" + "".join(f"  {line}\n" for line in lines)
    (tmp_path / "s.yaml").write_text(text + "steps: []\nchecks: [{name: c, why: w, expr: '`true`'}]\n")
    proc = engine_process("validate", "s.yaml", cwd=tmp_path, timeout=60)
    no_traceback(proc)
    assert proc.returncode == 2 and "expands to more than 100,000 nodes (a YAML alias bomb?)" in proc.stdout


# ------------------------------------------------------------------ hangs and blow-ups, bounded


def test_a_catastrophic_strip_prefix_gives_up_and_fails_the_step_not_the_engine(tmp_path):
    line = "a" * 64 + "!"
    spec = write_spec(
        tmp_path / "s.yaml",
        [
            leg(
                *[line] * 3,
                "RUN_JSON {}",
                "@forever",
                timeout_s=3,
                grace_s=1,
                output={"strip_prefix": "^(a|aa)+$", "harvest": {"rj": {"marker": "RUN_JSON "}}},
            )
        ],
    )
    started = time.monotonic()
    proc = engine_process("run", str(spec), "--run-dir", "r", cwd=tmp_path, timeout=90)
    took = time.monotonic() - started
    no_traceback(proc)
    step = evidence(tmp_path / "r")["steps"]["leg"]
    assert step["timed_out"] and step["status"] == "failed"  # its own timeout still fired
    assert "output.strip_prefix '^(a|aa)+$' gave up" in step["error"]
    assert took < 60 and proc.returncode == 5


def test_sigint_stops_the_engine_while_a_check_grinds_a_catastrophic_regex(tmp_path):
    # The regex's own time limit is lifted: only the engine's honouring of SIGINT can stop it.
    code = f"""
import signal, time
from engine import limits
from engine.judge.checks import evaluate
from engine.expr.functions import OPTIONS
limits.REGEX_TIMEOUT_S = 600.0
signal.setitimer(signal.ITIMER_REAL, 0.5)
signal.signal(signal.SIGALRM, signal.default_int_handler)
started = time.monotonic()
try:
    evaluate([{{"name": "c", "why": "w", "expr": "regex_match('{"a" * 200}!', '^(a|aa)+$')"}}], {{}}, OPTIONS)
except KeyboardInterrupt:
    print("interrupted after", round(time.monotonic() - started, 1))
"""
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.stdout.startswith("interrupted after"), proc.stdout + proc.stderr
    assert float(proc.stdout.split()[-1]) < 10


@pytest.mark.parametrize("key", ["expr", "when"])
def test_a_catastrophic_regex_match_in_a_check_is_an_error_naming_the_pattern(tmp_path, key):
    bomb = f"regex_match('{'a' * 64}!', '^(a|aa)+$')"
    check = {"name": "bomb", "why": "w", "expr": "steps.leg.rc == `0`"}
    check[key] = bomb
    spec = write_spec(tmp_path / "s.yaml", [leg("hi")], checks=[check])
    proc = engine_process("run", str(spec), "--run-dir", "r", cwd=tmp_path, timeout=90)
    no_traceback(proc)
    result = evidence(tmp_path / "r")["checks"][0]
    assert result["outcome"] == "ERROR" and "gave up after 1 s" in result["reason"]


def test_range_bombs_are_refused_with_the_expression_named(tmp_path):
    # 2,000 x 1,000 elements: each call is small, together they are twice the limit.
    bomb = "length(map(&range(`0`, `1000`), range(`0`, `2000`)))"
    spec = write_spec(tmp_path / "s.yaml", [leg("hi")], values={"n": {"eval": bomb}})
    proc = engine("plan", str(spec), cwd=tmp_path)
    no_traceback(proc)
    assert proc.returncode == 2 and "$.values.n.eval" in proc.stderr and "range() would make" in proc.stderr
    spec = write_spec(tmp_path / "c.yaml", [leg("hi")], checks=[{"name": "bomb", "why": "w", "expr": bomb + " == `1`"}])
    proc = engine("run", str(spec), "--run-dir", "r", cwd=tmp_path)
    no_traceback(proc)
    result = evidence(tmp_path / "r")["checks"][0]
    assert result["outcome"] == "ERROR" and "limit 1,000,000 per expression" in result["reason"]


def test_huge_integers_from_arithmetic_are_refused():
    from engine.expr.functions import FunctionError, compile_expr, search

    expr = "mul(mul(mul(mul(x, x), mul(x, x)), mul(mul(x, x), mul(x, x))), x)"
    with pytest.raises(FunctionError, match="digits"):
        search(compile_expr(expr), {"x": 10**60})


def test_a_diamond_of_includes_22_deep_loads_each_file_once(tmp_path):
    for level in range(22):
        nxt = [f"d{level + 1}a.yaml", f"d{level + 1}b.yaml"] if level < 21 else []
        for side in "ab":
            body = f"values: {{v{level}{side}: {level}}}\n" + (f"include: {nxt}\n" if nxt else "")
            (tmp_path / f"d{level}{side}.yaml").write_text(body)
    (tmp_path / "s.yaml").write_text(
        "version: 1\nname: diamond\nbudget_s: 10\ninclude: [d0a.yaml, d0b.yaml]\n"
        "steps: []\nchecks: [{name: c, why: w, expr: '`true`'}]\n"
    )
    proc = engine_process("validate", "s.yaml", cwd=tmp_path)
    no_traceback(proc)
    assert proc.returncode == 0, proc.stdout


@pytest.mark.parametrize("target", ["/dev/zero", "fifo", "dir"])
def test_extends_only_reads_regular_files(tmp_path, target):
    if target == "fifo":
        os.mkfifo(tmp_path / "fifo")
    if target == "dir":
        (tmp_path / "dir").mkdir()
    (tmp_path / "s.yaml").write_text(f"extends: {target}\nversion: 1\nname: x\n")
    proc = engine_process("validate", "s.yaml", cwd=tmp_path, timeout=30)
    no_traceback(proc)
    assert proc.returncode == 2 and "not a regular file" in proc.stdout


def test_scrubbing_many_secrets_grows_linearly_not_quadratically():
    doc = {f"value_{i}": f"text {i} around secret{i:06d} here" for i in range(5000)}

    def cost(n: int) -> float:
        scrubber = Scrubber(f"secret{i:06d}" for i in range(n))
        started = time.perf_counter()
        out = scrubber.scrub_obj(doc)
        took = time.perf_counter() - started
        assert out["value_7"] == "text 7 around <redacted> here" if n > 7 else True
        return took

    few, many = min(cost(50) for _ in range(3)), min(cost(5000) for _ in range(3))
    assert many < 20 * few + 0.05, (few, many)  # one by one, 100x the secrets cost 100x


def test_a_chain_of_500_values_is_an_error_not_a_recursion_crash(tmp_path):
    values = {f"v{i}": f"${{v{i + 1}}}x" for i in range(499)}
    values["v499"] = "end"
    spec = write_spec(tmp_path / "s.yaml", [leg("hi")], values=values)
    proc = engine("plan", str(spec), cwd=tmp_path)
    no_traceback(proc)
    assert proc.returncode == 2 and "refer through more than 100 other values" in proc.stderr


def test_a_command_collector_printing_too_much_is_an_error_in_bounded_memory(tmp_path):
    code = "import sys\nfor _ in range(40): sys.stdout.write('x' * (1 << 20) + '\\n')"
    spec = write_spec(
        tmp_path / "s.yaml",
        [leg("hi"), {"name": "st", "collect": {"collector": "command", "args": {"argv": ["${python}", "-c", code]}}}],
    )
    proc = engine("run", str(spec), "--run-dir", "r", cwd=tmp_path)
    no_traceback(proc)
    step = evidence(tmp_path / "r")["steps"]["st"]
    assert step["status"] == "failed" and "over the 16 MiB limit" in step["error"]


def test_output_without_newlines_is_cut_per_line_and_kept_small(tmp_path):
    code = "import sys\nfor _ in range(50): sys.stdout.write('y' * (1 << 20))\nsys.exit(1)"
    spec = write_spec(
        tmp_path / "s.yaml", [{"name": "leg", "run": {"argv": ["${python}", "-c", code], "timeout_s": 60}}]
    )
    proc = engine("run", str(spec), "--run-dir", "r", cwd=tmp_path)
    no_traceback(proc)
    assert (tmp_path / "r" / "evidence.json").stat().st_size < 200_000
    step = evidence(tmp_path / "r")["steps"]["leg"]
    assert step["lines"] == 1 and step["tail"][0].endswith("more characters]")
    log = (tmp_path / "r" / "logs" / "leg.log").read_text()
    assert len(log) < limits.LINE_MAX_CHARS + 100 and log.rstrip("\n").endswith(limits.CUT_MARKER)


def test_a_run_json_line_over_the_line_limit_says_so(tmp_path):
    code = "print('RUN_JSON {\"pad\": \"' + 'z' * (3 << 20) + '\"}')"
    spec = write_spec(
        tmp_path / "s.yaml",
        [
            {
                "name": "leg",
                "run": {
                    "argv": ["${python}", "-c", code],
                    "timeout_s": 60,
                    "output": {"harvest": {"rj": {"marker": "RUN_JSON "}}},
                },
            }
        ],
    )
    proc = engine("run", str(spec), "--run-dir", "r", cwd=tmp_path)
    no_traceback(proc)
    (error,) = evidence(tmp_path / "r")["steps"]["leg"]["harvest_errors"]
    assert "longer than the 1 MiB line limit" in error["error"] and "Unterminated" not in error["error"]


def test_a_big_leg_log_keeps_its_head_and_tail_with_a_marker(tmp_path):
    from engine.run.process import run_command

    log = tmp_path / "leg.log"
    result = run_command(
        [sys.executable, LEG, "@repeat:200000:line {i} of the leg"], log_path=log, log_limits=(64 << 10, 64 << 10)
    )
    assert result.rc == 0 and result.lines == 200_000
    text = log.read_text()
    assert len(text) < (64 << 10) * 3
    assert text.startswith("line 0 of the leg\n") and text.endswith("line 199999 of the leg\n")
    assert "lines (" in text and "of this log dropped here" in text
    assert not list(tmp_path.glob("leg.log.tail-*"))


# ------------------------------------------------------------------ leaks


def test_a_secret_straddling_the_line_cut_leaks_no_piece(tmp_path):
    from engine.run.process import run_command

    at = limits.LINE_MAX_CHARS - len(TOKEN) // 2  # half of it before the cut, half after
    log = tmp_path / "leg.log"
    seen: list[str] = []
    result = run_command(
        [sys.executable, LEG, f"@line:{3 << 20}:{at}:{TOKEN}", f"after {TOKEN}"],
        log_path=log,
        scrub=Scrubber([TOKEN]),
        on_block=lambda b: seen.extend(b.lines),
    )
    assert result.rc == 0
    text = log.read_text() + "\n".join(seen)
    for piece in (TOKEN, TOKEN[: len(TOKEN) // 2], TOKEN[len(TOKEN) // 2 :]):
        assert piece not in text
    assert seen[1] == "after <redacted>"


@pytest.mark.parametrize("at", [8, len(TOKEN) // 2, len(TOKEN) - 8])
def test_a_secret_split_by_a_tee_header_leaks_no_piece_of_eight_characters(tmp_path, at):
    # torchrun's --tee copies a line the rank is still writing: the part written so far, then the
    # rest, each with its own "[default0]:" header, so the header lands inside the token.
    spec = write_spec(
        tmp_path / "s.yaml",
        [leg(f"@tee_split:HF_TOKEN:{at}:${{run_dir}}/rank0.log", "@rc:1", output={"strip_prefix": r"^\[default\d\]:"})],
    )
    proc = engine("run", str(spec), "--run-dir", "r", "--junit", "j.xml", cwd=tmp_path, env={"HF_TOKEN": TOKEN})
    no_traceback(proc)
    assert proc.returncode == 5
    shown = proc.stdout + proc.stderr
    for needle in (TOKEN[:at], TOKEN[at:]):
        assert files_holding(tmp_path, needle.encode()) == [], needle
        assert needle not in shown
    log = (tmp_path / "r" / "logs" / "leg.log").read_text()
    assert log == "[default0]:logging in with <redacted>[default0]:<redacted> as the rank\n"
    masked = (tmp_path / "r" / "rank0.log").read_text()
    assert masked == f"[default0]:logging in with {mask(at)}[default0]:{mask(len(TOKEN) - at)} as the rank\n"


ODD_SECRET = 'Pa"ss\\wörd'


def test_a_secret_with_a_quote_a_backslash_and_an_umlaut_leaks_in_no_encoded_form(tmp_path):
    code = (
        "import json, os, sys\n"
        "s = os.environ['DB_PASSWORD']\n"
        "print('Error json', json.dumps({'p': s}), json.dumps({'p': s}, ensure_ascii=False))\n"
        "print('Error repr', {'p': s}, ascii(s), s.encode())\n"
        "print('Error env', dict(os.environ))\n"
        "print('Error url', 'https://u:' + __import__('urllib.parse').parse.quote(s, safe='') + '@host')\n"
        "with open(os.path.join(sys.argv[1], 'error.json'), 'w') as fh:\n"
        "    json.dump({'message': repr(s), 'raw': s}, fh)\n"
        "sys.exit(1)\n"
    )
    spec = write_spec(
        tmp_path / "s.yaml",
        [{"name": "leg", "run": {"argv": ["${python}", "-c", code, "${run_dir}"], "timeout_s": 60}}],
    )
    proc = engine(
        "run",
        str(spec),
        "--run-dir",
        "r",
        "--junit",
        "j.xml",
        "--markdown",
        "m.md",
        "--html",
        "h.html",
        cwd=tmp_path,
        env={"DB_PASSWORD": ODD_SECRET},
    )
    no_traceback(proc)
    assert proc.returncode == 5
    s = ODD_SECRET
    written = {
        "raw": s,
        "json": json.dumps(s)[1:-1],
        "json utf-8": json.dumps(s, ensure_ascii=False)[1:-1],
        "repr": repr(s)[1:-1],
        "ascii": ascii(s)[1:-1],
        "bytes": repr(s.encode())[2:-1],
        "url": "Pa%22ss%5Cw%C3%B6rd",
        "json of repr": json.dumps(repr(s))[1:-1],
        "json of json": json.dumps(json.dumps(s))[1:-1],
    }
    assert len(set(written.values())) == len(written)
    for how, form in written.items():
        assert files_holding(tmp_path, form.encode()) == [], how
        assert form not in proc.stdout + proc.stderr, how
    failure_lines = evidence(tmp_path / "r")["steps"]["leg"]["failure_lines"]
    assert failure_lines[0] == 'Error json {"p": "<redacted>"} {"p": "<redacted>"}'
    assert evidence(tmp_path / "r")["steps"]["leg"]["secrets_masked_in"] == ["error.json"]


def test_a_value_the_spec_feeds_from_a_secret_variable_is_shown_redacted(tmp_path):
    # `env: {GITHUB_TOKEN: repo}`: the value's name does not look secret, its text is the token.
    spec = write_spec(tmp_path / "s.yaml", [leg("${repo}")], values={"repo": "none"}, env={"GITHUB_TOKEN": "repo"})
    plan = engine("plan", str(spec), cwd=tmp_path, env={"GITHUB_TOKEN": TOKEN})
    run = engine("run", str(spec), "--run-dir", "r", cwd=tmp_path, env={"GITHUB_TOKEN": TOKEN})
    verbose = engine("run", str(spec), "--run-dir", "r2", "-v", cwd=tmp_path, env={"GITHUB_TOKEN": TOKEN})
    assert (plan.returncode, run.returncode, verbose.returncode) == (0, 0, 0)
    for shown in (plan.stdout, verbose.stdout):
        assert TOKEN not in shown and 'repo = "<redacted>" [env]' in " ".join(shown.split())
    assert TOKEN not in run.stdout and 'repo="<redacted>" (env GITHUB_TOKEN)' in run.stdout
    assert evidence(tmp_path / "r")["values"]["repo"] == "<redacted>"


def test_the_reports_of_a_run_show_a_secret_in_a_step_error_redacted(tmp_path):
    spec = write_spec(
        tmp_path / "s.yaml",
        [{"name": "wipe", "remove": ["/etc/${api_token}"]}],
        checks=[{"name": "c", "why": "w", "expr": "steps.wipe.status == 'ok'"}],
        values={"api_token": TOKEN},
    )
    proc = engine(
        "run", str(spec), "--run-dir", "r", "--junit", "j.xml", "--markdown", "m.md", "--html", "h.html", cwd=tmp_path
    )
    no_traceback(proc)
    assert proc.returncode == 5 and "refusing to remove /etc/<redacted>" in proc.stdout
    assert TOKEN not in proc.stdout + proc.stderr
    for report, shown in (
        ("j.xml", "/etc/&lt;redacted&gt;"),
        ("m.md", "/etc/&lt;redacted&gt;"),  # escaped, as the HTML report escapes it
        ("h.html", "/etc/&lt;redacted&gt;"),
    ):
        text = (tmp_path / report).read_text(encoding="utf-8")
        assert TOKEN not in text and shown in text, report


def test_a_secret_given_with_set_is_taken_as_written():
    # (A non-secret `0123` is refused: YAML 1.1 would read it as 83, tests/engine/test_read_as_written.py.)
    sets = parse_sets(["api_token=0123", "hub_password=yes", "n=0x1F", "flag=yes"])
    assert sets == {"api_token": "0123", "hub_password": "yes", "n": 31, "flag": True}
    defs = layer({"env": {"API_TOKEN": "api_token"}}, None, {"API_TOKEN": "0x1F"}, {}, {})
    assert defs["api_token"].raw == "0x1F"


@pytest.mark.parametrize("rc", [0, 1])
def test_no_file_under_the_run_dir_holds_a_secret_after_a_passing_or_failing_run(tmp_path, rc):
    script = tmp_path / "writes.py"
    script.write_text(
        "import os, sys\n"
        "d = os.path.join(sys.argv[1], 'tlogs', 'attempt_0')\n"
        "os.makedirs(d)\n"
        "open(os.path.join(d, 'env.log'), 'w').write(repr(dict(os.environ)))\n"
        "open(os.path.join(d, 'blob.bin'), 'wb').write(b'\\0' * 5000 + os.environ['HF_TOKEN'].encode() + b'\\1')\n"
        "print('token', os.environ['HF_TOKEN'])\n"
        f"sys.exit({rc})\n"
    )
    spec = write_spec(
        tmp_path / "s.yaml",
        [{"name": "leg", "run": {"argv": ["${python}", str(script), "${run_dir}"], "timeout_s": 60}}],
        values={"api_key": "k3y-0123456789"},
    )
    proc = engine(
        "run", str(spec), "--run-dir", "r", "--set", "api_key=0123456789abc", cwd=tmp_path, env={"HF_TOKEN": TOKEN}
    )
    no_traceback(proc)
    assert proc.returncode == (0 if rc == 0 else 5)
    for secret in (TOKEN, "0123456789abc"):
        assert files_holding(tmp_path / "r", secret.encode()) == []
        assert secret not in proc.stdout + proc.stderr
    blob = (tmp_path / "r" / "tlogs" / "attempt_0" / "blob.bin").read_bytes()
    assert len(blob) == 5000 + len(TOKEN) + 1  # masked in place: the file keeps its layout
    assert "tlogs/attempt_0/env.log" in evidence(tmp_path / "r")["steps"]["leg"]["secrets_masked_in"]


def test_masking_a_hard_linked_file_leaves_the_file_outside_the_run_dir_as_it_was(tmp_path):
    outside = tmp_path / "credentials.txt"
    outside.write_text(f"token = {TOKEN}\n")
    code = f"import os, sys; os.link({str(outside)!r}, os.path.join(sys.argv[1], 'linked.txt'))"
    spec = write_spec(
        tmp_path / "s.yaml",
        [{"name": "leg", "run": {"argv": ["${python}", "-c", code, "${run_dir}"], "timeout_s": 60}}],
    )
    proc = engine("run", str(spec), "--run-dir", "r", cwd=tmp_path, env={"HF_TOKEN": TOKEN})
    no_traceback(proc)
    assert proc.returncode == 0
    assert outside.read_text() == f"token = {TOKEN}\n"  # not the engine's to change
    linked = tmp_path / "r" / "linked.txt"
    assert linked.read_text() == f"token = {mask(len(TOKEN))}\n" and linked.stat().st_nlink == 1
    assert evidence(tmp_path / "r")["steps"]["leg"]["secrets_masked_in"] == ["linked.txt"]


def test_a_file_rewritten_with_a_secret_and_its_times_put_back_is_masked(tmp_path):
    # Leg 1 leaves a clean file; leg 2 writes the token over it in place, same size, same inode,
    # and puts its modification time back: only its bytes tell.
    code = (
        "import os, sys\n"
        "path = os.path.join(sys.argv[1], 'rank.log')\n"
        "if sys.argv[2] == 'clean':\n"
        "    open(path, 'w').write('x' * 100)\n"
        "else:\n"
        "    st = os.stat(path)\n"
        "    with open(path, 'r+') as fh:\n"
        "        fh.write(os.environ['HF_TOKEN'])\n"
        "    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))\n"
    )
    steps = [
        {"name": name, "run": {"argv": ["${python}", "-c", code, "${run_dir}", name], "timeout_s": 60}}
        for name in ("clean", "dirty")
    ]
    spec = write_spec(tmp_path / "s.yaml", steps, checks=[{"name": "ran", "why": "w", "expr": "steps.dirty.rc == `0`"}])
    proc = engine("run", str(spec), "--run-dir", "r", cwd=tmp_path, env={"HF_TOKEN": TOKEN})
    no_traceback(proc)
    assert proc.returncode == 0
    assert (tmp_path / "r" / "rank.log").read_text() == mask(len(TOKEN)) + "x" * (100 - len(TOKEN))
    assert evidence(tmp_path / "r")["steps"]["dirty"]["secrets_masked_in"] == ["rank.log"]


def test_a_symlink_a_leg_left_at_a_later_steps_log_name_is_replaced_not_written_through(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me\n")
    code = f"import os, sys; os.symlink({str(victim)!r}, os.path.join(sys.argv[1], 'logs', 'second.log'))"
    steps = [
        {"name": "first", "run": {"argv": ["${python}", "-c", code, "${run_dir}"], "timeout_s": 60}},
        {"name": "second", "run": {"argv": ["${python}", LEG, "the second leg's output"], "timeout_s": 60}},
    ]
    spec = write_spec(
        tmp_path / "s.yaml", steps, checks=[{"name": "ran", "why": "w", "expr": "steps.second.rc == `0`"}]
    )
    proc = engine("run", str(spec), "--run-dir", "r", cwd=tmp_path)
    no_traceback(proc)
    assert proc.returncode == 0
    assert victim.read_text() == "keep me\n"
    log = tmp_path / "r" / "logs" / "second.log"
    assert not log.is_symlink() and log.read_text() == "the second leg's output\n"


def test_a_secret_across_the_diagnostics_line_cut_leaves_no_piece(tmp_path):
    at = limits.EVIDENCE_LINE_MAX_CHARS - 5  # 5 characters of the token before the cut
    code = (
        "import os, sys\n"
        "os.makedirs(sys.argv[1])\n"
        f"line = 'x' * {at} + os.environ['HF_TOKEN'] + 'y' * 100\n"
        "open(os.path.join(sys.argv[1], 'rank0.log'), 'w').write(line + '\\n')\n"
        "sys.exit(1)\n"
    )
    run = {"argv": ["${python}", "-c", code, "${run_dir}/tlogs"], "timeout_s": 60}
    run["on_failure"] = {"diagnostics": {"dir": "${run_dir}/tlogs"}}
    spec = write_spec(tmp_path / "s.yaml", [{"name": "leg", "run": run}])
    proc = engine("run", str(spec), "--run-dir", "r", cwd=tmp_path, env={"HF_TOKEN": TOKEN})
    no_traceback(proc)
    (tail,) = evidence(tmp_path / "r")["steps"]["leg"]["diagnostics"]["files"][0]["tail"]
    assert tail.startswith("x" * at + "<reda") and TOKEN[:5] not in tail
    assert TOKEN[:5] not in proc.stdout


def test_a_secret_a_later_leg_writes_into_an_earlier_steps_log_is_masked(tmp_path):
    # The engine vouches for the logs it wrote through the filter by their SHA-256, not by name.
    code = "import os, sys; open(os.path.join(sys.argv[1], 'logs', 'first.log'), 'a').write(os.environ['HF_TOKEN'])"
    steps = [
        {"name": "first", "run": {"argv": ["${python}", LEG, "the first leg"], "timeout_s": 60}},
        {"name": "second", "run": {"argv": ["${python}", "-c", code, "${run_dir}"], "timeout_s": 60}},
    ]
    spec = write_spec(
        tmp_path / "s.yaml", steps, checks=[{"name": "ran", "why": "w", "expr": "steps.second.rc == `0`"}]
    )
    proc = engine("run", str(spec), "--run-dir", "r", cwd=tmp_path, env={"HF_TOKEN": TOKEN})
    no_traceback(proc)
    assert proc.returncode == 0
    assert (tmp_path / "r" / "logs" / "first.log").read_text() == "the first leg\n" + mask(len(TOKEN))
    assert evidence(tmp_path / "r")["steps"]["second"]["secrets_masked_in"] == ["logs/first.log"]


# ------------------------------------------------------------------ orphans


@pytest.mark.parametrize("escape", ["@daemon", "@orphan", "@daemon_noenv"])
def test_sigkill_of_the_engine_takes_the_whole_leg_with_it(tmp_path, escape):
    leader, escaped = tmp_path / "leader.pid", tmp_path / "escaped.pid"
    spec = write_spec(tmp_path / "s.yaml", [leg(f"{escape}:{escaped}", f"@pidfile:{leader}", "@forever")])
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        ENGINE + ["run", str(spec), "--run-dir", "r"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        pids = [pid_in(leader), pid_in(escaped)]
        assert not any(gone(p) for p in pids)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        assert all_gone(pids, timeout=20) == []
    finally:
        for p in [leader, escaped]:
            if p.exists() and not gone(int(p.read_text())):
                os.kill(int(p.read_text()), signal.SIGKILL)


def test_a_child_orphaned_at_once_dies_with_the_leg(tmp_path):
    from engine.run.process import run_command

    escaped = tmp_path / "escaped.pid"
    result = run_command([sys.executable, LEG, f"@orphan:{escaped}"], timeout_s=30)
    assert result.rc == 0
    assert all_gone([pid_in(escaped)], timeout=0.5) == []


# ------------------------------------------------------------------ also


def test_remove_refuses_paths_outside_the_run_dir_unless_allowed(tmp_path):
    outside = tmp_path / "outside"
    (outside / "victim").mkdir(parents=True)
    work = tmp_path / "work"
    work.mkdir()
    spec = write_spec(work / "s.yaml", [leg("hi"), {"name": "wipe", "remove": ["../outside/victim"]}])
    proc = engine("run", str(spec), "--run-dir", "r", cwd=work)
    no_traceback(proc)
    assert "outside the run directory" in evidence(work / "r")["steps"]["wipe"]["error"]
    assert (outside / "victim").exists()
    spec = write_spec(
        work / "s2.yaml",
        [leg("hi"), {"name": "wipe", "remove": {"paths": ["../outside/victim"], "also_under": [str(outside)]}}],
    )
    proc = engine("run", str(spec), "--run-dir", "r2", cwd=work)
    no_traceback(proc)
    assert evidence(work / "r2")["steps"]["wipe"]["status"] == "ok" and not (outside / "victim").exists()


@pytest.mark.parametrize("target", [".git", "specs", ".", "specs/s.yaml"])
def test_remove_of_the_checkout_or_its_specs_is_refused_naming_the_value(tmp_path, target):
    """`--set train_out=.git` turns a wipe into `rm -rf .git`: refused, naming the value, even where the
    step allows the working tree (`also_under`), and the run fails."""
    checkout = tmp_path / "checkout"
    (checkout / ".git" / "objects").mkdir(parents=True)
    (checkout / "specs").mkdir()
    wipe = {"name": "wipe", "remove": {"paths": ["${train_out}"], "also_under": ["${work_dir}"]}}
    spec = write_spec(checkout / "specs" / "s.yaml", [leg("hi"), wipe], values={"train_out": "${run_dir}/train"})
    proc = engine("run", str(spec), "--run-dir", str(tmp_path / "r"), "--set", f"train_out={target}", cwd=checkout)
    no_traceback(proc)
    assert proc.returncode == 5, proc.stdout + proc.stderr
    error = evidence(tmp_path / "r")["steps"]["wipe"]["error"]
    assert error.startswith(f"refusing to remove {os.path.abspath(checkout / target)} (from `${{train_out}}`: ")
    assert f'train_out = "{target}" (given by --set))' in error
    assert (checkout / ".git" / "objects").is_dir() and (checkout / "specs" / "s.yaml").is_file()


def test_remove_still_takes_what_the_run_dir_holds_and_a_declared_scratch_root(tmp_path):
    scratch = tmp_path / "scratch"
    (scratch / "old").mkdir(parents=True)
    wipe = {
        "name": "wipe",
        "remove": {"paths": ["${run_dir}/train", str(scratch / "old")], "also_under": [str(scratch)]},
    }
    spec = write_spec(tmp_path / "s.yaml", [leg("@append:${run_dir}/train:x"), wipe])
    proc = engine("run", str(spec), "--run-dir", "r", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert evidence(tmp_path / "r")["steps"]["wipe"]["removed"] == [str(tmp_path / "r" / "train"), str(scratch / "old")]


def test_control_characters_from_a_leg_reach_neither_the_terminal_nor_the_junit(tmp_path):
    nasty = "\x1b]0;pwned\x07\x1b[2J\x1b]52;c;ZXZpbA==\x07\x00\x08\x9b"
    code = f"import sys; print('KEY> ' + {nasty!r}); print('Error ' + {nasty!r}); sys.exit(1)"
    spec = write_spec(
        tmp_path / "s.yaml",
        [
            {
                "name": "leg",
                "run": {"argv": ["${python}", "-c", code], "timeout_s": 60, "output": {"echo_prefixes": ["KEY>"]}},
            }
        ],
    )
    proc = engine("run", str(spec), "--run-dir", "r", "--junit", "j.xml", cwd=tmp_path)
    no_traceback(proc)
    assert proc.returncode == 5 and "KEY> \\x1b]0;pwned\\x07" in proc.stdout
    assert not any(c in proc.stdout + proc.stderr for c in "\x1b\x07\x00\x08\x9b")
    failure = ET.parse(tmp_path / "j.xml").getroot().find("testcase/failure")
    assert failure is not None and "Error ]0;pwned" in failure.text


BIDI = "\u202e\u2066\u200f\u061c"  # right-to-left override, left-to-right isolate, RTL mark, Arabic mark


def test_bidirectional_controls_from_a_spec_or_a_leg_reach_every_report_escaped(tmp_path):
    code = f"import sys; print('Error ' + {BIDI!r} + 'yrros'); sys.exit(1)"
    check = {"name": "ok", "why": f"passes {BIDI}", "expr": f"steps.leg.rc == `0` && 'a{BIDI}b' != ''"}
    steps = [{"name": "leg", "run": {"argv": ["${python}", "-c", code], "timeout_s": 60}}]
    old = write_spec(tmp_path / "old.yaml", steps)
    new = write_spec(tmp_path / "new.yaml", steps, checks=[check])
    reports = ("--junit", "j.xml", "--markdown", "m.md", "--html", "h.html")
    run = engine("run", str(new), "--run-dir", "r", *reports, cwd=tmp_path)
    check_md = engine("check", str(new), "--evidence", "r", "--markdown", "-", cwd=tmp_path)
    diff = engine("diff", str(old), str(new), "--markdown", "d.md", cwd=tmp_path)
    assert (run.returncode, check_md.returncode, diff.returncode) == (5, 5, 1)
    shown = {
        "terminal": run.stdout + run.stderr,
        "check --markdown -": check_md.stdout,
        "diff": diff.stdout,
        **{name: (tmp_path / name).read_text(encoding="utf-8") for name in ("j.xml", "m.md", "h.html", "d.md")},
    }
    for where, text in shown.items():
        assert not any(c in text for c in BIDI), where
        assert "\\u202e\\u2066\\u200f\\u061c" in text, where
    failure = ET.parse(tmp_path / "j.xml").getroot().find("testcase/failure")
    assert failure is not None and "Error \\u202e\\u2066\\u200f\\u061cyrros" in failure.text


def test_an_existing_non_empty_run_dir_is_refused_without_force(tmp_path):
    spec = write_spec(tmp_path / "s.yaml", [leg("hi")])
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "precious.txt").write_text("keep me")
    proc = engine("run", str(spec), "--run-dir", "r", cwd=tmp_path)
    no_traceback(proc)
    assert proc.returncode == 2 and "exists and is not empty (precious.txt)" in proc.stderr
    assert not (tmp_path / "r" / "evidence.json").exists()
    proc = engine("run", str(spec), "--run-dir", "r", "--force", cwd=tmp_path)
    assert proc.returncode == 0 and (tmp_path / "r" / "precious.txt").read_text() == "keep me"


# ------------------------------------------------------------------ under real torchrun

RANKS = str(Path(__file__).parents[1] / "legs" / "ranks.py")


def torchrun_leg(*args: str, timeout_s: int = 120) -> dict:
    return {
        "name": "leg",
        "run": {
            "argv": [
                "${python}",
                "-m",
                "torch.distributed.run",
                "--nproc_per_node=2",
                "--redirects",
                "3",
                "--tee",
                "3",
                "--log-dir",
                "${run_dir}/tlogs",
                RANKS,
                *args,
            ],
            "timeout_s": timeout_s,
            "grace_s": 5,
            "env": {"OMP_NUM_THREADS": "1"},
            "output": {"strip_prefix": r"^\[(?:default|rank|worker)\d*\]:\s*"},
            "on_failure": {"diagnostics": {"dir": "${run_dir}/tlogs"}},
        },
    }


@pytest.mark.slow
def test_a_failing_torchrun_leg_leaves_its_token_in_no_file_and_no_output(tmp_path):
    spec = write_spec(tmp_path / "s.yaml", [torchrun_leg("leak")])
    proc = engine_process(
        "run",
        str(spec),
        "--run-dir",
        "r",
        "--junit",
        "j.xml",
        "--markdown",
        "m.md",
        cwd=tmp_path,
        timeout=300,
        env={"HF_TOKEN": TOKEN},
    )
    # The ranks' tracebacks are in the report; the engine's own would be on stderr.
    assert "Traceback" not in proc.stderr and proc.stdout.splitlines()[-1].startswith("VERDICT hostile FAIL")
    assert proc.returncode == 5, proc.stdout[-3000:]
    run = tmp_path / "r"
    ranks_logs = [p for p in (run / "tlogs").rglob("*") if p.is_file()]
    assert len(ranks_logs) >= 4  # stdout/stderr of both ranks, at least
    masked = evidence(run)["steps"]["leg"]["secrets_masked_in"]
    assert any(p.endswith("stdout.log") for p in masked) and any("error.json" in p for p in masked)
    half = len(TOKEN) // 2
    for needle in (TOKEN, TOKEN[:half], TOKEN[half:]):
        assert files_holding(tmp_path, needle.encode()) == [], needle
        assert needle not in proc.stdout + proc.stderr
    assert "<redacted>" in (run / "logs" / "leg.log").read_text()


@pytest.mark.slow
def test_sigkill_of_the_engine_takes_torchrun_and_its_ranks_with_it(tmp_path):
    pids = tmp_path / "pids"
    pids.mkdir()
    spec = write_spec(tmp_path / "s.yaml", [torchrun_leg("sleep", str(pids), timeout_s=600)])
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        ENGINE + ["run", str(spec), "--run-dir", "r"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    ranks = [pid_in(pids / "rank0.pid", 120), pid_in(pids / "rank1.pid", 120)]
    try:
        import psutil

        agent = psutil.Process(ranks[0]).parent()
        victims = ranks + ([agent.pid] if agent is not None and agent.pid != proc.pid else [])
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        assert all_gone(victims, timeout=20) == []
    finally:
        for pid in ranks:
            if not gone(pid):
                os.kill(pid, signal.SIGKILL)
