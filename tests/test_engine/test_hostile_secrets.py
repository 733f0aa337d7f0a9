"""No piece of a secret leaks from a run: not across a line cut or a tee header, not in an encoded form, not in
a report, a log a later leg wrote, a hard-linked file, or the per-rank logs of a failing torchrun leg."""

from __future__ import annotations

import json
import sys

import pytest
from engine_helpers import (
    LEG,
    ROOT,
    TOKEN,
    evidence_of,
    files_holding,
    leg,
    mask,
    no_traceback,
    python_leg,
    torchrun_leg,
    write_spec,
)

from engine import limits
from engine.secrets import Scrubber
from engine.spec.values import layer, parse_sets


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
def test_a_secret_split_by_a_tee_header_leaks_no_piece_of_eight_characters(engine, tmp_path, at):
    # torchrun's --tee copies a line the rank is still writing: the part written so far, then the
    # rest, each with its own "[default0]:" header, so the header lands inside the token.
    spec = write_spec(
        tmp_path / "s.yaml",
        [leg(f"@tee_split:HF_TOKEN:{at}:${{run_dir}}/rank0.log", "@rc:1", output={"strip_prefix": r"^\[default\d\]:"})],
    )
    proc = engine("run", str(spec), "--run-dir", "r", "--junit", "j.xml", cwd=tmp_path, env={"HF_TOKEN": TOKEN})
    no_traceback(proc)
    assert proc.code == 5
    shown = proc.out + proc.err
    for needle in (TOKEN[:at], TOKEN[at:]):
        assert files_holding(tmp_path, needle.encode()) == [], needle
        assert needle not in shown
    log = (tmp_path / "r" / "logs" / "leg.log").read_text()
    assert log == "[default0]:logging in with <redacted>[default0]:<redacted> as the rank\n"
    masked = (tmp_path / "r" / "rank0.log").read_text()
    assert masked == f"[default0]:logging in with {mask(at)}[default0]:{mask(len(TOKEN) - at)} as the rank\n"


ODD_SECRET = 'Pa"ss\\wörd'


def test_a_secret_with_a_quote_a_backslash_and_an_umlaut_leaks_in_no_encoded_form(engine, tmp_path):
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
        [python_leg(code, "${run_dir}")],
    )
    proc = engine(
        "run",
        str(spec),
        *"--run-dir r --junit j.xml --markdown m.md --html h.html".split(),
        cwd=tmp_path,
        env={"DB_PASSWORD": ODD_SECRET},
    )
    no_traceback(proc)
    assert proc.code == 5
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
        assert form not in proc.out + proc.err, how
    failure_lines = evidence_of(tmp_path / "r")["steps"]["leg"]["failure_lines"]
    assert failure_lines[0] == 'Error json {"p": "<redacted>"} {"p": "<redacted>"}'
    assert evidence_of(tmp_path / "r")["steps"]["leg"]["secrets_masked_in"] == ["error.json"]


def test_a_value_the_spec_feeds_from_a_secret_variable_is_shown_redacted(engine, tmp_path):
    # `env: {GITHUB_TOKEN: repo}`: the value's name does not look secret, its text is the token.
    spec = write_spec(tmp_path / "s.yaml", [leg("${repo}")], values={"repo": "none"}, env={"GITHUB_TOKEN": "repo"})
    plan = engine("plan", str(spec), cwd=tmp_path, env={"GITHUB_TOKEN": TOKEN})
    run = engine("run", str(spec), "--run-dir", "r", cwd=tmp_path, env={"GITHUB_TOKEN": TOKEN})
    verbose = engine("run", str(spec), "--run-dir", "r2", "-v", cwd=tmp_path, env={"GITHUB_TOKEN": TOKEN})
    assert (plan.code, run.code, verbose.code) == (0, 0, 0)
    for shown in (plan.out, verbose.out):
        assert TOKEN not in shown and 'repo = "<redacted>" [env]' in " ".join(shown.split())
    assert TOKEN not in run.out and 'repo="<redacted>" (env GITHUB_TOKEN)' in run.out
    assert evidence_of(tmp_path / "r")["values"]["repo"] == "<redacted>"


