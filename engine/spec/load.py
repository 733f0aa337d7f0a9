"""Loading a spec: its files read (located YAML, engine/spec/located.py), `extends`/`include` merged, the schema checked.

Every node of the merged document remembers the file and line it came from, so an error in a check
inherited from `specs/lib/p4_base.yaml` is reported at that file's line, not at the child's.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema

from engine import limits
from engine.spec.located import (
    _NOWHERE,
    Mark,
    SpecError,
    SpecErrors,
    _Map,
    _Seq,
    display_path,
    json_path,
    parse_yaml,
)

# Lists that merge BY NAME across extends/include (and what one item is called); every other list is
# replaced wholesale.
NAMED_LISTS = {"steps": "step", "checks": "check", "require": "requirement"}


# --- extends / include --------------------------------------------------------------------------


def _copy_marks(src: Any) -> Any:
    if isinstance(src, _Map):
        out = _Map(src.mark)
        for k, v in src.items():
            out.put(k, _copy_marks(v), src.key_marks[k], src.val_marks[k])
        return out
    if isinstance(src, _Seq):
        out_s = _Seq(src.mark)
        for v, m in zip(src, src.item_marks):
            out_s.put(_copy_marks(v), m)
        return out_s
    return src


_EXPANSION = re.compile(r"^([a-z][a-z0-9_]*)\[([a-z][a-z0-9_]*)=([^\]]+)\]$")


def family_of(name: Any) -> str | None:
    """The `for_each` check an expansion's name belongs to: `checkpoints_complete_after[leg=leg1]` ->
    `checkpoints_complete_after`; None for a plain name (engine/spec/expand.py makes these names)."""
    m = _EXPANSION.match(name) if isinstance(name, str) else None
    return m.group(1) if m else None


def _name_of(item: Any) -> str | None:
    name = item.get("name") if isinstance(item, dict) else None
    return name if isinstance(name, str) else None


def _where(mark: Mark) -> str:
    return f"{mark.file}:{mark.line}"


def _without(item: _Map, key: str) -> _Map:
    out = _copy_marks(item)
    out.pop(key, None)
    out.key_marks.pop(key, None)
    out.val_marks.pop(key, None)
    return out


def _expansion_problem(name: str, marked: bool, base: _Seq, inherited: set[str]) -> str | None:
    """A check named like an expansion (`family[var=label]`) only overrides one expansion of an
    inherited `for_each` check: anything else would be a second gate wearing an expansion's name."""
    family = family_of(name)
    if not marked:
        return (
            f"check {name!r} is named like an expansion of a for_each check; such a name only overrides "
            f"one expansion of an inherited for_each check (`override: true`), else rename it"
        )
    source = next((c for c in base if _name_of(c) == family), None)
    if family not in inherited or not isinstance(source, _Map) or "for_each" not in source:
        return f"check {name!r} overrides one expansion of {family!r}, which is not an inherited for_each check"
    return None


