"""Secrets: which names are secret, and the one way their text is kept out of anything printed or
stored (evidence, logs, the console, `engine plan`, `engine diff`).

A secret is a value whose NAME looks like a credential (`hf_token`, `HF_TOKEN`, `apiKey`), in the
spec's values, the engine's environment or a step's `env`. Its text is replaced by `<redacted>`
wherever it occurs, not only where the name is.
"""
from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any, Protocol

REDACTED = "<redacted>"
# Shorter "secrets" (a token set to "1" in a test) would shred ordinary output if scrubbed; a real
# credential is never that short.
MIN_SECRET_LEN = 4
# A name is secret-looking when one of its `_`/`-`/camelCase parts ENDS in one of these words:
# hf_token, HF_TOKEN, apiKey, db_password are secret; tokens, tokens_consumed, keys are not.
_SECRET_PART = re.compile(r"(token|secret|key|password|passwd)$", re.IGNORECASE)


def is_secret(name: str) -> bool:
    """Names that look like credentials are never printed or stored."""
    parts = re.split(r"[_\-.]|(?<=[a-z0-9])(?=[A-Z])", name)
    return any(_SECRET_PART.search(p) for p in parts if p)


def secret_texts(values: Mapping[str, Any], secret_names: Iterable[str] = ()) -> list[str]:
    """The text of every secret in a table of values (numbers too: `--set api_key=123456` parses
    as an int, and the leg still prints its digits)."""
    names = set(secret_names)
    return [str(v) for k, v in values.items()
            if (k in names or is_secret(str(k))) and isinstance(v, (str, int, float))
            and not isinstance(v, bool)]


class PlanSecrets(Protocol):
    values: Mapping[str, Any]
    secret_names: Iterable[str]
    steps: Iterable[Mapping[str, Any]]


class Scrubber:
    """Replaces every literal secret text with `<redacted>` in text and in JSON-like objects."""

    def __init__(self, secrets: Iterable[str]) -> None:
        unique = {s for s in secrets if isinstance(s, str) and len(s) >= MIN_SECRET_LEN}
        # Longest first, so a secret that contains another is replaced whole.
        self.secrets = sorted(unique, key=len, reverse=True)

    @classmethod
    def for_plan(cls, plan: PlanSecrets, environ: Mapping[str, str]) -> "Scrubber":
        """The secrets of a run: secret-named values, secret-named variables of `environ`
        (HF_TOKEN) and secret-named entries of each step's `env`."""
        found = secret_texts(plan.values, plan.secret_names)
        found += [v for k, v in environ.items() if is_secret(k) and v]
        for step in plan.steps:
            found += secret_texts((step.get("run") or {}).get("env") or {})
        return cls(found)

    def scrub(self, text: str) -> str:
        for secret in self.secrets:
            if secret in text:
                text = text.replace(secret, REDACTED)
        return text

    def scrub_obj(self, obj: Any) -> Any:
        """A copy with every string (keys included) scrubbed; numbers and booleans as they are."""
        if not self.secrets:
            return obj
        if isinstance(obj, str):
            return self.scrub(obj)
        if isinstance(obj, Mapping):
            return {self.scrub(str(k)): self.scrub_obj(v) for k, v in obj.items()}
        if isinstance(obj, (list, tuple)):
            return [self.scrub_obj(v) for v in obj]
        return obj


def redact(values: Mapping[str, Any], secret_names: Iterable[str] = ()) -> dict[str, Any]:
    """A copy safe to print or store: secret names -> <redacted>, secret text inside other values too."""
    names = set(secret_names)
    scrubber = Scrubber(secret_texts(values, names))
    return {k: REDACTED if (k in names or is_secret(str(k))) else scrubber.scrub_obj(v)
            for k, v in values.items()}


def redact_text(text: str, values: Mapping[str, Any]) -> str:
    """`text` with every secret value's text replaced by <redacted>."""
    return Scrubber(secret_texts(values)).scrub(text)
