"""Two checkpoints compared tensor by tensor: model weights, optimizer moments and step, scheduler, RNG states and the
trainer's or loop's own state, each group with its largest difference and its first differing tensor.

    python -m probes.ckpt A B [--format auto|p4|hf_trainer|lightning|accelerate|dcp] [--rtol R] [--atol A]
                              [--ignore GLOB ...] [--no-default-ignore] [--trust-pickle]

prints the comparison document on one line; as the engine's ``ckpt_compare`` collector (probes/ckpt/collector.py)
it is the step's state. B is the reference (the run that never stopped). docs/probes.md describes the document.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

# Known here, not in formats.py, so the collector validates its arguments without importing torch.
FORMATS = ("auto", "p4", "hf_trainer", "lightning", "accelerate", "dcp")

__all__ = ["FORMATS", "compare_paths", "check_options"]


def check_options(fmt: Any, rtol: Any, atol: Any, ignore: Any) -> str | None:
    """Why these options are unusable (None when they are fine): a wrong value is the caller's error, not a
    comparison that failed."""
    if fmt not in FORMATS:
        return f"format must be one of {', '.join(FORMATS)}, got {fmt!r}"
    for name, value in (("rtol", rtol), ("atol", atol)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0 or value == float("inf"):
            return f"{name} must be a finite number >= 0, got {value!r}"
    if not isinstance(ignore, (list, tuple)) or not all(isinstance(p, str) and p for p in ignore):
        return f"ignore must be a list of glob patterns (non-empty strings), got {ignore!r}"
    return None


def compare_paths(
    a: str | Path,
    b: str | Path,
    *,
    fmt: str = "auto",
    rtol: float = 0.0,
    atol: float = 0.0,
    ignore: Sequence[str] = (),
    default_ignore: bool = True,
    trust_pickle: bool = False,
) -> dict[str, Any]:
    """The comparison document of checkpoints ``a`` and ``b`` (B the reference). A missing or unreadable checkpoint
    is the document's ``error``, never an exception; ValueError only for unusable options (:func:`check_options`)."""
    problem = check_options(fmt, rtol, atol, list(ignore))
    if problem:
        raise ValueError(problem)
    from probes.ckpt.compare import compare_loaded, error_doc
    from probes.ckpt.formats import FormatError, detect, load

    pa, pb = Path(a).expanduser(), Path(b).expanduser()
    shown = {"a": str(pa), "b": str(pb), "rtol": float(rtol), "atol": float(atol), "ignore": list(ignore)}
    try:
        fa = detect(pa) if fmt == "auto" else fmt
        fb = detect(pb) if fmt == "auto" else fmt
        if fa != fb:
            return error_doc(f"{pa} is a {fa} checkpoint and {pb} a {fb} one", fmt=None, **shown)
        la, lb = load(pa, fa, trust_pickle), load(pb, fb, trust_pickle)
    except FormatError as exc:
        return error_doc(str(exc), fmt=None if fmt == "auto" else fmt, **shown)
    except OSError as exc:  # a folder that cannot be listed
        return error_doc(f"{exc.filename or pa}: {exc.strerror or exc}", fmt=None if fmt == "auto" else fmt, **shown)
    if la.error or lb.error:
        return error_doc("; ".join(e for e in (la.error, lb.error) if e), fmt=fa, **shown)
    return compare_loaded(
        la, lb, rtol=float(rtol), atol=float(atol), ignore=list(ignore), default_ignore=default_ignore
    )