def _merge_named(base: _Seq, over: _Seq, section: str, errors: list[SpecError]) -> _Seq:
    """New names append; an inherited name is replaced only under `override: true` (a check whole, a
    step merged deeply: mappings merge, lists replace); unnamed items append. `override` never stays,
    but on a check that overrides one expansion of a `for_each` check: the plan replaces that one."""
    out = _copy_marks(base)
    index = {name: i for i, item in enumerate(out) if (name := _name_of(item)) is not None}
    inherited = set(index)
    what = NAMED_LISTS[section]
    for i, (item, m) in enumerate(zip(over, over.item_marks)):
        name = _name_of(item)
        marked = isinstance(item, _Map) and item.get("override") is True
        one_expansion = section == "checks" and family_of(name) is not None
        if one_expansion:
            problem = _expansion_problem(str(name), marked, base, inherited)
            if problem:
                errors.append(SpecError.at(m, (section, i), problem))
                continue
        body = _without(item, "override") if marked and not one_expansion else item
        if name is not None and name in index and name not in inherited:
            # The same name twice in one file: both stay, so that validation names both places.
            out.put(_copy_marks(body), m)
            continue
        if name is not None and name in inherited:
            j = index[name]
            if not marked:
                errors.append(
                    SpecError.at(
                        m,
                        (section, i),
                        (
                            f"{what} {name!r} replaces the one inherited from {_where(out.item_marks[j])}; "
                            f"write `override: true` in it to replace it on purpose, or rename it"
                        ),
                    )
                )
                continue
            if section == "steps" and isinstance(out[j], _Map) and isinstance(body, _Map):
                replaced = merge(out[j], body, top=False)
                replaced.mark = body.mark
            else:
                replaced = _copy_marks(body)
            out[j], out.item_marks[j] = replaced, m
            inherited.discard(name)  # overridden once; a second copy in this file is a duplicate
            continue
        if marked and not one_expansion:
            errors.append(
                SpecError.at(
                    item.key_marks["override"],
                    (section, i, "override"),
                    f"{what} {name!r} has `override: true` but inherits no {what} of that "
                    f"name; remove the marker (or fix the name)",
                )
            )
        out.put(_copy_marks(body), m)
        if name is not None:
            index[name] = len(out) - 1
    return out


def _disable_errors(base: _Map, over: _Map) -> list[SpecError]:
    """`disable: {check: reason}` drops an INHERITED check (a whole `for_each` check, or one expansion of
    it: `name[var=label]`); a check this file writes itself is deleted, not disabled, and a check
    disabled above cannot be silently brought back by an override."""
    errors = []
    inherited = {name: item for item in base.get("checks") or [] if (name := _name_of(item)) is not None}
    disabled = base.get("disable") if isinstance(base.get("disable"), _Map) else _Map(_NOWHERE)
    own = over.get("checks") if isinstance(over.get("checks"), _Seq) else _Seq(_NOWHERE)
    own_names = {name: m for item, m in zip(own, own.item_marks) if (name := _name_of(item)) is not None}
    table = over.get("disable")
    for name in table if isinstance(table, _Map) else ():
        problem = _disable_problem(name, inherited, own_names)
        if problem:
            errors.append(SpecError.at(table.key_marks[name], ("disable", name), problem))
    for name, m in own_names.items():
        was = name if name in disabled else family_of(name) if family_of(name) in disabled else None
        if was is not None:
            errors.append(
                SpecError.at(
                    m,
                    ("checks", name),
                    (
                        f"check {name!r} was disabled at {_where(disabled.key_marks[was])}; an override cannot "
                        f"bring it back silently: remove that disable entry"
                    ),
                )
            )
    return errors


def _disable_problem(name: str, inherited: dict[str, Any], own_names: dict[str, Mark]) -> str | None:
    for own, mark in own_names.items():
        if own == name or family_of(own) == name:
            return f"check {own!r} is both disabled here and written at {_where(mark)}; delete the check instead"
    family = family_of(name)
    if name in inherited or (family in inherited and "for_each" in inherited[family]):
        return None
    if family is not None:
        return f"disable names {name!r}, one expansion of {family!r}, which is not an inherited for_each check"
    known = ", ".join(sorted(inherited)) or "none"
    return f"disable names {name!r}, which is not an inherited check; inherited: {known}"


def merge(base: Any, over: Any, top: bool = True, errors: list[SpecError] | None = None) -> Any:
    """Deep-merge `over` onto `base` (both located): maps merge, steps/checks by name, other lists replace.
    At the top, `errors` collects the inheritance rules broken (`override`, `disable`)."""
    if not (isinstance(base, _Map) and isinstance(over, _Map)):
        return _copy_marks(over)
    errors = [] if errors is None else errors
    if top:
        errors.extend(_disable_errors(base, over))
    out = _copy_marks(base)
    for k, v in over.items():
        if top and k in NAMED_LISTS and isinstance(v, _Seq) and isinstance(out.get(k, _Seq(v.mark)), _Seq):
            merged = _merge_named(out.get(k, _Seq(v.mark)), v, k, errors)
        elif k in out and isinstance(out[k], _Map) and isinstance(v, _Map):
            merged = merge(out[k], v, top=False)
        else:
            merged = _copy_marks(v)
        out.put(k, merged, over.key_marks[k], over.val_marks[k])
    return out


