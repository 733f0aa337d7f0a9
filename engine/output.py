"""Per-line output rules of a run step: prefix strip, key-line echo, marker harvest, failure-line
grep over the whole capture, tail, and progress (step/total, rate, ETA).

Lines arrive in `Block`s (see lines.py). Substring searches over a whole block find the lines
any rule cares about at C speed; only those lines get per-line Python work.
"""
from __future__ import annotations

import json
import re
import threading
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine import defaults
from engine.console import Console
from engine.lines import Block, LineMatcher

ECHO_WIDTH = 300
PICKS = ("first", "last", "all")
MISSING = "missing"


@dataclass(frozen=True)
class HarvestRule:
    name: str
    marker: str | None
    pick: str
    # A `match` rule: the regex's named groups of a matching line, instead of JSON after a marker.
    pattern: re.Pattern[str] | None = None


@dataclass(frozen=True)
class ProgressRule:
    pattern: re.Pattern[str]
    every_s: float


@dataclass(frozen=True)
class OutputRules:
    strip_prefix: re.Pattern[str] | None = None
    echo_prefixes: tuple[str, ...] = ()
    harvest: tuple[HarvestRule, ...] = ()
    failure_patterns: tuple[str, ...] = defaults.FAILURE_PATTERNS
    failure_lines: int = defaults.FAILURE_LINES
    tail_lines: int = defaults.TAIL_LINES
    progress: ProgressRule | None = None


def _regex(text: str, where: str) -> re.Pattern[str]:
    try:
        return re.compile(text)
    except re.error as exc:
        raise ValueError(f"{where} {text!r}: {exc}") from None


def compile_rules(run: Mapping[str, Any]) -> OutputRules:
    """A resolved `run:` section -> OutputRules (defaults filled, regexes compiled)."""
    output = run.get("output") or {}
    strip = output.get("strip_prefix")
    harvest = []
    for name, rule in (output.get("harvest") or {}).items():
        pick = rule.get("pick", defaults.HARVEST_PICK)
        if pick not in PICKS:
            raise ValueError(f"output.harvest.{name}.pick must be one of {PICKS}, got {pick!r}")
        if rule.get("match") is not None:
            pattern = _regex(rule["match"], f"output.harvest.{name}.match")
            if not pattern.groupindex:
                raise ValueError(f"output.harvest.{name}.match {pattern.pattern!r} has no named group "
                                 f"(?P<name>...) to harvest")
            harvest.append(HarvestRule(name, None, pick, pattern))
        else:
            harvest.append(HarvestRule(name, str(rule["marker"]), pick))
    progress = None
    if run.get("progress"):
        pattern = _regex(run["progress"]["match"], "progress.match")
        missing = {"step", "total"} - set(pattern.groupindex)
        if missing:
            raise ValueError(f"progress.match {pattern.pattern!r} lacks named group(s) "
                             f"{sorted(missing)}")
        progress = ProgressRule(pattern, float(run["progress"].get("every_s",
                                                                   defaults.PROGRESS_EVERY_S)))
    patterns = output.get("failure_patterns")
    return OutputRules(
        strip_prefix=_regex(strip, "output.strip_prefix") if strip else None,
        echo_prefixes=tuple(output.get("echo_prefixes") or ()),
        harvest=tuple(harvest),
        failure_patterns=tuple(patterns) if patterns is not None else defaults.FAILURE_PATTERNS,
        failure_lines=int(output.get("failure_lines", defaults.FAILURE_LINES)),
        tail_lines=int(output.get("tail_lines", defaults.TAIL_LINES)),
        progress=progress,
    )


def _json_after(line: str, marker: str) -> Any:
    return json.loads(line[len(marker):].strip())


def _group_value(text: str | None) -> Any:
    """A named group's text: a number when it reads as a JSON number, else the text (None when
    the group did not take part in the match)."""
    if text is None:
        return None
    try:
        value = json.loads(text, parse_constant=_not_a_number)
    except ValueError:
        return text
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else text


def _not_a_number(text: str) -> Any:
    # "NaN" and "Infinity" stay text: evidence is strict JSON, and a plot shows them as gaps.
    raise ValueError(text)