def test_the_reports_of_a_run_show_a_secret_in_a_step_error_redacted(engine, tmp_path):
    spec = write_spec(
        tmp_path / "s.yaml",
        [{"name": "wipe", "remove": ["/etc/${api_token}"]}],
        checks=[{"name": "c", "why": "w", "expr": "steps.wipe.status == 'ok'"}],
        values={"api_token": TOKEN},
    )
    proc = engine("run", str(spec), *"--run-dir r --junit j.xml --markdown m.md --html h.html".split(), cwd=tmp_path)
    no_traceback(proc)
    assert proc.code == 5 and "refusing to remove /etc/<redacted>" in proc.out
    assert TOKEN not in proc.out + proc.err
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
def test_no_file_under_the_run_dir_holds_a_secret_after_a_passing_or_failing_run(engine, tmp_path, rc):
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
    assert proc.code == (0 if rc == 0 else 5)
    for secret in (TOKEN, "0123456789abc"):
        assert files_holding(tmp_path / "r", secret.encode()) == []
        assert secret not in proc.out + proc.err
    blob = (tmp_path / "r" / "tlogs" / "attempt_0" / "blob.bin").read_bytes()
    assert len(blob) == 5000 + len(TOKEN) + 1  # masked in place: the file keeps its layout
    assert "tlogs/attempt_0/env.log" in evidence_of(tmp_path / "r")["steps"]["leg"]["secrets_masked_in"]


def test_masking_a_hard_linked_file_leaves_the_file_outside_the_run_dir_as_it_was(engine, tmp_path):
    outside = tmp_path / "credentials.txt"
    outside.write_text(f"token = {TOKEN}\n")
    code = f"import os, sys; os.link({str(outside)!r}, os.path.join(sys.argv[1], 'linked.txt'))"
    spec = write_spec(
        tmp_path / "s.yaml",
        [python_leg(code, "${run_dir}")],
    )
    proc = engine("run", str(spec), "--run-dir", "r", cwd=tmp_path, env={"HF_TOKEN": TOKEN})
    no_traceback(proc)
    assert proc.code == 0
    assert outside.read_text() == f"token = {TOKEN}\n"  # not the engine's to change
    linked = tmp_path / "r" / "linked.txt"
    assert linked.read_text() == f"token = {mask(len(TOKEN))}\n" and linked.stat().st_nlink == 1
    assert evidence_of(tmp_path / "r")["steps"]["leg"]["secrets_masked_in"] == ["linked.txt"]


def test_a_file_rewritten_with_a_secret_and_its_times_put_back_is_masked(engine, tmp_path):
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
    steps = [python_leg(code, "${run_dir}", name, name=name) for name in ("clean", "dirty")]
    spec = write_spec(tmp_path / "s.yaml", steps, checks=[{"name": "ran", "why": "w", "expr": "steps.dirty.rc == `0`"}])
    proc = engine("run", str(spec), "--run-dir", "r", cwd=tmp_path, env={"HF_TOKEN": TOKEN})
    no_traceback(proc)
    assert proc.code == 0
    assert (tmp_path / "r" / "rank.log").read_text() == mask(len(TOKEN)) + "x" * (100 - len(TOKEN))
    assert evidence_of(tmp_path / "r")["steps"]["dirty"]["secrets_masked_in"] == ["rank.log"]


