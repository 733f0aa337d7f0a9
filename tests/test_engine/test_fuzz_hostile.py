"""Fuzzing the three ways hostile data reaches the engine (spec text, a leg's output, a saved
evidence file) through the real CLI and the real output pipeline: whatever arrives, the answer is
an exit code and a message, never a traceback. Derandomized and bounded (a few seconds each), so
CI sees the same examples every time."""

from __future__ import annotations

import io
import json
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest
import yaml
from engine_helpers import YAML_PIECES
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine import limits
from engine.cli import main
from engine.run.lines import Pattern
from engine.run.output import Capture, HarvestRule, OutputRules
from engine.run.process import run_command
from engine.secrets import Scrubber

SETTINGS = settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large],
)
SECRET = "hf_FUZZ_SECRET_0123456789"


@pytest.fixture(autouse=True)
def quick_regex_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    # Catastrophic patterns are among the inputs; their own tests wait out the real limit.
    monkeypatch.setattr(limits, "REGEX_TIMEOUT_S", 0.05)


def run_cli(*args: str) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        rc = main(list(args))  # an escaping exception is the failure this file looks for
    return rc, out.getvalue() + err.getvalue()


# ------------------------------------------------------------------ spec text

HOSTILE_TEXT = [
    *YAML_PIECES,
    "name: fuzz\n",
    "budget_s: 100\n",
    "extends: /dev/zero\n",
    "include: [s.yaml, s.yaml]\n",
    "    ",
    "name: a",
    "<<: *a",
    "${v}",
    "expr: ",
    "why: w",
    "when: ",
    "timeout_s: 5",
    "strip_prefix: '(a|aa)+$'",
    "regex_match('aaaaaaaaaaaaaaaaaaaaaaaaa!', '^(a|aa)+$')",
    "range(`0`, `99999999`)",
    "mul(`1" + "0" * 300 + "`, `1" + "0" * 300 + "`)",
    "[" * 200,
    "]" * 200,
    "(" * 300,
    ")" * 300,
    '"\\0"',
    '"a\\x1b[2J"',
    "1" * 5000,
    "\x00",
    "\ufeff",
    "\u202e",
    "é",
    "#c\n",
    "$${v}",
    "*b",
    "&b [*a, *a, *a, *a]",
    "~",
    "null",
    "1e999",
    "-.inf",
]

VALID = {
    "version": 1,
    "name": "fuzz",
    "budget_s": 1000,
    "values": {"n": 2, "v": {"eval": "mul(n, `3`)"}, "s": "${run_dir}/x-${n}"},
    "steps": [
        {
            "name": "leg",
            "run": {
                "argv": ["${python}", "-c", "pass"],
                "timeout_s": 5,
                "output": {"strip_prefix": "^x", "harvest": {"rj": {"marker": "RJ "}}},
            },
        },
        {"name": "wipe", "remove": ["${s}"]},
    ],
    "checks": [{"name": "c", "why": "w", "expr": "steps.leg.rc == `0`"}],
}
NASTY_VALUES = st.sampled_from(
    [
        "a\0b",
        "\x1b]0;title\x07",
        "(a|aa)+$",
        "regex_match('aaaaaaaaaaaaaaaaaaaaaaaa!', '^(a|aa)+$')",
        "length(map(&range(`0`, `1000`), range(`0`, `2000`)))",
        "(" * 2000 + "x" + ")" * 2000,
        "../../etc",
        "/proc/self/mem",
        "${v}${v}",
        10**4000,
        -1,
        1e308,
        "",
        "x" * 20_000,
        "\ud800".encode("utf-8", "surrogatepass").decode("utf-8", "replace"),
    ]
)
PATHS = [
    ("values", "n"),
    ("values", "v", "eval"),
    ("values", "s"),
    ("steps", 0, "run", "argv", 2),
    ("steps", 0, "run", "output", "strip_prefix"),
    ("steps", 0, "run", "timeout_s"),
    ("steps", 0, "when"),
    ("steps", 1, "remove", 0),
    ("checks", 0, "expr"),
    ("checks", 0, "when"),
    ("steps", 0, "run", "env"),
    ("name",),
]


def _set(doc: dict, path: tuple, value: object) -> None:
    node = doc
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value if path[-1] != "env" else {str(value)[:50] or "E": str(value)[:50]}


@SETTINGS
@given(st.lists(st.sampled_from(HOSTILE_TEXT), max_size=40))
def test_any_spec_text_validates_to_an_answer(tmp_path_factory, tokens):
    path = tmp_path_factory.mktemp("spec") / "s.yaml"
    path.write_text("".join(tokens), encoding="utf-8", errors="surrogatepass")
    rc, _ = run_cli("validate", str(path))
    assert rc in (0, 2)


@SETTINGS
@given(st.lists(st.tuples(st.sampled_from(PATHS), NASTY_VALUES), min_size=1, max_size=3))
def test_a_valid_spec_with_hostile_values_validates_and_plans_to_an_answer(tmp_path_factory, edits):
    doc = json.loads(json.dumps(VALID))
    for path, value in edits:
        _set(doc, path, value)
    path = tmp_path_factory.mktemp("spec") / "s.yaml"
    path.write_text(yaml.safe_dump(doc, allow_unicode=True, width=100_000), encoding="utf-8", errors="surrogatepass")
    rc, _ = run_cli("validate", str(path))
    assert rc in (0, 2)
    if rc == 0:
        rc, text = run_cli("plan", str(path))
        assert rc in (0, 2)
        assert "\x1b" not in text and "\x00" not in text


# ------------------------------------------------------------------ a leg's output

