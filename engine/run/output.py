"""Per-line output rules of a run step: prefix strip, key-line echo, marker harvest, failure-line
grep over the whole capture, lines that fail the leg whatever its exit code (`fail_on`), tail, and
progress (step/total, rate, ETA).

Lines arrive in `Block`s (see lines.py). Substring searches over a whole block find the lines
any rule cares about at C speed; only those lines get per-line Python work.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections import deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine import defaults, limits
from engine.run.console import Console
from engine.run.lines import Block, LineMatcher, Pattern

ECHO_WIDTH = 300
PICKS = ("first", "last", "all")
ON_CONFLICT = ("fail", "pick")
ON_MALFORMED = ("fail", "skip")
MISSING = "missing"
# Kinds of harvest error entries: no marker line at all, a marker line whose JSON does not parse,
# marker lines that disagree (pick first/last would silently choose one of them).
KIND_MISSING, KIND_MALFORMED, KIND_CONFLICT = "missing", "malformed", "conflict"
LINES_KEPT = 20  # line numbers a conflict entry lists; `count` says how many there were
# The line a program writes last when an exception ends it (`FileExistsError: checkpoint_0 ... exists`, as
# Python prints it, after a launcher's `[rank0]: ` prefix): a crashed leg's reason in one line. A line with
# no message after the name (`ChildFailedError:` heading a launcher's report) says nothing of why.
EXCEPTION_LINES = tuple(
    re.compile(rf"^(?:\[[^\]]*\]:?\s*)?(?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*{kind}: \S.*$") for kind in ("Error", "Exception")
)


@dataclass(frozen=True)
class HarvestRule:
    name: str
    marker: str | None
    pick: str
    on_conflict: str = defaults.HARVEST_ON_CONFLICT  # fail | pick
    on_malformed: str = defaults.HARVEST_ON_MALFORMED  # fail | skip
    # A `match` rule: the regex's named groups of a matching line, instead of JSON after a marker.
    pattern: Pattern | None = None


@dataclass(frozen=True)
class ChildExitRule:
    """`output.child_exit`: where a launcher's output says how its child failed (torchrun's
    failure report hides the trainer's exit code behind its own 1)."""

    name: str
    code: Pattern  # the LAST line it matches: its group `code`
    messages: tuple[Pattern, ...] = ()  # the FIRST line any of them matches


@dataclass(frozen=True)
class ProgressRule:
    pattern: Pattern
    every_s: float
    # The leg's own last step (`progress.total`): a segment leg stops before the horizon its lines print.
    total: int | None = None
    # (name, pattern) of the lines that start a phase after the last step (`progress.phases`).
    phases: tuple[tuple[str, Pattern], ...] = ()


@dataclass(frozen=True)
class OutputRules:
    strip_prefix: Pattern | None = None
    echo_prefixes: tuple[str, ...] = ()
    harvest: tuple[HarvestRule, ...] = ()
    failure_patterns: tuple[str, ...] = defaults.FAILURE_PATTERNS
    failure_lines: int = defaults.FAILURE_LINES
    tail_lines: int = defaults.TAIL_LINES
    progress: ProgressRule | None = None
    child_exit: ChildExitRule | None = None
    # `output.fail_on`: a line one of these matches fails the leg, whatever its exit code.
    fail_on: tuple[Pattern, ...] = ()
    # `output.warn_on`: the lines one of these matches are the leg's warnings, kept and shown; they fail nothing.
    warn_on: tuple[Pattern, ...] = ()

    def pattern_errors(self) -> list[str]:
        """Why a rule's regex stopped matching during the leg (it gave up on a line)."""
        child = self.child_exit
        patterns = [
            self.strip_prefix,
            *self.fail_on,
            *self.warn_on,
            self.progress.pattern if self.progress else None,
            *(pattern for _, pattern in (self.progress.phases if self.progress else ())),
            *(rule.pattern for rule in self.harvest),
            *((child.code, *child.messages) if child else ()),
        ]
        return [p.error for p in patterns if p is not None and p.error]


def _regex(text: str, where: str) -> Pattern:
    return Pattern(text, where)


