"""engine/secrets.py: which names are secret, and their text kept out of everything shown or stored."""

import json
from types import SimpleNamespace
from urllib.parse import quote

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine import secret_forms
from engine import secrets as secrets_module
from engine.secret_forms import FRAGMENT_MIN, Finder, forms, merge
from engine.secrets import REDACTED, Scrubber, TreeScrubber, is_secret, redact, redact_text


@pytest.mark.parametrize(
    "name,secret",
    [
        ("hf_token", True),
        ("HF_TOKEN", True),
        ("apiKey", True),
        ("db_password", True),
        ("client_secret", True),
        ("tokens", False),
        ("tokens_consumed", False),
        ("push_every", False),
        ("keys", False),
    ],
)
def test_secret_looking_names(name, secret):
    assert is_secret(name) is secret


def test_redact_hides_secret_values_everywhere():
    values = {
        "hf_token": "hf_abcdef123",
        "url": "https://u:hf_abcdef123@host",
        "n": 3,
        "argv": ["--token", "hf_abcdef123"],
        "tokens": 100,
    }
    assert redact(values) == {
        "hf_token": REDACTED,
        "url": f"https://u:{REDACTED}@host",
        "n": 3,
        "argv": ["--token", REDACTED],
        "tokens": 100,
    }
    assert redact_text("x hf_abcdef123 y", values) == f"x {REDACTED} y"
    assert values["hf_token"] == "hf_abcdef123"  # the original is untouched


def test_a_numeric_secret_is_redacted_wherever_its_digits_appear() -> None:
    # `--set api_key=123456` parses as an int; the leg still gets (and may print) its digits.
    values = {"api_key": 123456, "argv": ["--key", "123456"], "steps": 30}
    assert redact(values) == {"api_key": REDACTED, "argv": ["--key", REDACTED], "steps": 30}
    assert redact_text("curl -H key=123456", values) == f"curl -H key={REDACTED}"


def test_numbers_stay_numbers_when_a_secret_is_made_of_digits() -> None:
    values = {"pin_secret": "1234", "steps": 12345, "note": "pin 1234"}
    assert redact(values) == {"pin_secret": REDACTED, "steps": 12345, "note": f"pin {REDACTED}"}


def test_the_run_scrubber_covers_values_environment_and_step_env() -> None:
    plan = SimpleNamespace(
        values={"hf_token": "tok_from_values", "repo": "hf://o/n", "enabled_key": True},
        secret_names=["repo_alias"],
        steps=[{"run": {"env": {"DB_PASSWORD": "pw_from_step_env", "MODE": "visible"}}}, {"remove": ["/tmp/x"]}],
    )
    scrubber = Scrubber.for_plan(plan, {"HF_TOKEN": "tok_from_environ", "HOME": "/root"})
    text = "tok_from_values pw_from_step_env tok_from_environ visible /root hf://o/n True"
    assert scrubber.scrub(text) == f"{REDACTED} {REDACTED} {REDACTED} visible /root hf://o/n True"
    assert scrubber.scrub_obj({"tok_from_values": [1, "x tok_from_environ"]}) == {REDACTED: [1, f"x {REDACTED}"]}


def test_short_secrets_are_not_scrubbed_out_of_ordinary_text() -> None:
    plan = SimpleNamespace(values={"api_token": "1"}, secret_names=[], steps=[])
    assert Scrubber.for_plan(plan, {}).scrub("step 1 of 10") == "step 1 of 10"


TOKEN = "hf_FRAGMENT_TOKEN_4c6e8a0b2d"


@pytest.mark.parametrize("at", [8, 13, len(TOKEN) - 8])
def test_both_pieces_of_a_secret_split_by_a_header_are_redacted(at: int) -> None:
    text = f"x {TOKEN[:at]}[default0]:{TOKEN[at:]} y"
    assert Scrubber([TOKEN]).scrub(text) == f"x {REDACTED}[default0]:{REDACTED} y"


def test_a_piece_shorter_than_eight_characters_is_all_a_split_can_leave() -> None:
    # The rule's price and its bound: 7 characters of the token stay visible beside the split, and
    # ordinary words sharing up to 7 characters with a secret stay readable; 8 are redacted.
    scrubber = Scrubber([TOKEN, "correcthorse"])
    assert scrubber.scrub(f"{TOKEN[:7]}[default0]:{TOKEN[7:]}") == f"{TOKEN[:7]}[default0]:{REDACTED}"
    assert scrubber.scrub("the correct horse, orsehorse") == "the correct horse, orsehorse"
    assert scrubber.scrub("correcth thorse") == f"{REDACTED} thorse"


def test_a_cut_line_ending_in_a_middle_piece_of_a_secret_redacts_it() -> None:
    # A header inside the token, then the line limit: the head ends in a middle piece.
    head = "x" * 50 + TOKEN[:10] + "[default0]:" + TOKEN[10:20]
    assert Scrubber([TOKEN]).scrub_cut(head) == "x" * 50 + f"{REDACTED}[default0]:{REDACTED}"


def test_pieces_of_a_non_ascii_secret_are_redacted_as_whole_characters() -> None:
    secret = "schlüssel-öffnet-türen"
    text = f"ä {secret[:9]}[default0]:{secret[9:]} ü"
    assert Scrubber([secret]).scrub(text) == f"ä {REDACTED}[default0]:{REDACTED} ü"