CHUNKS = st.one_of(
    st.binary(max_size=200),
    st.sampled_from(
        [
            b"\n",
            b"\r\n",
            b"\r",
            b"\xff\xfe",
            b"\xe2\x82",
            b"\x1b[2J",
            b"\x00",
            b"RUN_JSON ",
            b'RUN_JSON {"a": 1}\n',
            b"RUN_JSON " + b"[" * 5000 + b"\n",
            b'RUN_JSON {"n": ' + b"9" * 500 + b"}\n",
            b"[default0]:",
            b"step 3/10\n",
            b"Traceback (most recent call last)\n",
            SECRET.encode(),
            SECRET[:7].encode(),
            b"a" * 40 + b"!\n",
        ]
    ),
    # Long runs: a line over the 1 MiB limit, many short lines.
    st.builds(lambda n, c: c * n, st.integers(1 << 10, 1_200_000), st.sampled_from([b"x", b"\n", b"ab\n"])),
)


def leg_printing(data: bytes, rules: OutputRules, folder: Path) -> tuple[Capture, Path]:
    """A leg that prints `data`, read through `rules` and the secret filter into a 1 MiB + 1 MiB log: what
    the engine captured of it, and the log."""
    (folder / "out.bin").write_bytes(data)
    capture, log = Capture(rules), folder / "leg.log"
    result = run_command(
        ["cat", str(folder / "out.bin")],
        log_path=log,
        on_block=capture.feed,
        strip_prefix=rules.strip_prefix,
        scrub=Scrubber([SECRET]),
        timeout_s=60,
        log_limits=(1 << 20, 1 << 20),
    )
    assert result.rc == 0 and result.error is None
    return capture, log


@settings(SETTINGS, max_examples=40)
@given(st.lists(CHUNKS, max_size=8))
def test_any_leg_output_goes_through_the_pipeline_without_a_secret_or_an_exception(tmp_path_factory, chunks):
    rules = OutputRules(
        strip_prefix=Pattern(r"^\[default\d\]:(a|aa)*", "output.strip_prefix"),
        echo_prefixes=("RUN_JSON",),
        harvest=(HarvestRule("rj", "RUN_JSON ", "all"),),
        progress=None,
    )
    capture, log = leg_printing(b"".join(chunks), rules, tmp_path_factory.mktemp("leg"))
    harvest, errors = capture.harvest_result()
    stored = json.dumps({"h": harvest, "e": errors, "t": capture.tail_lines(), "f": capture.failure_lines()})
    assert SECRET not in stored and SECRET.encode() not in log.read_bytes()
    assert all(len(line) <= limits.EVIDENCE_LINE_MAX_CHARS + 40 for line in capture.tail_lines())
    # head 1 MiB + tail 1 MiB (+ a line that straddles a segment, + the marker line)
    assert log.stat().st_size <= (2 << 20) + limits.LINE_MAX_CHARS + 200


SPLIT_CHUNKS = st.one_of(
    CHUNKS,
    st.sampled_from(
        [
            # torchrun's tee: a header inside the secret, or another rank's line between its pieces
            SECRET[:10].encode() + b"[default0]:" + SECRET[10:].encode(),
            SECRET[:16].encode(),
            SECRET[16:].encode(),
            SECRET[3:20].encode(),
            b"[default1]:rank 1 says hi\n[default0]:",
            json.dumps({"t": SECRET}).encode(),
        ]
    ),
)


@settings(SETTINGS, max_examples=40)
@given(st.lists(SPLIT_CHUNKS, max_size=8))
def test_any_leg_output_leaves_no_eight_character_piece_of_a_secret(tmp_path_factory, chunks):
    rules = OutputRules(strip_prefix=None, echo_prefixes=(), harvest=(), progress=None)
    capture, log = leg_printing(b"".join(chunks), rules, tmp_path_factory.mktemp("leg"))
    stored = json.dumps({"t": capture.tail_lines(), "f": capture.failure_lines()}).encode() + log.read_bytes()
    pieces = [SECRET[i : i + 8].encode() for i in range(len(SECRET) - 7)]
    assert [p for p in pieces if p in stored] == []


# ------------------------------------------------------------------ evidence files

JSONISH = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=10)),
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(
            st.sampled_from(
                [
                    "steps",
                    "leg",
                    "status",
                    "log",
                    "harvest",
                    "rc",
                    "values",
                    "sources",
                    "fingerprints",
                    "definitions",
                    "mode",
                    "state",
                    "kind",
                    "x",
                ]
            ),
            inner,
            max_size=5,
        ),
    ),
    max_leaves=30,
)
EVIDENCE = st.one_of(
    JSONISH.map(lambda v: json.dumps({"evidence_version": 1, "steps": v}).encode()),
    JSONISH.map(lambda v: json.dumps(v).encode()),
    st.dictionaries(
        st.sampled_from(["steps", "values", "sources", "fingerprints", "definitions", "mode", "state"]),
        JSONISH,
        max_size=6,
    ).map(lambda d: json.dumps({"evidence_version": 1, **d}).encode()),
    st.binary(max_size=300),
    st.integers(1, 3000).map(lambda n: b'{"evidence_version": 1, "state": ' + b"[" * n + b"]" * n + b"}"),
)


@SETTINGS
@given(EVIDENCE)
def test_any_evidence_file_is_checked_or_refused(tmp_path_factory, content):
    folder = tmp_path_factory.mktemp("ev")
    spec = folder / "s.yaml"
    spec.write_text(yaml.safe_dump(VALID))
    (folder / "r").mkdir()
    (folder / "r" / "evidence.json").write_bytes(content)
    for command in ("check", "replay"):
        rc, text = run_cli(command, str(spec), "--evidence", str(folder / "r"))
        assert rc in (0, 2, 5), text