def compile_rules(run: Mapping[str, Any]) -> OutputRules:
    """A resolved `run:` section -> OutputRules (defaults filled, regexes compiled)."""
    output = run.get("output") or {}
    strip = output.get("strip_prefix")
    harvest = []
    for name, rule in (output.get("harvest") or {}).items():
        pick = rule.get("pick", defaults.HARVEST_PICK)
        on_conflict = rule.get("on_conflict", defaults.HARVEST_ON_CONFLICT)
        on_malformed = rule.get("on_malformed", defaults.HARVEST_ON_MALFORMED)
        for key, got, allowed in (
            ("pick", pick, PICKS),
            ("on_conflict", on_conflict, ON_CONFLICT),
            ("on_malformed", on_malformed, ON_MALFORMED),
        ):
            if got not in allowed:
                raise ValueError(f"output.harvest.{name}.{key} must be one of {allowed}, got {got!r}")
        if rule.get("match") is not None:
            pattern = _regex(rule["match"], f"output.harvest.{name}.match")
            if not pattern.groupindex:
                raise ValueError(
                    f"output.harvest.{name}.match {pattern.pattern!r} has no named group (?P<name>...) to harvest"
                )
            harvest.append(HarvestRule(name, None, pick, on_conflict, on_malformed, pattern))
        else:
            harvest.append(HarvestRule(name, str(rule["marker"]), pick, on_conflict, on_malformed))
    progress = _progress_rule(run["progress"]) if run.get("progress") else None
    patterns = output.get("failure_patterns")
    child = output.get("child_exit")
    fail_on = output.get("fail_on") or ()
    warn_on = output.get("warn_on") or ()
    return OutputRules(
        strip_prefix=_regex(strip, "output.strip_prefix") if strip else None,
        echo_prefixes=tuple(output.get("echo_prefixes") or ()),
        harvest=tuple(harvest),
        failure_patterns=tuple(patterns) if patterns is not None else defaults.FAILURE_PATTERNS,
        failure_lines=int(output.get("failure_lines", defaults.FAILURE_LINES)),
        tail_lines=int(output.get("tail_lines", defaults.TAIL_LINES)),
        progress=progress,
        child_exit=_child_exit_rule(child) if child else None,
        fail_on=tuple(_regex(text, f"output.fail_on[{i}]") for i, text in enumerate(fail_on)),
        warn_on=tuple(_regex(text, f"output.warn_on[{i}]") for i, text in enumerate(warn_on)),
    )


def _child_exit_rule(rule: Mapping[str, Any]) -> ChildExitRule:
    code = _regex(rule["code"], "output.child_exit.code")
    if "code" not in code.groupindex:
        raise ValueError(f"output.child_exit.code {code.pattern!r} has no named group (?P<code>...)")
    messages = rule.get("message") or ()
    if isinstance(messages, str):
        messages = (messages,)
    return ChildExitRule(
        str(rule["name"]),
        code,
        tuple(_regex(m, f"output.child_exit.message[{i}]") for i, m in enumerate(messages)),
    )


def _progress_rule(spec: Mapping[str, Any]) -> ProgressRule:
    """A resolved `progress:` section -> ProgressRule. The total is the spec's `total`, else the
    line's `total` group, else unknown (step and rate only)."""
    pattern = _regex(spec["match"], "progress.match")
    if "step" not in pattern.groupindex:
        raise ValueError(f"progress.match {pattern.pattern!r} lacks the named group 'step'")
    total = spec.get("total")
    if total is not None and (not isinstance(total, int) or isinstance(total, bool) or total < 1):
        raise ValueError(f"progress.total must be a positive integer, got {total!r}")
    phases = tuple(
        (str(name), _regex(text, f"progress.phases.{name}")) for name, text in (spec.get("phases") or {}).items()
    )
    return ProgressRule(pattern, float(spec.get("every_s", defaults.PROGRESS_EVERY_S)), total, phases)