class Capture:
    """Consumes the blocks of one run step and keeps only what the rules need."""

    def __init__(self, rules: OutputRules, console: Console | None = None) -> None:
        self.rules = rules
        self.console = console
        self.lines = 0
        self.tail: deque[str] = deque(maxlen=max(rules.tail_lines, 0))
        self.failure_hits = 0
        self.failures: deque[str] = deque(maxlen=max(rules.failure_lines, 0))
        self.harvested: dict[str, Any] = {}
        self.harvest_errors: list[dict[str, Any]] = []
        self.marker_seen: set[str] = set()
        self.progress = ProgressState()
        self._lock = threading.Lock()
        # Every line any rule may concern contains one of these literals.
        self._literals = tuple(dict.fromkeys(
            list(rules.echo_prefixes) + [h.marker for h in rules.harvest if h.marker is not None]
            + list(rules.failure_patterns)))
        self._progress = LineMatcher(rules.progress.pattern) if rules.progress else None
        self._matched = [(rule, LineMatcher(rule.pattern)) for rule in rules.harvest if rule.pattern is not None]

    def feed(self, block: Block) -> None:
        with self._lock:
            self.lines += block.count
            if self.tail.maxlen:
                self.tail.extend(block.tail(self.tail.maxlen))
            if self._literals:
                for lineno, line in block.find_lines(self._literals):
                    self._handle(line, lineno)
            for rule, matcher in self._matched:
                self._harvest_matches(rule, matcher, block)
            if self._progress is not None:
                found = self._progress.last(block)
                if found is not None:
                    self._observe(found)

    def _handle(self, line: str, lineno: int) -> None:
        rules = self.rules
        if rules.failure_patterns and any(p in line for p in rules.failure_patterns):
            self.failure_hits += 1
            if self.failures.maxlen:
                self.failures.append(line)
        if rules.echo_prefixes and line.startswith(rules.echo_prefixes) and self.console:
            self.console.line("  KEY> " + line[:ECHO_WIDTH])
        for rule in rules.harvest:
            if rule.marker is not None and line.startswith(rule.marker):
                self._harvest(rule, line, lineno)

    def _harvest_matches(self, rule: HarvestRule, matcher: LineMatcher, block: Block) -> None:
        if rule.pick == "first" and rule.name in self.harvested:
            return
        candidates = block.find_lines([matcher.literal]) if matcher.literal is not None else \
            ((block.first_lineno + i, line) for i, line in enumerate(block.lines))
        for _, line in candidates:
            found = matcher.pattern.search(line)
            if found is None:
                continue
            self.marker_seen.add(rule.name)
            value = {k: _group_value(v) for k, v in found.groupdict().items()}
            if rule.pick == "all":
                self.harvested.setdefault(rule.name, []).append(value)
            else:
                self.harvested[rule.name] = value
                if rule.pick == "first":
                    return

    def _harvest(self, rule: HarvestRule, line: str, lineno: int) -> None:
        self.marker_seen.add(rule.name)
        if rule.pick == "first" and rule.name in self.harvested:
            return
        try:
            value = _json_after(line, rule.marker)
        except json.JSONDecodeError as exc:
            self.harvest_errors.append({"name": rule.name, "marker": rule.marker, "line": lineno,
                                        "error": f"invalid JSON: {exc.msg} (column "
                                                 f"{exc.colno + len(rule.marker)})",
                                        "text": line[:ECHO_WIDTH]})
            return
        if rule.pick == "all":
            self.harvested.setdefault(rule.name, []).append(value)
        else:
            self.harvested[rule.name] = value

    def _observe(self, found: re.Match[str]) -> None:
        try:
            step, total = int(found["step"]), int(found["total"])
        except (TypeError, ValueError):
            return  # a progress line whose numbers do not parse is not progress
        self.progress.observe(step, total, time.monotonic())

    def harvest_result(self) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """Harvest values (absent when never found) and errors, including `missing` markers."""
        errors = list(self.harvest_errors)
        for rule in self.rules.harvest:
            if rule.name not in self.marker_seen:
                errors.append({"name": rule.name, "marker": rule.marker, "line": None,
                               "error": MISSING, "text": None,
                               **({"match": rule.pattern.pattern} if rule.pattern is not None else {})})
        return dict(self.harvested), errors

    def failure_lines(self) -> list[str]:
        return list(self.failures)

    def tail_lines(self) -> list[str]:
        return list(self.tail)


@dataclass
class ProgressState:
    step: int | None = None
    total: int | None = None
    first_step: int | None = None
    first_at: float | None = None
    last_at: float | None = None

    def observe(self, step: int, total: int, at: float) -> None:
        if self.first_step is None:
            self.first_step, self.first_at = step, at
        self.step, self.total, self.last_at = step, total, at

    def rate(self) -> float | None:
        """Steps per second between the first and the latest progress line (startup excluded)."""
        if self.first_at is None or self.last_at is None or self.step is None:
            return None
        span = self.last_at - self.first_at
        done = self.step - (self.first_step or 0)
        return done / span if span > 0 and done > 0 else None

    def eta_s(self) -> float | None:
        rate = self.rate()
        if rate is None or self.total is None or self.step is None:
            return None
        return max(self.total - self.step, 0) / rate

    def as_dict(self) -> dict[str, Any] | None:
        if self.step is None:
            return None
        rate = self.rate()
        return {"step": self.step, "total": self.total,
                "steps_per_s": round(rate, 4) if rate is not None else None}


def reharvest(step: Mapping[str, Any], log_path: str | Path) -> dict[str, Any]:
    """Recompute harvest, harvest_errors, failure_lines and tail from a saved RAW log, with the
    step's CURRENT output rules (`engine replay`). failure_lines are computed whatever the step's
    status was; the caller keeps them only for a failed step."""
    rules = compile_rules(step.get("run") or {})
    capture = Capture(rules)
    raw = Path(log_path).read_text(encoding="utf-8", errors="replace")
    lines = raw.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    if rules.strip_prefix is not None:
        sub = rules.strip_prefix.sub
        lines = [sub("", line, count=1) for line in lines]
    capture.feed(Block.from_lines(lines, 1))
    harvest, errors = capture.harvest_result()
    return {"harvest": harvest, "harvest_errors": errors, "failure_lines": capture.failure_lines(),
            "tail": capture.tail_lines(), "lines": capture.lines,
            "progress": capture.progress.as_dict()}