def test_every_encoded_form_of_a_secret_is_redacted() -> None:
    secret = 'Pa"ss\\wörd'
    cases = {
        json.dumps({"p": secret}): '{"p": "<redacted>"}',
        json.dumps({"p": secret}, ensure_ascii=False): '{"p": "<redacted>"}',
        repr({"p": secret}): "{'p': '<redacted>'}",
        repr({"p": secret + "'"}): "{'p': '<redacted>\\''}",
        ascii(secret): "'<redacted>'",
        repr(secret.encode()): "b'<redacted>'",
        "https://u:" + quote(secret, safe="") + "@host": "https://u:<redacted>@host",
        json.dumps({"message": repr({"p": secret})}): "{\"message\": \"{'p': '<redacted>'}\"}",
    }
    scrubber = Scrubber([secret])
    assert {text: scrubber.scrub(text) for text in cases} == cases


def test_many_secrets_with_fragments_scrub_a_three_mebibyte_line() -> None:
    # 'x' is in the secrets, so the whole line is one run of bytes that could be a fragment.
    secrets = [f"tok_x{i:05d}_{i * 7919:08d}" for i in range(2000)]
    scrubber = Scrubber(secrets)
    line = "x" * (3 << 20) + secrets[1234][:9] + "[default0]:" + secrets[1234][9:] + "y" * 100
    assert scrubber.scrub(line) == "x" * (3 << 20) + f"{REDACTED}[default0]:{REDACTED}" + "y" * 100


def every_fragment(data: bytes, groups: list[list[bytes]]) -> list[tuple[int, int]]:
    """The rule, written out slowly: every occurrence of every 8-byte piece of a form, and of each
    shorter form whole."""
    spans = []
    for form in {f for g in groups for f in g if len(f) >= 4}:
        pieces = [form] if len(form) < FRAGMENT_MIN else [form[i : i + 8] for i in range(len(form) - 7)]
        for piece in pieces:
            at = data.find(piece)
            while at >= 0:
                spans.append((at, at + len(piece)))
                at = data.find(piece, at + 1)
    return merge(spans)


# Two kinds of secret with few bytes in common, so that they get passes of their own.
SECRET_TEXT = st.one_of(
    st.text(alphabet='abcxyz_019"\\ö', min_size=4, max_size=40),
    st.text(alphabet="ABCDEFGHIJKLMNOPQRSTUVW2345678+/=é", min_size=4, max_size=40),
)


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(
    st.lists(SECRET_TEXT, min_size=1, max_size=12),
    st.lists(
        st.one_of(
            st.text(alphabet="abcxyzABC019 -[]:\n", max_size=30),
            st.tuples(st.integers(0, 11), st.integers(0, 40), st.integers(0, 40)),
            st.tuples(st.sampled_from("xaA0 "), st.integers(200, 2000)),
        ),
        max_size=12,
    ),
)
def test_the_finder_finds_exactly_what_the_rule_says(secrets: list[str], pieces: list) -> None:
    # Texts built of pieces of the secrets (any cut), their letters and long runs of one of them:
    # every way through the finder (the pass over all bytes, the narrow passes it hands over to
    # when candidates are dense, anchors in long runs) must give the rule's answer, byte for byte.
    groups = [[f.encode() for f in forms(s)] for s in secrets]
    parts = []
    for piece in pieces:
        if isinstance(piece, str):
            parts.append(piece.encode())
        elif len(piece) == 3:
            secret = secrets[piece[0] % len(secrets)].encode()
            parts.append(secret[min(piece[1], piece[2]) : max(piece[1], piece[2])])
        else:
            parts.append(piece[0].encode() * piece[1])
    data = b"".join(parts)
    expected = every_fragment(data, groups)

    def found() -> list[tuple[int, int]]:
        finder = Finder(groups, whole_min=4)
        spans = merge(finder.spans(data))
        if data.isascii():  # the same answer from the str path, which ASCII text takes
            assert merge(finder.ascii_text().spans(data.decode())) == spans
        return spans

    assert found() == expected
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(secret_forms, "DENSE_RUNS", -len(data))  # straight to the narrow passes
        assert found() == expected
        patch.setattr(secret_forms, "SHORT_RUN", 0)  # every run searched by its anchors
        assert found() == expected


def test_secrets_and_their_pieces_across_file_chunks_are_masked_in_a_copy_of_the_same_size(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(secrets_module, "FILE_CHUNK", 16)  # every occurrence crosses a chunk boundary
    text = f"a{TOKEN}b {TOKEN[:12]}[default0]:{TOKEN[12:]} c{TOKEN}\n" * 3
    log = tmp_path / "rank0.log"
    log.write_text(text)
    log.chmod(0o640)
    before = log.stat().st_ino
    scrubber = TreeScrubber(tmp_path, [TOKEN])
    assert scrubber.scrub() == ["rank0.log"] and scrubber.problems == {}
    masked = log.read_text()

    def stars(n: int) -> str:
        return (REDACTED + "*" * n)[:n]

    assert masked == f"a{stars(28)}b {stars(12)}[default0]:{stars(16)} c{stars(28)}\n" * 3
    assert log.stat().st_ino != before and log.stat().st_mode & 0o777 == 0o640
    assert scrubber.scrub() == []  # found clean by its SHA-256: not searched again