def _json_after(line: str, marker: str) -> Any:
    return limits.loads_json(line[len(marker) :].strip())


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
        self._markers: dict[str, _MarkerLines] = {}
        self.progress = ProgressState()
        self._lock = threading.Lock()
        # Every line any rule may concern contains one of these literals.
        self._literals = tuple(
            dict.fromkeys(
                list(rules.echo_prefixes)
                + [h.marker for h in rules.harvest if h.marker is not None]
                + list(rules.failure_patterns)
            )
        )
        self._progress = LineMatcher(rules.progress.pattern) if rules.progress else None
        self._phases = [(name, LineMatcher(p)) for name, p in (rules.progress.phases if rules.progress else ())]
        self._total = rules.progress.total if rules.progress else None
        self._matched = [(rule, LineMatcher(rule.pattern)) for rule in rules.harvest if rule.pattern is not None]
        child = rules.child_exit
        self._child_code = LineMatcher(child.code) if child else None
        self._child_messages = [LineMatcher(p) for p in child.messages] if child else []
        self.child_code: int | None = None
        self.child_message: tuple[int, str] | None = None  # (line number, line)
        self._fail_on = [LineMatcher(p) for p in rules.fail_on]
        self.fail_on_count = 0
        self.fail_on_lines: list[dict[str, Any]] = []  # the first LINES_KEPT: {line, text, pattern}
        self._warn_on = [LineMatcher(p) for p in rules.warn_on]
        self.warn_on_count = 0
        self.warn_on_lines: list[dict[str, Any]] = []
        self._exception_lines = [LineMatcher(p) for p in EXCEPTION_LINES]
        self.exception: tuple[int, str] | None = None  # the last exception line: (line number, line)

    def feed(self, block: Block) -> None:
        with self._lock:
            self.lines += block.count
            if self.tail.maxlen:
                self.tail.extend(limits.cut_text(line) for line in block.tail(self.tail.maxlen))
            if self._literals:
                for lineno, line in block.find_lines(self._literals):
                    self._handle(line, lineno)
            for rule, matcher in self._matched:
                self._harvest_matches(rule, matcher, block)
            if self._progress is not None:
                found = self._progress.last(block)
                if found is not None:
                    self._observe(*found)
                if self._phases and self.progress.done_lineno is not None:
                    self._enter_phase(block)
            if self._child_code is not None:
                self._watch_child(block)
            if self._fail_on:
                self.fail_on_count += _watch_lines(self._fail_on, block, self.fail_on_lines)
            if self._warn_on:
                self.warn_on_count += _watch_lines(self._warn_on, block, self.warn_on_lines)
            self._watch_exception(block)

    def _watch_exception(self, block: Block) -> None:
        for matcher in self._exception_lines:
            found = matcher.last(block)
            if found is not None and (self.exception is None or found[0] > self.exception[0]):
                self.exception = (found[0], limits.cut_text(found[1].group(0)))

    def fail_on_result(self) -> dict[str, Any] | None:
        """The lines a `fail_on` rule matched: {count, lines: [{line, text, pattern}] (the first
        LINES_KEPT)}; None when none did (or the step has no such rule)."""
        if not self.fail_on_count:
            return None
        return {"count": self.fail_on_count, "lines": list(self.fail_on_lines)}

    def warn_on_result(self) -> dict[str, Any] | None:
        """The lines a `warn_on` rule matched, as `fail_on_result` gives its own; None when none did."""
        if not self.warn_on_count:
            return None
        return {"count": self.warn_on_count, "lines": list(self.warn_on_lines)}

    def exception_result(self) -> dict[str, Any] | None:
        """The last line of the output that reads as an exception ending a program: {line, text}; None when none."""
        return None if self.exception is None else {"line": self.exception[0], "text": self.exception[1]}

    def _watch_child(self, block: Block) -> None:
        assert self._child_code is not None
        found = self._child_code.last(block)
        if found is not None:
            try:
                self.child_code = int(found[1].group("code"))
            except (TypeError, ValueError):
                pass  # a code that is not a number says nothing
        if self.child_message is None:
            hits = [hit for hit in (m.first(block) for m in self._child_messages) if hit is not None]
            if hits:
                lineno, line = min(hits)
                self.child_message = (lineno, limits.cut_text(line))

    def child_exit(self) -> dict[str, Any] | None:
        """What the leg's output said of its failing child (`output.child_exit`): {name, code,
        message, line}; None without the rule, or when the output said nothing of it."""
        rule = self.rules.child_exit
        if rule is None or (self.child_code is None and self.child_message is None):
            return None
        lineno, message = self.child_message or (None, None)
        return {"name": rule.name, "code": self.child_code, "message": message, "line": lineno}

    def _handle(self, line: str, lineno: int) -> None:
        rules = self.rules
        if rules.failure_patterns and any(p in line for p in rules.failure_patterns):
            self.failure_hits += 1
            if self.failures.maxlen:
                self.failures.append(limits.cut_text(line))
        if rules.echo_prefixes and line.startswith(rules.echo_prefixes) and self.console:
            self.console.line("  KEY> " + line[:ECHO_WIDTH])
        for rule in rules.harvest:
            if rule.marker is not None and line.startswith(rule.marker):
                self._harvest(rule, line, lineno)

    def _harvest_matches(self, rule: HarvestRule, matcher: LineMatcher, block: Block) -> None:
        if rule.pick == "first" and rule.name in self.harvested:
            return
        for _, _, found in _matching_lines(matcher, block):
            self.marker_seen.add(rule.name)
            value = {k: _group_value(v) for k, v in found.groupdict().items()}
            if rule.pick == "all":
                self.harvested.setdefault(rule.name, []).append(value)
            else:
                self.harvested[rule.name] = value
                if rule.pick == "first":
                    return

    def _harvest(self, rule: HarvestRule, line: str, lineno: int) -> None:
        # Every marker line is parsed, whatever the pick: a malformed or disagreeing line after
        # the one that is kept must be seen, not skipped.
        self.marker_seen.add(rule.name)
        try:
            if line.endswith(limits.CUT_MARKER):
                raise limits.LimitError(
                    f"the line is longer than the {limits.LINE_MAX_CHARS // limits.MiB} "
                    f"MiB line limit and was cut; its JSON is incomplete"
                )
            value = _json_after(line, rule.marker)
        except json.JSONDecodeError as exc:
            self.harvest_errors.append(
                {
                    "name": rule.name,
                    "marker": rule.marker,
                    "line": lineno,
                    "kind": KIND_MALFORMED,
                    "error": f"invalid JSON: {exc.msg} (column {exc.colno + len(rule.marker)})",
                    "text": line[:ECHO_WIDTH],
                }
            )
            return
        except ValueError as exc:  # a limit: too deep, a 5,000-digit integer, a cut line
            self.harvest_errors.append(
                {
                    "name": rule.name,
                    "marker": rule.marker,
                    "line": lineno,
                    "kind": KIND_MALFORMED,
                    "error": f"not harvested: {exc}",
                    "text": line[:ECHO_WIDTH],
                }
            )
            return
        if rule.pick == "all":
            self.harvested.setdefault(rule.name, []).append(value)
            return
        seen = self._markers.get(rule.name)
        key = json.dumps(value, sort_keys=True, default=str)  # NaN-safe, key-order-blind
        if seen is None:
            seen = self._markers[rule.name] = _MarkerLines(key)
        seen.add(lineno, key)
        if rule.pick == "last" or rule.name not in self.harvested:
            self.harvested[rule.name] = value
            seen.picked = lineno

    def _observe(self, lineno: int, found: Any) -> None:
        printed = found.groupdict().get("total")
        try:
            step = int(found["step"])
            total = self._total or (int(printed) if printed is not None else None)
        except (TypeError, ValueError):
            return  # a progress line whose numbers do not parse is not progress
        self.progress.observe(step, total, time.monotonic(), lineno)

    def _enter_phase(self, block: Block) -> None:
        """The furthest phase a line of the block starts after the last step. Phases are declared in
        the order a leg goes through them and never go back: a push and the validation overlap, and
        a push's line printed after `validation start` must not hide that the leg now validates."""
        done = self.progress.done_lineno or 0
        furthest = None
        for rank, (name, matcher) in enumerate(self._phases):
            found = matcher.last(block)
            if found is not None and found[0] > done:
                furthest = (rank, name)
        if furthest is not None:
            self.progress.enter(furthest[1], time.monotonic(), furthest[0])

    def harvest_result(self) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """Harvest values (absent when never found) and errors, including `missing` markers."""
        errors = list(self.harvest_errors)
        for rule in self.rules.harvest:
            if rule.name not in self.marker_seen:
                errors.append(
                    {
                        "name": rule.name,
                        "marker": rule.marker,
                        "line": None,
                        "kind": KIND_MISSING,
                        "error": MISSING,
                        "text": None,
                        **({"match": rule.pattern.pattern} if rule.pattern is not None else {}),
                    }
                )
            seen = self._markers.get(rule.name)
            if seen is not None and seen.differ:
                errors.append(seen.conflict(rule))
        return dict(self.harvested), errors

    def failure_lines(self) -> list[str]:
        return list(self.failures)

    def tail_lines(self) -> list[str]:
        return list(self.tail)


