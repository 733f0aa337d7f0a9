"""Hostile specs and legs are bounded: a catastrophic regex gives up, a range or integer bomb is refused, a
chain of includes or values is read once, output without end is cut and kept small; never a hang or a
blow-up of the engine."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from engine_helpers import (
    LEG,
    ROOT,
    evidence_of,
    leg,
    no_traceback,
    python_leg,
    write_spec,
)

from engine import limits
from engine.secrets import Scrubber


def test_a_catastrophic_strip_prefix_gives_up_and_fails_the_step_not_the_engine(engine_process, tmp_path):
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
    step = evidence_of(tmp_path / "r")["steps"]["leg"]
    assert step["timed_out"] and step["status"] == "failed"  # its own timeout still fired
    assert "output.strip_prefix '^(a|aa)+$' gave up" in step["error"]
    assert took < 60 and proc.code == 5


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
def test_a_catastrophic_regex_match_in_a_check_is_an_error_naming_the_pattern(engine_process, tmp_path, key):
    bomb = f"regex_match('{'a' * 64}!', '^(a|aa)+$')"
    check = {"name": "bomb", "why": "w", "expr": "steps.leg.rc == `0`"}
    check[key] = bomb
    spec = write_spec(tmp_path / "s.yaml", [leg("hi")], checks=[check])
    proc = engine_process("run", str(spec), "--run-dir", "r", cwd=tmp_path, timeout=90)
    no_traceback(proc)
    result = evidence_of(tmp_path / "r")["checks"][0]
    assert result["outcome"] == "ERROR" and "gave up after 1 s" in result["reason"]


def test_range_bombs_are_refused_with_the_expression_named(engine, tmp_path):
    # 2,000 x 1,000 elements: each call is small, together they are twice the limit.
    bomb = "length(map(&range(`0`, `1000`), range(`0`, `2000`)))"
    spec = write_spec(tmp_path / "s.yaml", [leg("hi")], values={"n": {"eval": bomb}})
    proc = engine("plan", str(spec), cwd=tmp_path)
    no_traceback(proc)
    assert proc.code == 2 and "$.values.n.eval" in proc.err and "range() would make" in proc.err
    spec = write_spec(tmp_path / "c.yaml", [leg("hi")], checks=[{"name": "bomb", "why": "w", "expr": bomb + " == `1`"}])
    proc = engine("run", str(spec), "--run-dir", "r", cwd=tmp_path)
    no_traceback(proc)
    result = evidence_of(tmp_path / "r")["checks"][0]
    assert result["outcome"] == "ERROR" and "limit 1,000,000 per expression" in result["reason"]


def test_huge_integers_from_arithmetic_are_refused():
    from engine.expr.functions import FunctionError, compile_expr, search

    expr = "mul(mul(mul(mul(x, x), mul(x, x)), mul(mul(x, x), mul(x, x))), x)"
    with pytest.raises(FunctionError, match="digits"):
        search(compile_expr(expr), {"x": 10**60})


def test_a_diamond_of_includes_22_deep_loads_each_file_once(engine_process, tmp_path):
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
    assert proc.code == 0, proc.out


@pytest.mark.parametrize("target", ["/dev/zero", "fifo", "dir"])
def test_extends_only_reads_regular_files(engine_process, tmp_path, target):
    if target == "fifo":
        os.mkfifo(tmp_path / "fifo")
    if target == "dir":
        (tmp_path / "dir").mkdir()
    (tmp_path / "s.yaml").write_text(f"extends: {target}\nversion: 1\nname: x\n")
    proc = engine_process("validate", "s.yaml", cwd=tmp_path, timeout=30)
    no_traceback(proc)
    assert proc.code == 2 and "not a regular file" in proc.out


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


def test_a_chain_of_500_values_is_an_error_not_a_recursion_crash(engine, tmp_path):
    values = {f"v{i}": f"${{v{i + 1}}}x" for i in range(499)}
    values["v499"] = "end"
    spec = write_spec(tmp_path / "s.yaml", [leg("hi")], values=values)
    proc = engine("plan", str(spec), cwd=tmp_path)
    no_traceback(proc)
    assert proc.code == 2 and "refer through more than 100 other values" in proc.err


def test_a_command_collector_printing_too_much_is_an_error_in_bounded_memory(engine, tmp_path):
    code = "import sys\nfor _ in range(40): sys.stdout.write('x' * (1 << 20) + '\\n')"
    spec = write_spec(
        tmp_path / "s.yaml",
        [leg("hi"), {"name": "st", "collect": {"collector": "command", "args": {"argv": ["${python}", "-c", code]}}}],
    )
    proc = engine("run", str(spec), "--run-dir", "r", cwd=tmp_path)
    no_traceback(proc)
    step = evidence_of(tmp_path / "r")["steps"]["st"]
    assert step["status"] == "failed" and "over the 16 MiB limit" in step["error"]


def test_output_without_newlines_is_cut_per_line_and_kept_small(engine, tmp_path):
    code = "import sys\nfor _ in range(50): sys.stdout.write('y' * (1 << 20))\nsys.exit(1)"
    spec = write_spec(tmp_path / "s.yaml", [python_leg(code)])
    proc = engine("run", str(spec), "--run-dir", "r", cwd=tmp_path)
    no_traceback(proc)
    assert (tmp_path / "r" / "evidence.json").stat().st_size < 200_000
    step = evidence_of(tmp_path / "r")["steps"]["leg"]
    assert step["lines"] == 1 and step["tail"][0].endswith("more characters]")
    log = (tmp_path / "r" / "logs" / "leg.log").read_text()
    assert len(log) < limits.LINE_MAX_CHARS + 100 and log.rstrip("\n").endswith(limits.CUT_MARKER)


def test_a_run_json_line_over_the_line_limit_says_so(engine, tmp_path):
    code = "print('RUN_JSON {\"pad\": \"' + 'z' * (3 << 20) + '\"}')"
    spec = write_spec(
        tmp_path / "s.yaml",
        [python_leg(code, output={"harvest": {"rj": {"marker": "RUN_JSON "}}})],
    )
    proc = engine("run", str(spec), "--run-dir", "r", cwd=tmp_path)
    no_traceback(proc)
    (error,) = evidence_of(tmp_path / "r")["steps"]["leg"]["harvest_errors"]
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
