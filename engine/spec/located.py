"""YAML with a location for every node: the file, line and column each mapping key and value was written
at, and the errors that point there (`SpecError`, `SpecErrors`). Merging keeps the marks, so an error in a
check inherited from `specs/lib/p4_common.yaml` is reported at that file's line, not at the child's."""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from typing import Any, Callable, Iterable

import yaml

from engine import limits
from engine.spec.misread import misread, source_lines


@dataclass(frozen=True)
class Mark:
    file: str
    line: int  # 1-based
    col: int  # 1-based
    # How YAML read the scalar here otherwise than written (engine/spec/misread.py); "" as written.
    misread: str = ""


_NOWHERE = Mark("<unknown>", 0, 0)


def display_path(p: str | os.PathLike) -> str:
    """A path as shown to people: relative to the cwd when it is below it, else absolute."""
    ap = os.path.abspath(p)
    try:
        rel = os.path.relpath(ap)
    except ValueError:  # another drive on Windows
        return ap
    return ap if rel.startswith("..") else rel


def json_path(path: Iterable[Any]) -> str:
    """('steps', 2, 'run', 'timeout_s') -> "$.steps[2].run.timeout_s"."""
    out = "$"
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        elif re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", str(part)):
            out += f".{part}"
        else:
            out += "[" + json.dumps(str(part)) + "]"
    return out


class SpecError(Exception):
    """One problem in a spec, located: `file:line:col: $.json.path: message`."""

    def __init__(self, file: str, line: int, col: int, path: str, message: str):
        super().__init__(file, line, col, path, message)
        self.file, self.line, self.col, self.path, self.message = file, line, col, path, message

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.col}: {self.path}: {self.message}"

    def sort_key(self) -> tuple:
        return (self.file, self.line, self.col, self.path, self.message)

    @classmethod
    def at(cls, mark: Mark, path: Iterable[Any], message: str) -> "SpecError":
        return cls(mark.file, mark.line, mark.col, json_path(path), message)


class SpecErrors(Exception):
    """Every problem found, one per line."""

    def __init__(self, errors: list[SpecError]):
        super().__init__(errors)
        self.errors = list(errors)

    def __str__(self) -> str:
        return "\n".join(str(e) for e in self.errors)


# --- located YAML ---------------------------------------------------------------------------------


class _Map(dict):
    """A dict that remembers where it, each key and each value came from."""

    def __init__(self, mark: Mark):
        super().__init__()
        self.mark = mark
        self.key_marks: dict[str, Mark] = {}
        self.val_marks: dict[str, Mark] = {}
        self.key_nodes: dict[str, Any] = {}  # only while building: merge keys vs explicit keys

    def put(self, key: str, value: Any, key_mark: Mark, val_mark: Mark) -> None:
        self[key] = value
        self.key_marks[key] = key_mark
        self.val_marks[key] = val_mark


class _Seq(list):
    """A list that remembers where it and each item came from."""

    def __init__(self, mark: Mark):
        super().__init__()
        self.mark = mark
        self.item_marks: list[Mark] = []

    def put(self, value: Any, mark: Mark) -> None:
        self.append(value)
        self.item_marks.append(mark)


def _mark(node: yaml.Node, file: str, lines: Callable[[int, int], list[str]] | None = None) -> Mark:
    return Mark(file, node.start_mark.line + 1, node.start_mark.column + 1, misread(node, lines))