def resolve_likes(doc: _Map) -> list[SpecError]:
    """`like: other` makes a step a copy of an EARLIER step, merged deeply with what it writes itself
    (mappings merge, lists replace): a leg written once, reused with one field changed."""
    steps = doc.get("steps")
    if not isinstance(steps, _Seq):
        return []
    errors = []
    done: dict[str, _Map] = {}
    for i, item in enumerate(steps):
        name = _name_of(item)
        if isinstance(item, _Map) and "like" in item:
            ref = item["like"]
            source = done.get(ref) if isinstance(ref, str) else None
            if source is None:
                errors.append(
                    SpecError.at(
                        item.val_marks["like"],
                        ("steps", i, "like"),
                        (
                            f"like names {ref!r}, which is not an earlier step; earlier steps: "
                            f"{', '.join(done) or 'none'}"
                        ),
                    )
                )
                continue
            body = _without(item, "like")
            copied = merge(_without(source, "name"), body, top=False)
            copied.mark = item.mark
            steps[i] = item = copied
        if name is not None and isinstance(item, _Map):
            done.setdefault(name, item)
    return errors


class _Loader:
    def __init__(self, root: Path | None = None) -> None:
        # With a root, every file read must lie inside it once links are resolved: a spec under review
        # names only files of its own repository, never /etc/... or a link out of the tree.
        self.root = None if root is None else root.resolve()
        self.files: dict[str, str] = {}  # display path -> sha256
        # Each file is loaded once: a diamond of includes 22 levels deep would otherwise be read
        # 2**22 times. Merging copies what it takes, so sharing a loaded document is safe.
        self.loaded: dict[Path, _Map] = {}

    def load(self, path: Path, stack: tuple[Path, ...], ref: tuple[Mark, tuple] | None) -> _Map:
        try:
            real = path.resolve()
        except (OSError, RuntimeError, ValueError) as e:  # a symlink loop, a NUL in the name
            mark, where = ref or (Mark(str(path), 0, 0), ())
            raise SpecErrors([SpecError.at(mark, where, f"cannot resolve {path}: {e}")]) from None
        shown = display_path(path)
        if self.root is not None and not real.is_relative_to(self.root):
            mark, where = ref or (Mark(shown, 0, 0), ())
            raise SpecErrors(
                [SpecError.at(mark, where, f"{shown} is outside {self.root}: a spec read there reads only its files")]
            )
        if real in stack:
            chain = " -> ".join(display_path(p) for p in stack + (real,))
            mark, where = ref or (_NOWHERE, ())
            raise SpecErrors([SpecError.at(mark, where, f"extends/include cycle: {chain}")])
        if real in self.loaded:
            return self.loaded[real]
        try:
            raw = limits.read_regular_file(path, limits.SPEC_MAX_BYTES, "spec")
        except limits.LimitError as e:
            mark, where = ref or (Mark(shown, 0, 0), ())
            raise SpecErrors([SpecError.at(mark, where, f"cannot read {shown}: {e}")]) from None
        except (OSError, ValueError) as e:
            mark, where = ref or (Mark(shown, 0, 0), ())
            raise SpecErrors(
                [SpecError.at(mark, where, f"cannot read {shown}: {getattr(e, 'strerror', None) or e}")]
            ) from None
        self.files[shown] = hashlib.sha256(raw).hexdigest()
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise SpecErrors([SpecError(shown, 1, 1, "$", f"not UTF-8: {e}")]) from None
        doc = parse_yaml(text, shown)
        if not isinstance(doc, _Map):
            kind = "empty" if doc is None else f"a {type(doc).__name__.strip('_').lower()}"
            raise SpecErrors([SpecError(shown, 1, 1, "$", f"a spec must be a YAML mapping, this is {kind}")])
        self.loaded[real] = self._compose(doc, path, stack + (real,))
        return self.loaded[real]

    def _compose(self, doc: _Map, path: Path, stack: tuple[Path, ...]) -> _Map:
        errors: list[SpecError] = []
        base: _Map | None = None
        here = path.parent
        ext = doc.get("extends")
        if ext is not None:
            if isinstance(ext, str) and ext:
                try:
                    base = self.load(here / ext, stack, (doc.val_marks["extends"], ("extends",)))
                except SpecErrors as e:
                    errors.extend(e.errors)
            else:
                errors.append(
                    SpecError.at(doc.val_marks["extends"], ("extends",), "extends must be a non-empty path string")
                )
        fragments: list[_Map] = []
        inc = doc.get("include")
        if inc is not None:
            if isinstance(inc, _Seq) and all(isinstance(i, str) and i for i in inc):
                for i, (item, m) in enumerate(zip(inc, inc.item_marks)):
                    try:
                        fragments.append(self.load(here / item, stack, (m, ("include", i))))
                    except SpecErrors as e:
                        errors.extend(e.errors)
            else:
                errors.append(
                    SpecError.at(doc.val_marks["include"], ("include",), "include must be a list of path strings")
                )
        if errors:
            raise SpecErrors(errors)
        own = _copy_marks(doc)
        for k in ("extends", "include"):
            own.pop(k, None)
        errors = []
        result = base if base is not None else _Map(doc.mark)
        for frag in fragments:  # parent < fragments < this file's own keys
            result = merge(result, frag, errors=errors)
        result = merge(result, own, errors=errors)
        if errors:
            raise SpecErrors(sorted(errors, key=SpecError.sort_key))
        return result