def test_a_symlink_a_leg_left_at_a_later_steps_log_name_is_replaced_not_written_through(engine, tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me\n")
    code = f"import os, sys; os.symlink({str(victim)!r}, os.path.join(sys.argv[1], 'logs', 'second.log'))"
    steps = [
        python_leg(code, "${run_dir}", name="first"),
        {"name": "second", "run": {"argv": ["${python}", LEG, "the second leg's output"], "timeout_s": 60}},
    ]
    spec = write_spec(
        tmp_path / "s.yaml", steps, checks=[{"name": "ran", "why": "w", "expr": "steps.second.rc == `0`"}]
    )
    proc = engine("run", str(spec), "--run-dir", "r", cwd=tmp_path)
    no_traceback(proc)
    assert proc.code == 0
    assert victim.read_text() == "keep me\n"
    log = tmp_path / "r" / "logs" / "second.log"
    assert not log.is_symlink() and log.read_text() == "the second leg's output\n"


def test_a_secret_across_the_diagnostics_line_cut_leaves_no_piece(engine, tmp_path):
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
    (tail,) = evidence_of(tmp_path / "r")["steps"]["leg"]["diagnostics"]["files"][0]["tail"]
    assert tail.startswith("x" * at + "<reda") and TOKEN[:5] not in tail
    assert TOKEN[:5] not in proc.out


def test_a_secret_a_later_leg_writes_into_an_earlier_steps_log_is_masked(engine, tmp_path):
    # The engine vouches for the logs it wrote through the filter by their SHA-256, not by name.
    code = "import os, sys; open(os.path.join(sys.argv[1], 'logs', 'first.log'), 'a').write(os.environ['HF_TOKEN'])"
    steps = [
        {"name": "first", "run": {"argv": ["${python}", LEG, "the first leg"], "timeout_s": 60}},
        python_leg(code, "${run_dir}", name="second"),
    ]
    spec = write_spec(
        tmp_path / "s.yaml", steps, checks=[{"name": "ran", "why": "w", "expr": "steps.second.rc == `0`"}]
    )
    proc = engine("run", str(spec), "--run-dir", "r", cwd=tmp_path, env={"HF_TOKEN": TOKEN})
    no_traceback(proc)
    assert proc.code == 0
    assert (tmp_path / "r" / "logs" / "first.log").read_text() == "the first leg\n" + mask(len(TOKEN))
    assert evidence_of(tmp_path / "r")["steps"]["second"]["secrets_masked_in"] == ["logs/first.log"]


@pytest.mark.slow
def test_a_failing_torchrun_leg_leaves_its_token_in_no_file_and_no_output(engine_process, tmp_path):
    spec = write_spec(tmp_path / "s.yaml", [torchrun_leg("leak")])
    proc = engine_process(
        "run",
        str(spec),
        *"--run-dir r --junit j.xml --markdown m.md".split(),
        cwd=tmp_path,
        timeout=300,
        env={"HF_TOKEN": TOKEN},
    )
    # The ranks' tracebacks are in the report; the engine's own would be on stderr.
    assert "Traceback" not in proc.err and proc.out.splitlines()[-1].startswith("VERDICT probe FAIL")
    assert proc.code == 5, proc.out[-3000:]
    run = tmp_path / "r"
    ranks_logs = [p for p in (run / "tlogs").rglob("*") if p.is_file()]
    assert len(ranks_logs) >= 4  # stdout/stderr of both ranks, at least
    masked = evidence_of(run)["steps"]["leg"]["secrets_masked_in"]
    assert any(p.endswith("stdout.log") for p in masked) and any("error.json" in p for p in masked)
    half = len(TOKEN) // 2
    for needle in (TOKEN, TOKEN[:half], TOKEN[half:]):
        assert files_holding(tmp_path, needle.encode()) == [], needle
        assert needle not in proc.out + proc.err
    assert "<redacted>" in (run / "logs" / "leg.log").read_text()


def test_a_url_password_on_the_command_line_is_redacted_in_every_refusal(engine):
    # A URL with a password given to a value that is no secret, or to an option argparse refuses: the messages
    # that quote it show the URL, never the password.
    url = "https://bob:Pw9-NotShown@host.example/x"
    ran = engine("plan", str(ROOT / "specs" / "p4_smoke.yaml"), "--set", f"nproc={url}", expect=2)
    assert "https://bob:<redacted>@host.example/x" in ran.err and "Pw9-NotShown" not in ran.out + ran.err
    ran = engine("plan", str(ROOT / "specs" / "p4_smoke.yaml"), "--mode", url, expect=2)
    assert "unknown mode 'https://bob:<redacted>@host.example/x'" in ran.err
    ran = engine("plan", str(ROOT / "specs" / "p4_smoke.yaml"), "--no-such-option", url)
    assert ran.code == 2 and "<redacted>" in ran.err and "Pw9-NotShown" not in ran.out + ran.err