def _watch_lines(matchers: list[LineMatcher], block: Block, kept: list[dict[str, Any]]) -> int:
    """How many lines of the block any of the matchers matches; the first of them, up to LINES_KEPT in
    all, are appended to `kept` as {line, text, pattern}. A line two rules match is one line."""
    hits: dict[int, tuple[str, str]] = {}
    for matcher in matchers:
        for lineno, line, _ in _matching_lines(matcher, block):
            hits.setdefault(lineno, (line, matcher.pattern.pattern))
    for lineno in sorted(hits)[: max(LINES_KEPT - len(kept), 0)]:
        line, pattern = hits[lineno]
        kept.append({"line": lineno, "text": limits.cut_text(line), "pattern": pattern})
    return len(hits)


def _matching_lines(matcher: LineMatcher, block: Block) -> Iterator[tuple[int, str, Any]]:
    """(line number, stripped line, match) of every line of the block the matcher's regex matches, in
    order; only the lines holding its literal are searched, when it has one."""
    candidates = (
        block.find_lines([matcher.literal])
        if matcher.literal is not None
        else ((block.first_lineno + i, line) for i, line in enumerate(block.lines))
    )
    for lineno, line in candidates:
        found = matcher.pattern.search(line)
        if found is not None:
            yield lineno, line, found


