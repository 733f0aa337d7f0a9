"""engine/run/process.py: one command in its own process group, with real subprocesses."""

from __future__ import annotations

import os
import re
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from processes import descendants, gone, group_gone, patience, pid_in, wait_until

from engine.run.lines import Block
from engine.run.process import Interrupted, compile_signal_rules, parse_signal, run_command
from engine.run.reaper import Reaper
from engine.secrets import Scrubber

LEG = str(Path(__file__).parents[1] / "legs" / "leg.py")


def leg(*actions: str) -> list[str]:
    return [sys.executable, LEG, *actions]


@pytest.fixture(autouse=True)
def leaves_no_process() -> Iterator[None]:
    """Nothing a test here started outlives it, judged on this process's own descendants (the engine's
    reaper aside: it lives as long as the engine does)."""
    before = set(descendants(os.getpid()))
    yield

    def new() -> set[int]:
        reaper = Reaper._instance
        return set(descendants(os.getpid())) - before - {reaper.proc.pid if reaper else -1}

    wait_until(lambda: not new(), 5, "processes the test started are all gone")


def collect_lines() -> tuple[list[tuple[int, str]], callable]:
    got: list[tuple[int, str]] = []

    def on_block(block: Block) -> None:
        got.extend((block.first_lineno + i, line) for i, line in enumerate(block.lines))

    return got, on_block


def test_lines_stream_to_log_and_callback_with_numbers(tmp_path: Path) -> None:
    got, on_block = collect_lines()
    log = tmp_path / "logs" / "a.log"
    result = run_command(leg("one", "@stderr:two", "three", "@rc:3"), log_path=log, on_block=on_block, timeout_s=30)
    assert result.rc == 3
    assert result.lines == 3 and not result.timed_out and result.terminated_by is None
    assert got == [(1, "one"), (2, "two"), (3, "three")]
    assert log.read_text() == "one\ntwo\nthree\n"