# --- schema ------------------------------------------------------------------------------------


def schema_text() -> str:
    """The JSON Schema of a spec, as shipped (`engine schema` prints it)."""
    return resources.files("engine.spec").joinpath("spec.schema.json").read_text(encoding="utf-8")


@functools.cache
def schema() -> dict:
    return json.loads(schema_text())


@functools.cache
def validator() -> jsonschema.protocols.Validator:
    return jsonschema.Draft202012Validator(schema())


def _plain(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: _plain(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_plain(v) for v in node]
    return node


def _index_marks(node: Any, path: tuple, vals: dict, keys: dict) -> None:
    if isinstance(node, _Map):
        vals.setdefault(path, node.mark)
        for k, v in node.items():
            keys[path + (k,)] = node.key_marks[k]
            vals[path + (k,)] = node.val_marks[k]
            _index_marks(v, path + (k,), vals, keys)
    elif isinstance(node, _Seq):
        vals.setdefault(path, node.mark)
        for i, (v, m) in enumerate(zip(node, node.item_marks)):
            vals[path + (i,)] = m
            _index_marks(v, path + (i,), vals, keys)


@dataclass
class Spec:
    path: Path
    data: dict
    files: dict[str, str]
    sha256: str
    marks: dict[tuple, Mark] = field(default_factory=dict, repr=False)
    key_marks: dict[tuple, Mark] = field(default_factory=dict, repr=False)

    def _find(self, table: dict[tuple, Mark], path: tuple) -> Mark:
        p = tuple(path)
        while p and p not in table:
            p = p[:-1]
        return table.get(p) or self.marks.get((), Mark(display_path(self.path), 1, 1))

    def locate(self, path: tuple) -> tuple[str, int, int]:
        """(file, line, col) of the node at `path`, or of its nearest located ancestor."""
        m = self._find(self.marks, path)
        return m.file, m.line, m.col

    def locate_key(self, path: tuple) -> tuple[str, int, int]:
        """Like `locate`, but the KEY's position for a mapping member (for unknown-key errors)."""
        m = self.key_marks.get(tuple(path)) or self._find(self.marks, path)
        return m.file, m.line, m.col

    def error(self, path: tuple, message: str, key: bool = False) -> SpecError:
        file, line, col = (self.locate_key if key else self.locate)(path)
        return SpecError(file, line, col, json_path(path), message)


def _branch_fits(branch: list, instance: Any) -> bool:
    """A oneOf/anyOf branch is the one the author meant when its errors are not about the top-level type."""
    return not any(e.validator in ("type", "const", "enum") and not e.relative_path for e in branch)


def _unmeant_reference(options: list, idx: Any, instance: Any) -> bool:
    """A plain string in a field that also allows "${x}" was not meant as a reference: report the real type."""
    branch = options[idx] if isinstance(idx, int) and idx < len(options) else {}
    return branch == {"$ref": "#/$defs/value_ref"} and isinstance(instance, str) and "${" not in instance


def best_error(error: jsonschema.ValidationError) -> jsonschema.ValidationError:
    """For anyOf/oneOf: the error from the branch the author most likely meant."""
    if error.validator not in ("anyOf", "oneOf") or not error.context or error.schema.get("errorMessage"):
        return error
    branches: dict[Any, list] = {}
    for e in error.context:
        branches.setdefault(e.schema_path[0], []).append(e)
    options = error.schema.get(error.validator) or []
    fitting = [
        b
        for idx, b in branches.items()
        if _branch_fits(b, error.instance) and not _unmeant_reference(options, idx, error.instance)
    ]
    pool = [e for b in fitting for e in b] if fitting else list(error.context)
    return best_error(jsonschema.exceptions.best_match(pool))


def _allowed(schema_: dict) -> list[str]:
    return sorted(schema_.get("properties", {}))


def _schema_errors(spec: Spec) -> list[SpecError]:
    out = []
    for raw in validator().iter_errors(spec.data):
        err = best_error(raw)
        path = tuple(err.absolute_path)
        if err.validator == "additionalProperties" and isinstance(err.instance, dict):
            props, pats = err.schema.get("properties", {}), err.schema.get("patternProperties", {})
            extra = [k for k in err.instance if k not in props and not any(re.search(p, k) for p in pats)]
            allowed = _allowed(err.schema)
            for k in extra:
                hint = f"; allowed: {', '.join(allowed)}" if allowed else ""
                out.append(spec.error(path + (k,), f"unknown key {k!r}{hint}", key=True))
            continue
        if "propertyNames" in err.absolute_schema_path and isinstance(err.instance, str):
            # jsonschema reports a bad key at its object; point at the key itself.
            out.append(spec.error(path + (err.instance,), f"bad name {err.instance!r}: {err.message}", key=True))
            continue
        # A schema's errorMessage explains a broken rule; a plain wrong type is clearer in jsonschema's words.
        msg = err.schema.get("errorMessage") if isinstance(err.schema, dict) and err.validator != "type" else None
        out.append(
            spec.error(
                path,
                f"{msg} (got {json.dumps(err.instance)[:80]})"
                if msg and err.validator != "oneOf"
                else msg or err.message,
            )
        )
    return out


def load_spec(path: str | os.PathLike, root: Path | None = None) -> Spec:
    """Load, merge and schema-check a spec; raise SpecErrors listing every problem found. With `root`, the
    spec and every file it extends or includes must resolve inside that directory (links followed)."""
    p = Path(path)
    loader = _Loader(root)
    doc = loader.load(p, (), None)
    likes = resolve_likes(doc)
    if likes:
        raise SpecErrors(likes)
    vals: dict[tuple, Mark] = {}
    keys: dict[tuple, Mark] = {}
    _index_marks(doc, (), vals, keys)
    vals[()] = Mark(display_path(p), 1, 1)
    top = display_path(p)
    spec = Spec(
        path=p, data=_plain(doc), files=dict(loader.files), sha256=loader.files[top], marks=vals, key_marks=keys
    )
    errors = sorted(_schema_errors(spec), key=SpecError.sort_key)
    if errors:
        raise SpecErrors(errors)
    return spec