class _MarkerLines:
    """The valid marker lines of one first/last rule: their numbers, and whether their JSON
    differs from the first one's (only the first's canonical text is kept)."""

    def __init__(self, first_key: str) -> None:
        self.first_key = first_key
        self.lines: list[int] = []
        self.count = 0
        self.differ = False
        self.picked: int | None = None

    def add(self, lineno: int, key: str) -> None:
        self.count += 1
        if len(self.lines) < LINES_KEPT:
            self.lines.append(lineno)
        if key != self.first_key:
            self.differ = True

    def conflict(self, rule: HarvestRule) -> dict[str, Any]:
        shown = ", ".join(map(str, self.lines)) + (", ..." if self.count > len(self.lines) else "")
        return {
            "name": rule.name,
            "marker": rule.marker,
            "line": self.picked,
            "kind": KIND_CONFLICT,
            "lines": list(self.lines),
            "count": self.count,
            "error": f"{self.count} marker lines, not all with the same JSON (lines {shown}); "
            f"pick {rule.pick} kept line {self.picked}",
            "text": None,
        }


def error_kind(entry: Mapping[str, Any]) -> str:
    """An entry's kind; evidence written before kinds existed had only missing and malformed."""
    kind = entry.get("kind")
    if kind in (KIND_MISSING, KIND_MALFORMED, KIND_CONFLICT):
        return kind
    return KIND_MISSING if entry.get("error") == MISSING else KIND_MALFORMED


