"""The evidence document: versioned JSON in `<run_dir>/evidence.json`, rewritten atomically.

Also home of the `Scrubber`: secrets must never reach anything stored or printed, so every line a
leg prints passes through one before it is logged, echoed or kept.
"""
from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable, Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Protocol

from engine.spec import display_path
# values.py owns the definition of "secret-looking": one rule for the whole engine.
from engine.values import is_secret

EVIDENCE_VERSION = 1
FILENAME = "evidence.json"
REDACTED = "<redacted>"
# Shorter "secrets" (a token set to "1" in a test) would shred ordinary output if scrubbed.
MIN_SECRET_LEN = 4



class EvidenceError(Exception):
    """evidence.json is missing, unreadable, or written by a newer engine."""


class SpecInfo(Protocol):
    path: Any
    sha256: str
    files: Mapping[str, str]


class PlanLike(Protocol):
    name: str
    mode: str
    values: Mapping[str, Any]
    sources: Mapping[str, str]
    fingerprints: Mapping[str, str]
    spec: SpecInfo


class Scrubber:
    """Replaces every literal secret value with `<redacted>` in text and in JSON-like objects."""

    def __init__(self, secrets: Iterable[str]) -> None:
        unique = {s for s in secrets if isinstance(s, str) and len(s) >= MIN_SECRET_LEN}
        # Longest first, so a secret that contains another is replaced whole.
        self.secrets = sorted(unique, key=len, reverse=True)

    @classmethod
    def for_run(cls, values: Mapping[str, Any], environ: Mapping[str, str],
                secret_names: Iterable[str] = (), extra_env: Iterable[Mapping[str, Any]] = ()
                ) -> "Scrubber":
        """Secrets of a run: secret-named values, secret-named env vars (HF_TOKEN), step env."""
        names = set(secret_names)
        found = [str(v) for k, v in values.items() if (k in names or is_secret(k)) and v]
        found += [v for k, v in environ.items() if is_secret(k) and v]
        for env in extra_env:
            found += [str(v) for k, v in (env or {}).items() if is_secret(k) and v]
        return cls(found)

    def scrub(self, text: str) -> str:
        for secret in self.secrets:
            if secret in text:
                text = text.replace(secret, REDACTED)
        return text

    def scrub_obj(self, obj: Any) -> Any:
        if not self.secrets:
            return obj
        if isinstance(obj, str):
            return self.scrub(obj)
        if isinstance(obj, Mapping):
            return {self.scrub(str(k)): self.scrub_obj(v) for k, v in obj.items()}
        if isinstance(obj, (list, tuple)):
            return [self.scrub_obj(v) for v in obj]
        return obj


def redact_values(values: Mapping[str, Any], secret_names: Iterable[str] = ()) -> dict[str, Any]:
    names = set(secret_names)
    return {k: (REDACTED if (k in names or is_secret(k)) else v) for k, v in values.items()}


def now_iso() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def new_document(plan: PlanLike, run_dir: str | os.PathLike[str], engine_version: str
                 ) -> dict[str, Any]:
    """The document before any step ran: what was asked (spec, mode, values), not what happened."""
    secret_names = getattr(plan, "secret_names", ())
    spec = plan.spec
    return {
        "evidence_version": EVIDENCE_VERSION,
        "engine_version": engine_version,
        "spec": {"path": display_path(spec.path), "sha256": spec.sha256, "name": plan.name,
                 "files": dict(spec.files)},
        "mode": plan.mode,
        "values": redact_values(plan.values, secret_names),
        "sources": dict(plan.sources),
        "run_dir": str(run_dir),
        "started_at": now_iso(),
        "finished_at": None,
        "seconds": None,
        "fingerprints": dict(plan.fingerprints),
        "steps": {},
        "state": {},
    }


def path_of(run_dir: str | os.PathLike[str]) -> Path:
    return Path(run_dir) / FILENAME


def write(run_dir: str | os.PathLike[str], doc: Mapping[str, Any]) -> Path:
    """Atomic rewrite: a reader (or a crash) sees the old document or the new one, never half."""
    target = path_of(run_dir)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".evidence.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(doc, fh, indent=1, sort_keys=False, default=str)
            fh.write("\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    return target


def load(run_dir: str | os.PathLike[str]) -> dict[str, Any]:
    target = path_of(run_dir)
    try:
        text = target.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise EvidenceError(f"{target}: no evidence document (was a run started in this "
                            f"directory?)") from None
    except OSError as exc:
        raise EvidenceError(f"{target}: cannot read: {exc.strerror or exc}") from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise EvidenceError(f"{target}:{exc.lineno}:{exc.colno}: not valid JSON: {exc.msg}") from None
    if not isinstance(doc, dict):
        raise EvidenceError(f"{target}: expected a JSON object, found {type(doc).__name__}")
    version = doc.get("evidence_version")
    if not isinstance(version, int):
        raise EvidenceError(f"{target}: missing or non-integer 'evidence_version'")
    if version > EVIDENCE_VERSION:
        raise EvidenceError(f"{target}: evidence_version {version} was written by a newer engine "
                            f"(this one reads up to {EVIDENCE_VERSION})")
    return doc