def test_env_is_merged_over_environ_and_cwd_applies(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("SPECPROBE_OUTER", "outer")
    got, on_block = collect_lines()
    run_command(
        [
            sys.executable,
            "-c",
            "import os; print(os.environ['SPECPROBE_OUTER'], os.environ['SPECPROBE_INNER'], os.getcwd())",
        ],
        env={"SPECPROBE_INNER": "inner"},
        cwd=tmp_path,
        on_block=on_block,
    )
    assert got == [(1, f"outer inner {tmp_path}")]


def test_invalid_utf8_is_replaced_and_last_line_without_newline_kept(tmp_path: Path) -> None:
    got, on_block = collect_lines()
    result = run_command(leg("@raw:6f6bff0a6e6f2d6e6c"), on_block=on_block)
    assert result.rc == 0
    assert [line for _, line in got] == ["ok\ufffd", "no-nl"]


def test_missing_executable_is_rc_127_with_a_message(tmp_path: Path) -> None:
    result = run_command(["/nonexistent/specprobe-tool", "x"], log_path=tmp_path / "x.log")
    assert result.rc == 127
    assert "/nonexistent/specprobe-tool" in result.error
    assert "specprobe-tool" in (tmp_path / "x.log").read_text()


def test_timeout_sends_term_to_group(tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    timeout = patience(1.0)  # the leg is up and printing before it passes
    result = run_command(leg(f"@pidfile:{pidfile}", "started", "@forever"), timeout_s=timeout, grace_s=5)
    assert result.timed_out is True and result.terminated_by == "timeout"
    assert result.rc == -signal.SIGTERM
    assert timeout <= result.seconds < timeout + patience(3.0)
    assert group_gone(pid_in(pidfile))


def test_leg_ignoring_sigterm_is_killed_after_grace(tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    timeout = patience(0.5)  # the leg ignores SIGTERM before it passes
    result = run_command(leg("@ignore_term", f"@pidfile:{pidfile}", "@forever"), timeout_s=timeout, grace_s=1.0)
    assert result.timed_out and result.rc == -signal.SIGKILL
    assert timeout + 1.0 <= result.seconds < timeout + patience(3.5)
    assert group_gone(pid_in(pidfile))


def test_leg_that_exits_leaves_no_orphans(tmp_path: Path) -> None:
    """A grandchild still sleeping in the group when the leader exits is killed too."""
    pidfile, child = tmp_path / "pid", tmp_path / "child"
    result = run_command(leg(f"@pidfile:{pidfile}", f"@spawn:{child}", "leader done"), timeout_s=30)
    assert result.rc == 0 and result.seconds < patience(5)
    assert group_gone(pid_in(pidfile)) and gone(pid_in(child))


def test_leg_killed_after_grace_leaves_no_orphans(tmp_path: Path) -> None:
    pidfile, child = tmp_path / "pid", tmp_path / "child"
    result = run_command(
        leg("@ignore_term", f"@pidfile:{pidfile}", f"@spawn:{child}", "@forever"), timeout_s=patience(0.5), grace_s=0.5
    )
    assert result.timed_out and result.rc == -signal.SIGKILL
    assert group_gone(pid_in(pidfile)) and gone(pid_in(child))


def test_grandchild_escaping_the_group_with_the_pipe_cannot_hang_the_drain(tmp_path: Path) -> None:
    # setsid puts the sleeper outside the leg's group; it inherits the pipe. The bounded drain
    # gives up on it instead of waiting 300 s for EOF.
    code = (
        "import subprocess, sys; p = subprocess.Popen(['setsid', 'sleep', '30']); "
        "open(sys.argv[1], 'w').write(str(p.pid)); print('bye')"
    )
    escaped = tmp_path / "escaped"
    started = time.monotonic()
    result = run_command([sys.executable, "-c", code, str(escaped)], drain_s=0.5)
    try:
        assert result.rc == 0 and result.lines == 1
        assert time.monotonic() - started < patience(5)
    finally:
        try:  # on Linux the leg's supervisor has taken it down already
            os.kill(int(escaped.read_text()), signal.SIGKILL)
        except ProcessLookupError:
            pass


def _launcher_code() -> str:
    # What torchrun does: each worker in a session of its own, the launcher waiting on them.
    return (
        "import subprocess, sys, time; "
        "w = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], "
        "start_new_session=True); "
        "open(sys.argv[1], 'w').write(str(w.pid)); print('workers up', flush=True); w.wait()"
    )


@pytest.mark.parametrize("how", ["timeout", "signal_rule"])
def test_workers_in_their_own_session_die_with_the_leg(tmp_path: Path, how: str) -> None:
    # A process-group kill alone left torchrun's ranks training (and pushing) after the leg ended.
    worker = tmp_path / "worker"
    kwargs = (
        {"timeout_s": patience(1.5), "grace_s": 1}
        if how == "timeout"
        else {
            "timeout_s": 30,
            "signals": compile_signal_rules([{"match": "^workers up", "signal": "SIGKILL", "after_s": 0.7}]),
        }
    )
    result = run_command([sys.executable, "-c", _launcher_code(), str(worker)], **kwargs)
    assert result.terminated_by == how
    assert gone(pid_in(worker)), "a worker outside the leg's process group survived the leg"


def test_signal_rule_kills_the_leg_when_the_line_appears(tmp_path: Path) -> None:
    rules = compile_signal_rules([{"match": "^CKPT push step=10 ", "signal": "SIGKILL", "after_s": 0}])
    got, collect = collect_lines()
    seen = tmp_path / "seen"

    def on_block(block: Block) -> None:
        # Once the engine has read the line, the leg may go on: only a kill at that line stops the next one.
        collect(block)
        if any(line.startswith("CKPT push") for _, line in got):
            seen.touch()

    result = run_command(
        leg("step 9", "[default0]: CKPT push step=10 -> ckpt", f"@await:{seen}", "never printed", "@forever"),
        signals=rules,
        strip_prefix=re.compile(r"^\[default\d*\]:\s*"),
        on_block=on_block,
        timeout_s=30,
    )
    assert result.terminated_by == "signal_rule"
    assert result.rc == -signal.SIGKILL and not result.timed_out
    assert [s["signal"] for s in result.signals_sent] == ["SIGKILL"]
    assert result.signals_sent[0]["line"] == 2
    assert (2, "CKPT push step=10 -> ckpt") in got
    assert all(line != "never printed" for _, line in got)


def test_signal_rule_with_delay_fires_once_after_the_delay(tmp_path: Path) -> None:
    rules = compile_signal_rules([{"match": "go", "signal": "TERM", "after_s": 0.5}])
    result = run_command(leg("go", "go", "go", "@forever"), signals=rules, timeout_s=30)
    assert result.terminated_by == "signal_rule" and result.rc == -signal.SIGTERM
    assert len(result.signals_sent) == 1
    assert result.signals_sent[0]["line"] == 1 and result.signals_sent[0]["at_s"] >= 0.5


def test_signal_names_resolve_and_bad_ones_are_named() -> None:
    assert parse_signal("KILL") is signal.SIGKILL
    assert parse_signal("SIGUSR1") is signal.SIGUSR1
    assert parse_signal("15") is signal.SIGTERM
    with pytest.raises(ValueError, match="SIGNOPE"):
        parse_signal("SIGNOPE")
    with pytest.raises(ValueError, match=r"signals\[0\]\.match"):
        compile_signal_rules([{"match": "(", "signal": "KILL"}])


def test_ctrl_c_terminates_the_group_and_raises_with_the_result(tmp_path: Path) -> None:
    pidfile, child = tmp_path / "pid", tmp_path / "child"
    main = threading.get_ident()

    def interrupt_soon() -> None:
        pid_in(child)
        signal.pthread_kill(main, signal.SIGINT)

    threading.Thread(target=interrupt_soon, daemon=True).start()
    with pytest.raises(Interrupted) as caught:
        run_command(leg(f"@pidfile:{pidfile}", f"@spawn:{child}", "@forever"), timeout_s=60, grace_s=5)
    assert isinstance(caught.value, KeyboardInterrupt)
    assert caught.value.result.terminated_by == "interrupt"
    assert caught.value.result.rc == -signal.SIGTERM
    assert group_gone(pid_in(pidfile)) and gone(pid_in(child))


def test_on_tick_is_called_while_the_leg_runs(tmp_path: Path) -> None:
    ticks: list[float] = []
    enough = tmp_path / "three-ticks"

    def on_tick(elapsed: float) -> None:
        ticks.append(elapsed)
        if len(ticks) == 3:
            enough.touch()  # the leg ends once it was watched three times

    result = run_command(leg(f"@await:{enough}"), on_tick=on_tick, timeout_s=60)
    assert result.rc == 0 and len(ticks) >= 3 and ticks == sorted(ticks)


def test_scrub_applies_before_the_log_and_the_callback(tmp_path: Path) -> None:
    got, on_block = collect_lines()
    run_command(
        leg("token=hf_FAKE_SECRET_123"),
        log_path=tmp_path / "s.log",
        on_block=on_block,
        scrub=Scrubber(["hf_FAKE_SECRET_123"]),
    )
    assert got == [(1, "token=<redacted>")]
    assert (tmp_path / "s.log").read_text() == "token=<redacted>\n"


def test_many_lines_are_counted_and_logged_whole(tmp_path: Path) -> None:
    log = tmp_path / "big.log"
    count = [0]

    def on_block(block: Block) -> None:
        count[0] += len(block.lines)

    result = run_command(
        leg("@repeat:200000:line {i}"), log_path=log, on_block=on_block, strip_prefix=re.compile(r"^\[rank\d\]: ")
    )
    assert result.lines == 200000 == count[0]
    with open(log) as fh:
        assert sum(1 for _ in fh) == 200000


def test_required_literal_is_what_every_match_contains() -> None:
    from engine.run.lines import required_literal

    assert required_literal(re.compile(r"^step (?P<step>\d+)/(?P<total>\d+)")) == "step "
    assert required_literal(re.compile(r"^CKPT push step=10 ")) == "CKPT push step=10 "
    assert required_literal(re.compile(r"ab*c")) == "a"
    assert required_literal(re.compile(r"a|bc")) is None
    assert required_literal(re.compile(r"(?i)traceback")) is None


def test_block_finds_lines_after_the_prefix_is_stripped() -> None:
    tee = re.compile(r"^\[default\d\]:\s*")
    block = Block("[default0]: CKPT a\nplain\n[default1]: x CKPT b\n[default0]: CKPT c", 4, 11, tee)
    assert list(block.find_lines(["CKPT", "plain"])) == [
        (11, "CKPT a"),
        (12, "plain"),
        (13, "x CKPT b"),
        (14, "CKPT c"),
    ]
    assert list(block.find_last_line("CKPT")) == [(14, "CKPT c"), (13, "x CKPT b"), (11, "CKPT a")]
    assert block.tail(2) == ["x CKPT b", "CKPT c"]
    assert block.lines == ["CKPT a", "plain", "x CKPT b", "CKPT c"]


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.sampled_from(["", "step 3/9", "[rank0]: step 4/9", "CKPT push", "xstep 1/2", "[rank1]: noise", "step x/9"]),
        min_size=1,
        max_size=30,
    ),
    st.sampled_from([r"^step (?P<s>\d+)/", r"step \d", r"^\[rank\d\]", r"push$", r"\d/9$"]),
    st.booleans(),
)
def test_line_matcher_agrees_with_a_plain_per_line_scan(lines: list[str], regex: str, strip: bool) -> None:
    from engine.run.lines import LineMatcher

    tee = re.compile(r"^\[rank\d\]:\s*") if strip else None
    block = Block("\n".join(lines), len(lines), 5, tee)
    stripped = [tee.sub("", line, count=1) if tee else line for line in lines]
    pattern = re.compile(regex)
    naive = [(5 + i, line) for i, line in enumerate(stripped) if pattern.search(line)]
    matcher = LineMatcher(pattern)
    assert matcher.first(block) == (naive[0] if naive else None)
    last = matcher.last(block)
    assert ((last[0], last[1].string) if last else None) == (naive[-1] if naive else None)


def test_engine_cpu_per_line_stays_well_below_the_legs_own(tmp_path: Path) -> None:
    """The reader must keep up with a chatty leg on another core: its CPU per line (with the
    DESIGN's full rule set) stays a fraction of what the printing leg itself spends."""
    import resource

    from engine.run.output import Capture, compile_rules

    run = {
        "output": {
            "strip_prefix": r"^\[(?:default|rank|worker)\d*\]:\s*",
            "echo_prefixes": ["CKPT ", "RUN_JSON ", "resume from"],
            "harvest": {"run_json": {"marker": "RUN_JSON ", "pick": "last"}},
            "failure_patterns": ["Traceback", "Error", "[rank"],
        },
        "progress": {"match": r"^step (?P<step>\d+)/(?P<total>\d+)", "every_s": 30},
    }
    rules = compile_rules(run)
    capture = Capture(rules)
    before, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    result = run_command(
        leg("@repeat:300000:[default0]: step {i}/300000 loss 5.1 lr 3e-04"),
        on_block=capture.feed,
        strip_prefix=rules.strip_prefix,
        log_path=tmp_path / "big.log",
        signals=compile_signal_rules([{"match": "^CKPT push step=10 ", "signal": "KILL"}]),
    )
    after, kids_after = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    ours = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    theirs = (kids_after.ru_utime - kids.ru_utime) + (kids_after.ru_stime - kids.ru_stime)
    assert result.lines == 300000 and capture.progress.step == 299999
    print(f"engine cpu {ours:.3f} s, leg cpu {theirs:.3f} s")
    assert ours < 0.6 * theirs, (ours, theirs)


def test_missing_working_directory_is_named(tmp_path: Path) -> None:
    result = run_command(leg("x"), cwd=tmp_path / "gone")
    assert result.rc == 127 and f"{tmp_path / 'gone'}: No such file" in result.error


def test_a_ctrl_c_while_the_watch_is_set_up_still_ends_the_leg(tmp_path, monkeypatch):
    """The interrupt lands after the leg started, before the engine watches it (its process tree is read
    for the first time): run_command must still end the leg and say it was interrupted."""
    from engine.run import proctree

    pidfile = tmp_path / "pid"
    real_refresh = proctree.ProcessTree.refresh
    calls = []

    def interrupted_refresh(self):
        calls.append(1)
        if len(calls) == 1:
            pid_in(pidfile)  # the leg is running for sure
            raise KeyboardInterrupt
        return real_refresh(self)

    monkeypatch.setattr(proctree.ProcessTree, "refresh", interrupted_refresh)
    with pytest.raises(Interrupted) as caught:
        run_command([sys.executable, LEG, f"@pidfile:{pidfile}", "@forever"], timeout_s=60, grace_s=5)
    assert caught.value.result.terminated_by == "interrupt"
    assert group_gone(pid_in(pidfile))
