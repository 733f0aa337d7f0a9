"""engine/secrets.py: which names are secret, and their text kept out of everything shown or stored."""

import json
from types import SimpleNamespace
from urllib.parse import quote

import pytest

from engine.secrets import REDACTED, Scrubber, is_secret, redact, redact_text


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