def harvest_problems(
    step: str, record: Mapping[str, Any], rules: Mapping[str, Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """The harvest problems of one run step's record, for the verdict: one per rule and kind
    (malformed marker lines, marker lines that disagree), naming the lines of the step's log.
    `fails` is false where the rule opts in (`on_malformed: skip`, `on_conflict: pick`); a missing
    marker is not a problem here (the checks that read it say NO_DATA)."""
    grouped: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    for entry in record.get("harvest_errors") or []:
        if not isinstance(entry, Mapping):
            continue
        kind = error_kind(entry)
        if kind != KIND_MISSING:
            grouped.setdefault((str(entry.get("name")), kind), []).append(entry)
    log = record.get("log") or f"the log of {step}"
    problems = []
    for (name, kind), entries in grouped.items():
        rule = rules.get(name) or {}
        if kind == KIND_MALFORMED:
            lines = [e.get("line") for e in entries]
            fails = rule.get("on_malformed", defaults.HARVEST_ON_MALFORMED) != "skip"
            first = entries[0]
            detail = str(first.get("error") or "").removeprefix("invalid JSON: ")
            where = f"line {lines[0]}" if len(lines) == 1 else f"lines {_lines_text(lines)}"
            message = f"{log} {where}: {str(first.get('marker', name))!r} followed by invalid JSON" + (
                f" ({detail})" if len(lines) == 1 else f" (line {lines[0]}: {detail})"
            )
            opt = "on_malformed: skip"
        else:
            entry = entries[0]
            lines = list(entry.get("lines") or [])
            fails = rule.get("on_conflict", defaults.HARVEST_ON_CONFLICT) != "pick"
            message = f"{log}: {entry.get('error')}"
            opt = "on_conflict: pick"
        problems.append(
            {
                "step": step,
                "harvest": name,
                "kind": kind,
                "lines": lines,
                "fails": fails,
                "message": message + ("" if fails else f" ({opt})"),
            }
        )
    return problems


def _lines_text(lines: list[Any]) -> str:
    shown = [str(n) for n in lines[:LINES_KEPT]]
    return ", ".join(shown) + (", ..." if len(lines) > LINES_KEPT else "")


@dataclass
class ProgressState:
    step: int | None = None
    total: int | None = None
    first_step: int | None = None
    first_at: float | None = None
    last_at: float | None = None
    # When (and on which line) the leg printed its last step, and the phase it is in since.
    done_at: float | None = None
    done_lineno: int | None = None
    phase: str | None = None
    phase_at: float | None = None
    phase_rank: int = -1

    def observe(self, step: int, total: int | None, at: float, lineno: int = 0) -> None:
        if self.first_step is None:
            self.first_step, self.first_at = step, at
        self.step, self.total, self.last_at = step, total, at
        if self.done_at is None and total is not None and step >= total:
            self.done_at, self.done_lineno = at, lineno

    def enter(self, phase: str, at: float, rank: int = 0) -> None:
        """A line that starts `phase`, the `rank`-th the spec declares: a later one than the
        current phase moves on, the same one goes on from its start, an earlier one is past."""
        if self.phase is None or rank > self.phase_rank:
            self.phase, self.phase_at, self.phase_rank = phase, at, rank

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
        return {"step": self.step, "total": self.total, "steps_per_s": round(rate, 4) if rate is not None else None}


def reharvest(step: Mapping[str, Any], log_path: str | Path, run_dir: str | Path) -> dict[str, Any]:
    """Recompute harvest, harvest_errors, failure_lines, child_exit, fail_on, warn_on, exception and tail from a saved RAW
    log (a file inside `run_dir`), with the step's CURRENT output rules (`engine replay`). failure_lines
    and child_exit are computed whatever the step's status was; the caller keeps them only for a failed
    step (fail_on lines fail it)."""
    rules = compile_rules(step.get("run") or {})
    capture = Capture(rules)
    # A log the engine wrote is never bigger (limits.LOG_HEAD_BYTES + LOG_TAIL_BYTES); a bigger
    # one, a FIFO, or a link out of the run dir, is not one of them.
    try:
        raw = limits.read_regular_file(log_path, limits.REPLAY_LOG_MAX_BYTES, "raw log", inside=run_dir).decode(
            "utf-8", errors="replace"
        )
    except (OSError, ValueError) as exc:
        from engine.run.evidence import EvidenceError

        if isinstance(exc, limits.LimitError):  # it names the file
            raise EvidenceError(f"raw log {exc}") from None
        raise EvidenceError(f"raw log {log_path}: {getattr(exc, 'strerror', None) or exc}") from None
    lines = raw.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    if rules.strip_prefix is not None:
        sub = rules.strip_prefix.sub
        lines = [sub("", line, count=1) for line in lines]
    capture.feed(Block.from_lines(lines, 1))
    harvest, errors = capture.harvest_result()
    return {
        "harvest": harvest,
        "harvest_errors": errors,
        "failure_lines": capture.failure_lines(),
        "child_exit": capture.child_exit(),
        "fail_on": capture.fail_on_result(),
        "warn_on": capture.warn_on_result(),
        "exception": capture.exception_result(),
        "tail": capture.tail_lines(),
        "lines": capture.lines,
        "progress": capture.progress.as_dict(),
    }
