"""Reading a JSON document the store holds, believing nothing unchecked: a bounded parse and typed fields.

Every document the trainer reads back from a store (``.specprobe/manifest.json``, ``lease.json``,
``latest.json``, ``trainer_state.json``) may have been edited by hand, damaged or forged. :func:`load_doc`
parses one within a size bound, refusing what ``json`` would otherwise accept or crash on (``NaN`` and
``Infinity``, an integer of thousands of digits, nesting deep enough for a RecursionError), and
:class:`Fields` reads its fields with their types and ranges. Every failure is a :class:`FieldError` (a
``ValueError``) naming the document and the field, e.g. ``lease.json in file:///s/o/n: field 'expires': 1e+20
is out of range [0, 253402300799]``.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

__all__ = [
    "FieldError",
    "Fields",
    "load_doc",
    "COUNT_MAX",
    "TIME_MAX",
    "SHA256",
    "REVISION",
    "printable",
]

COUNT_MAX = 2**53  # steps, tokens, sizes: past this a JSON number is no longer an exact integer everywhere
TIME_MAX = 253402300799.0  # 9999-12-31T23:59:59Z: the last second time.gmtime and ISO dates can render
_INT_DIGITS = 20  # an integer literal longer than this is out of every range above
_STR_MAX = 512  # strings read from a document end up in messages; none of ours is longer
SHA256 = re.compile(r"^[0-9a-f]{64}$")
REVISION = re.compile(r"^[0-9a-f]{40}$")  # a commit id, local or Hub
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


class FieldError(ValueError):
    """A document read from a store is malformed; the message names the document and the field."""


def printable(value: str) -> bool:
    """No control character (a newline or a bidi override in a name would forge lines in the log)."""
    return not _CONTROL.search(value)


def _no_constant(name: str) -> float:
    raise ValueError(f"{name} is not a JSON number")


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > _INT_DIGITS:
        raise ValueError(f"an integer of {len(text.lstrip('-'))} digits")
    return int(text)


def load_doc(raw: bytes | str, where: str, *, max_bytes: int) -> dict[str, Any]:
    """The JSON object in ``raw``; FieldError naming ``where`` for anything else (bad syntax, not UTF-8,
    larger than ``max_bytes``, NaN/Infinity, an integer of more than 20 digits, nesting Python cannot
    parse, not an object)."""
    if len(raw) > max_bytes:
        raise FieldError(f"{where} is {len(raw):,} bytes, more than the {max_bytes:,} such a file can hold")
    try:
        doc = json.loads(raw, parse_constant=_no_constant, parse_int=_bounded_int)
    except RecursionError:
        raise FieldError(f"{where} is nested deeper than it can be parsed") from None
    except (ValueError, UnicodeDecodeError) as e:  # JSONDecodeError is a ValueError
        raise FieldError(f"{where} is not valid JSON: {e}") from None
    if not isinstance(doc, dict):
        raise FieldError(f"{where} must be a JSON object, got {type(doc).__name__}")
    return doc


_MISSING = object()


class Fields:
    """Typed, bounded access to one JSON object read from a store (``where`` names it in every message;
    ``prefix`` names a nested object, e.g. ``writer.``)."""

    def __init__(self, doc: Any, where: str, prefix: str = "") -> None:
        if not isinstance(doc, dict):
            raise FieldError(f"{where}: {prefix.rstrip('.') or 'the document'} must be a JSON object, got {doc!r:.80}")
        self.doc, self.where, self.prefix = doc, where, prefix

    def fail(self, name: str, why: str) -> FieldError:
        return FieldError(f"{self.where}: field {self.prefix + name!r}: {why}")

    def _get(self, name: str, default: Any) -> Any:
        if name in self.doc:
            return self.doc[name]
        if default is _MISSING:
            raise FieldError(f"{self.where} lacks the field {self.prefix + name!r}")
        return default

    def int(self, name: str, lo: int = 0, hi: int = COUNT_MAX, default: Any = _MISSING) -> int:
        value = self._get(name, default)
        if value is default and default is not _MISSING:
            return value
        # bool is an int in Python; a field that is true is malformed, not 1.
        if not isinstance(value, int) or isinstance(value, bool):
            raise self.fail(name, f"must be an integer, got {value!r:.80}")
        if not lo <= value <= hi:
            raise self.fail(name, f"{value} is out of range [{lo}, {hi}]")
        return value

    def number(self, name: str, lo: float, hi: float, default: Any = _MISSING) -> float:
        """A finite number in [lo, hi] (an integer is accepted and returned as a float)."""
        value = self._get(name, default)
        if value is default and default is not _MISSING:
            return value
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise self.fail(name, f"must be a number, got {value!r:.80}")
        value = float(value)
        if not math.isfinite(value) or not lo <= value <= hi:
            raise self.fail(name, f"{value!r} is out of range [{lo:g}, {hi:g}]")
        return value

    def str(
        self, name: str, pattern: re.Pattern[str] | None = None, max_len: int = _STR_MAX, default: Any = _MISSING
    ) -> str:
        value = self._get(name, default)
        if value is default and default is not _MISSING:
            return value
        if not isinstance(value, str):
            raise self.fail(name, f"must be a string, got {value!r:.80}")
        if len(value) > max_len:
            raise self.fail(name, f"is {len(value):,} characters long, more than {max_len}")
        if not printable(value):
            raise self.fail(name, f"holds a control character: {value!r:.80}")
        if pattern is not None and not pattern.match(value):
            raise self.fail(name, f"{value!r:.80} does not have the form {pattern.pattern}")
        return value

    def bool(self, name: str, default: Any = _MISSING) -> bool:
        value = self._get(name, default)
        if not isinstance(value, bool):
            raise self.fail(name, f"must be true or false, got {value!r:.80}")
        return value

    def obj(self, name: str, default: Any = _MISSING) -> "Fields | None":
        """The nested object as Fields; ``default`` (None) when absent or null and a default is given."""
        value = self._get(name, default)
        if value is None and default is not _MISSING:
            return None
        if not isinstance(value, dict):
            raise self.fail(name, f"must be a JSON object, got {value!r:.80}")
        return Fields(value, self.where, f"{self.prefix}{name}.")

    def list(self, name: str, max_len: int, default: Any = _MISSING) -> list[Any]:
        value = self._get(name, default)
        if not isinstance(value, list):
            raise self.fail(name, f"must be a list, got {value!r:.80}")
        if len(value) > max_len:
            raise self.fail(name, f"holds {len(value):,} items, more than {max_len:,}")
        return value