class _Builder:
    """Turns a composed YAML node tree into _Map/_Seq/plain scalars, recording marks."""

    def __init__(self, file: str, text: str | None = None):
        self.file = file
        self.lines = source_lines(text) if text is not None else None  # to tell a folded scalar
        self.constructor = yaml.constructor.SafeConstructor()
        self.active: set[int] = set()  # node ids on the current path: a recursive alias would never end
        self.explicit: dict[int, set[int]] = {}  # mapping node id -> ids of its own (non-merged) key nodes
        self.nodes = 0  # built so far: aliases are expanded, so an alias bomb is counted here

    def build(self, node: yaml.Node, path: tuple) -> Any:
        mark = _mark(node, self.file)
        if id(node) in self.active:
            raise SpecErrors([SpecError.at(mark, path, "recursive YAML alias")])
        self.nodes += 1
        if self.nodes > limits.SPEC_MAX_NODES:
            raise SpecErrors(
                [
                    SpecError.at(
                        mark,
                        path,
                        f"the document expands to more than {limits.SPEC_MAX_NODES:,} nodes (a YAML alias bomb?)",
                    )
                ]
            )
        if len(path) > limits.SPEC_MAX_DEPTH:
            raise SpecErrors([SpecError.at(mark, path, f"nested deeper than {limits.SPEC_MAX_DEPTH} levels")])
        if isinstance(node, yaml.ScalarNode):
            try:
                value = self.constructor.construct_object(node, deep=True)
            except yaml.YAMLError as e:
                raise SpecErrors([SpecError.at(mark, path, f"bad scalar: {_yaml_problem(e)}")]) from None
            if not isinstance(value, (str, int, float, bool, type(None))):
                # Timestamps, binary: JSON has no such thing; keep the source text.
                return node.value
            return value
        self.active.add(id(node))
        try:
            if isinstance(node, yaml.SequenceNode):
                seq = _Seq(mark)
                for i, item in enumerate(node.value):
                    seq.put(self.build(item, path + (i,)), _mark(item, self.file, self.lines))
                return seq
            return self._mapping(node, mark, path)
        finally:
            self.active.discard(id(node))

    def _mapping(self, node: yaml.MappingNode, mark: Mark, path: tuple) -> _Map:
        # Remember the explicit keys before flattening rewrites node.value (an alias revisits the same node).
        explicit = self.explicit.setdefault(
            id(node), {id(k) for k, _ in node.value if k.tag != "tag:yaml.org,2002:merge"}
        )
        try:
            self.constructor.flatten_mapping(node)  # YAML merge keys (`<<: *base`)
        except yaml.YAMLError as e:
            raise SpecErrors([SpecError.at(mark, path, _yaml_problem(e))]) from None
        out = _Map(mark)
        errors = []
        for key_node, val_node in node.value:
            kmark = _mark(key_node, self.file)
            if not isinstance(key_node, yaml.ScalarNode):
                errors.append(SpecError.at(kmark, path, "mapping keys must be plain scalars"))
                continue
            # Keys are JSON object keys: the YAML source text, so `1:` is "1" and `true:` is "true".
            key = key_node.value
            if key in out and id(key_node) in explicit and id(out.key_nodes[key]) in explicit:
                errors.append(
                    SpecError.at(
                        kmark, path + (key,), f"duplicate key {key!r} (first at line {out.key_marks[key].line})"
                    )
                )
                continue
            try:
                value = self.build(val_node, path + (key,))
            except SpecErrors as e:
                errors.extend(e.errors)
                continue
            out.put(key, value, kmark, _mark(val_node, self.file, self.lines))
            out.key_nodes[key] = key_node  # a merged-in key may be overridden by an explicit one
        if errors:
            raise SpecErrors(errors)
        return out


def _yaml_problem(e: yaml.YAMLError) -> str:
    if isinstance(e, yaml.MarkedYAMLError):
        parts = [p for p in (e.context, e.problem) if p]
        return "YAML: " + ", ".join(parts) if parts else "YAML: " + str(e).splitlines()[0]
    return "YAML: " + str(e).splitlines()[0]


_FAST_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def parse_yaml(text: str, file: str) -> Any:
    """Parse one YAML document into located containers; raise SpecErrors on syntax errors."""
    try:
        try:  # libyaml's parser when the wheel has it (several times faster); errors in PyYAML's words
            node = yaml.compose(text, Loader=_FAST_LOADER)
        except yaml.YAMLError:
            node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as e:
        m = e.problem_mark or e.context_mark
        line, col = (m.line + 1, m.column + 1) if m else (1, 1)
        raise SpecErrors([SpecError(file, line, col, "$", _yaml_problem(e))]) from None
    except yaml.YAMLError as e:
        raise SpecErrors([SpecError(file, 1, 1, "$", _yaml_problem(e))]) from None
    except (ValueError, RecursionError) as e:  # e.g. a stray NUL or absurd nesting
        raise SpecErrors([SpecError(file, 1, 1, "$", f"YAML: {e}")]) from None
    if node is None:
        return None
    try:
        return _Builder(file, text).build(node, ())
    except RecursionError:
        raise SpecErrors([SpecError(file, 1, 1, "$", "YAML nesting too deep")]) from None
