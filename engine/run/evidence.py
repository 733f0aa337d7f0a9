"""The evidence document: versioned JSON in `<run_dir>/evidence.json`: what it holds, how it is
spelled (`dumps`, `loads`) and read back (`load`, with the shape a re-check can read).

A run writes it (`write`, atomic) only through its record (engine/run/record.py `Record.save`), which
masks it; `engine check`/`replay` never rewrite it (they write `check-<stamp>.json`/
`replay-<stamp>.json` beside it, through a Record of their own).
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Protocol

from engine import limits
from engine.secrets import redact
from engine.spec.located import display_path
from engine.spec.plan import step_definition

EVIDENCE_VERSION = 1
FILENAME = "evidence.json"
# JSON has no NaN or infinity; Python writes them as bare tokens that strict readers (jq, JavaScript)
# refuse or read as null. They are stored as {"$nonfinite": "NaN"|"Infinity"|"-Infinity"} instead,
# and loaded back as the float, so checks see exactly what the live run saw.
NONFINITE_KEY = "$nonfinite"
_NONFINITE = {"NaN": float("nan"), "Infinity": float("inf"), "-Infinity": float("-inf")}


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
    secret_names: Iterable[str]
    steps: Iterable[Mapping[str, Any]]
    spec: SpecInfo


def now_iso() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def new_document(plan: PlanLike, run_dir: str | os.PathLike[str], engine_version: str) -> dict[str, Any]:
    """The document before any step ran: what was asked (spec, mode, values, each step's
    definition), not what happened. The definitions let `engine check` say what changed in a step
    since the run, even when the run was killed before its end."""
    spec = plan.spec
    return {
        "evidence_version": EVIDENCE_VERSION,
        "engine_version": engine_version,
        "spec": {"path": display_path(spec.path), "sha256": spec.sha256, "name": plan.name, "files": dict(spec.files)},
        "mode": plan.mode,
        "values": redact(plan.values, plan.secret_names),
        "sources": dict(plan.sources),
        "run_dir": str(run_dir),
        "started_at": now_iso(),
        "finished_at": None,
        "seconds": None,
        "fingerprints": dict(plan.fingerprints),
        "definitions": {s["name"]: step_definition(s) for s in plan.steps},
        # Not in the fingerprint (a replay may change them); `engine check` compares them.
        "output_rules": {s["name"]: (s.get("run") or {}).get("output") for s in plan.steps if "run" in s},
        "steps": {},
        "state": {},
    }


@dataclass(frozen=True)
class Reuse:
    """The steps a run takes over from the earlier run in its run dir (`engine run --from STEP`):
    their records and collected state as that run stored them."""

    from_step: str
    run_started_at: str | None  # when the earlier run started
    records: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    state: Mapping[str, Any] = field(default_factory=dict)
    set_aside: str | None = None  # where that run's evidence went, relative to the run dir


def carry_over(doc: dict[str, Any], reuse: Reuse) -> None:
    """Put the reused steps into a new document: each record marked `reused` with the start of the
    run that really ran it (a step reused twice keeps its first run's), and `resumed` saying how."""
    for name, record in reuse.records.items():
        ran = record.get("reused_from") if record.get("reused") is True else None
        doc["steps"][name] = {**record, "reused": True, "reused_from": ran or reuse.run_started_at}
    doc["state"].update(reuse.state)
    doc["resumed"] = {
        "from_step": reuse.from_step,
        "reused": list(reuse.records),
        "run_started_at": reuse.run_started_at,
        "set_aside": reuse.set_aside,
    }


def _nonfinite_name(x: float) -> str:
    return "NaN" if x != x else ("Infinity" if x > 0 else "-Infinity")


def strict(obj: Any) -> Any:
    """`obj` with every non-finite float replaced by its {"$nonfinite": ...} form (tuples -> lists)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else {NONFINITE_KEY: _nonfinite_name(obj)}
    if isinstance(obj, Mapping):
        return {k: strict(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [strict(v) for v in obj]
    return obj


def dumps(obj: Any, indent: int | None = 1) -> str:
    """Standard JSON for a document (evidence, a re-check record): non-finite numbers in their
    documented form, anything else JSON lacks as its str()."""
    try:
        return json.dumps(obj, indent=indent, default=str, allow_nan=False)
    except ValueError:  # a NaN or an infinity somewhere: only then pay for a walk of the document
        return json.dumps(strict(obj), indent=indent, default=str, allow_nan=False)


def _revive(obj: dict[str, Any]) -> Any:
    if len(obj) == 1 and NONFINITE_KEY in obj:
        name = obj[NONFINITE_KEY]
        if name not in _NONFINITE:
            raise ValueError(f'{{"{NONFINITE_KEY}": {json.dumps(name)}}}: expected one of {", ".join(_NONFINITE)}')
        return _NONFINITE[name]
    return obj


def loads(text: str) -> Any:
    """The inverse of `dumps`: {"$nonfinite": ...} back to the float. Bare NaN/Infinity tokens
    (evidence written before the strict form) still load. ValueError for a bad $nonfinite or a
    document beyond the engine's limits (depth, integer size)."""
    return limits.loads_json(text, limits.EVIDENCE_MAX_DEPTH, object_hook=_revive)


def path_of(run_dir: str | os.PathLike[str]) -> Path:
    return Path(run_dir) / FILENAME


def write(run_dir: str | os.PathLike[str], doc: Mapping[str, Any]) -> Path:
    """`<run_dir>/evidence.json`, rewritten atomically (`write_document`); OSError when it cannot be.
    A run writes it only through its record (engine/run/record.py `Record.save`), which masks the
    document first and turns a failure into the run's RecordError."""
    target = path_of(run_dir)
    target.parent.mkdir(parents=True, exist_ok=True)
    return write_document(target, dumps(doc) + "\n")


def write_document(target: Path, text: str) -> Path:
    """`text` at `target`, atomically, through a fresh temporary file beside it (created with
    O_EXCL: never a name that could already be a symlink to elsewhere) renamed over it: a reader
    (or a crash) sees the old document or the new one, never half. A write that fails (a full disk)
    leaves the old document and no temporary file, and raises its OSError."""
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
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


# The fields a re-check reads, and the JSON type each must have (None: absent is fine).
_OBJECTS = ("values", "sources", "fingerprints", "definitions", "steps", "state", "spec", "resumed")
_STEP_FIELDS: dict[str, tuple[type, ...]] = {
    "kind": (str,),
    "status": (str,),
    "log": (str,),
    "harvest": (dict,),
    "harvest_errors": (list,),
    "failure_lines": (list,),
    "tail": (list,),
    "lines": (int,),
    "progress": (dict, type(None)),
    "precondition": (str, type(None)),
    "progress_warning": (dict,),
    "fail_on": (dict,),
    "warn_on": (dict,),
    "exception": (dict,),
    "reused": (bool,),
    "reused_from": (str, type(None)),
    "reference": (dict,),
    "snapshot": (list,),
}
_JSON_TYPE = {
    dict: "an object",
    list: "an array",
    str: "a string",
    int: "a number",
    float: "a number",
    bool: "a boolean",
    type(None): "null",
}


def _kind_of(value: Any) -> str:
    return _JSON_TYPE.get(type(value), type(value).__name__)


def shape_problems(doc: Mapping[str, Any]) -> list[str]:
    """What in a loaded evidence document has the wrong JSON type for a re-check to read it
    (one line each, by path); empty when it can be read."""
    problems = []
    for key in _OBJECTS:
        if key in doc and not isinstance(doc[key], dict):
            problems.append(f"$.{key}: expected an object, found {_kind_of(doc[key])}")
    if "mode" in doc and not isinstance(doc["mode"], (str, type(None))):
        problems.append(f"$.mode: expected a string, found {_kind_of(doc['mode'])}")
    for key in ("fingerprints", "sources"):
        for name, value in (doc.get(key) if isinstance(doc.get(key), dict) else {}).items():
            if not isinstance(value, str):
                problems.append(f"$.{key}.{name}: expected a string, found {_kind_of(value)}")
    for key in ("definitions", "steps"):
        for name, value in (doc.get(key) if isinstance(doc.get(key), dict) else {}).items():
            if not isinstance(value, dict):
                problems.append(f"$.{key}.{name}: expected an object, found {_kind_of(value)}")
    steps = doc.get("steps") if isinstance(doc.get("steps"), dict) else {}
    for name, step in steps.items():
        if not isinstance(step, dict):
            continue
        for field_name, types in _STEP_FIELDS.items():
            value = step.get(field_name)
            if field_name in step and not (
                isinstance(value, types) and not (isinstance(value, bool) and bool not in types)
            ):
                problems.append(
                    f"$.steps.{name}.{field_name}: expected "
                    f"{' or '.join(dict.fromkeys(_JSON_TYPE[t] for t in types))}, "
                    f"found {_kind_of(value)}"
                )
        log = step.get("log")
        # `engine replay` reads the raw log: it must be one of the run's, not any file on the machine.
        if isinstance(log, str) and (os.path.isabs(log) or ".." in Path(log).parts or "\0" in log):
            problems.append(f"$.steps.{name}.log: {log!r} is not a path inside the run directory")
    return problems


def load(run_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """The evidence document of a saved run; EvidenceError (naming the file and what is wrong)
    when it is missing, not a regular file inside `run_dir` (a symlink out of it), too big, not UTF-8 JSON, nested too deeply, of the
    wrong shape, or newer than this engine."""
    target = path_of(run_dir)
    try:
        raw = limits.read_regular_file(target, limits.EVIDENCE_MAX_BYTES, "evidence file", inside=run_dir)
    except FileNotFoundError:
        raise EvidenceError(f"{target}: no evidence document (was a run started in this directory?)") from None
    except limits.LimitError as exc:
        raise EvidenceError(str(exc)) from None
    except (OSError, ValueError) as exc:
        raise EvidenceError(f"{target}: cannot read: {getattr(exc, 'strerror', None) or exc}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise EvidenceError(f"{target}: not UTF-8 (byte {exc.start}: {exc.reason})") from None
    try:
        doc = loads(text)
    except json.JSONDecodeError as exc:
        raise EvidenceError(f"{target}:{exc.lineno}:{exc.colno}: not valid JSON: {exc.msg}") from None
    except ValueError as exc:  # a limit, or a malformed {"$nonfinite": ...}
        raise EvidenceError(f"{target}: {exc}") from None
    if not isinstance(doc, dict):
        raise EvidenceError(f"{target}: expected a JSON object, found {_kind_of(doc)}")
    version = doc.get("evidence_version")
    if not isinstance(version, int) or isinstance(version, bool):
        raise EvidenceError(f"{target}: missing or non-integer 'evidence_version'")
    if version > EVIDENCE_VERSION:
        raise EvidenceError(
            f"{target}: evidence_version {version} was written by a newer engine "
            f"(this one reads up to {EVIDENCE_VERSION})"
        )
    problems = shape_problems(doc)
    if problems:
        raise EvidenceError(
            f"{target}: not an evidence document this engine can read:\n  "
            + "\n  ".join(problems[:20])
            + (f"\n  ... and {len(problems) - 20} more" if len(problems) > 20 else "")
        )
    return doc
