"""engine/secrets.py: which names are secret, and their text kept out of everything shown or stored."""

from types import SimpleNamespace

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
