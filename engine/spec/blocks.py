"""What validation refuses in a step's `reference:` and `snapshot:` blocks beyond their schema: as
written (which kind of step may carry which), then per mode once resolved (a reference directory the
engine could not safely empty or that changes from run to run, a kept folder outside it, a snapshot
that would hold the run dir itself).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from engine.spec.load import Spec
from engine.spec.located import SpecError
from engine.spec.plan import KINDS, default_builtins, resolve_step, step_definition
from engine.spec.values import layer, resolve
from engine.text import definition_changes

# Builtins of another run: a reference whose definition differs under them could never be reused.
OTHER_RUN = {"run_id": "20000101T000000Z", "run_dir": "/specprobe-another-run/runs/spec-20000101T000000Z"}


def _kind(raw: Mapping[str, Any]) -> str | None:
    return next((k for k in KINDS if k in raw), None)


def written_errors(spec: Spec) -> list[SpecError]:
    """The blocks as written: a run step that is a reference names its directory (`dir`), a
    collect step belongs to one (`of`, an earlier run step that is a reference); only run steps
    take snapshots."""
    errors: list[SpecError] = []
    references: list[str] = []
    earlier: list[str] = []
    for i, raw in enumerate(spec.data.get("steps") or []):
        kind, name = _kind(raw), raw.get("name")
        ref = raw.get("reference")
        if isinstance(ref, dict):
            errors += _reference_errors(spec, i, kind, ref, references, earlier)
            if kind == "run" and "dir" in ref:
                references.append(str(name))
        if raw.get("snapshot") is not None and kind != "run":
            errors.append(
                spec.error(
                    ("steps", i, "snapshot"),
                    f"step {name!r} is a {kind} step: only a run step takes a snapshot (of what its leg "
                    f"changes, for `engine run --from {name}` to restore)",
                )
            )
        earlier.append(str(name))
    return errors


def _reference_errors(
    spec: Spec, i: int, kind: str | None, ref: Mapping[str, Any], references: list[str], earlier: list[str]
) -> list[SpecError]:
    where = ("steps", i, "reference")
    if kind == "run":
        if "of" in ref:
            return [spec.error(where, "a run step's reference block names its own directory (dir), not `of`")]
        if "dir" not in ref:
            return [spec.error(where, "a run step that is a reference names its directory: reference.dir")]
        return []
    if kind == "collect":
        extra = sorted(k for k in ref if k != "of")
        if extra or "of" not in ref:
            return [
                spec.error(
                    where,
                    "a collect step belongs to a reference through `of: <its run step>` alone"
                    + (f"; {', '.join(extra)} belong to that run step" if extra else ""),
                )
            ]
        target = ref["of"]
        if target in references:
            return []
        why = (
            f"{target!r} is not a reference (it has no reference.dir)"
            if target in earlier
            else f"no earlier step is named {target!r}; the references before it: {', '.join(references) or 'none'}"
        )
        return [spec.error(where + ("of",), f"reference.of names {target!r}: {why}")]
    return [spec.error(where, f"a {kind} step cannot be part of a reference: it would change what the reference keeps")]


def _under(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def resolved_errors(
    spec: Spec, steps: Sequence[tuple[int, Mapping[str, Any]]], run_dir: str | os.PathLike[str]
) -> list[SpecError]:
    """Per mode, the resolved blocks: each reference directory is its own, one the engine may
    empty before making a new reference, and holds what it keeps; no snapshot holds the run dir."""
    errors: list[SpecError] = []
    dirs: dict[Path, str] = {}
    run = Path(os.path.abspath(run_dir))
    for i, step in steps:
        ref = step.get("reference") or {}
        if ref.get("dir"):
            root = Path(os.path.abspath(os.path.expanduser(str(ref["dir"]))))
            problem = _dir_problem(root, run)
            if root in dirs:
                problem = f"it is also the directory of the reference {dirs[root]!r}; each reference needs its own"
            dirs.setdefault(root, step["name"])
            if problem:
                errors.append(spec.error(("steps", i, "reference", "dir"), f"reference dir {root}: {problem}"))
            for j, kept in enumerate(ref.get("keep") or []):
                path = Path(os.path.abspath(root / os.path.expanduser(str(kept))))
                if not _under(path, root):
                    errors.append(
                        spec.error(
                            ("steps", i, "reference", "keep", j),
                            f"kept path {path} is not under the reference dir {root}: a reference keeps only what it owns",
                        )
                    )
        for given in (step.get("snapshot") or {}).get("paths") or []:
            path = Path(os.path.abspath(os.path.expanduser(str(given))))
            if _under(run, path):
                errors.append(
                    spec.error(
                        ("steps", i, "snapshot"),
                        f"snapshot path {path} holds the run dir {run}, where snapshots are kept: name the "
                        f"folders the leg changes",
                    )
                )
    return errors


def _dir_problem(root: Path, run: Path) -> str | None:
    """Why the engine may not make a reference in `root` (it empties it first), or None."""
    cwd, home = Path.cwd(), Path(os.path.abspath(os.path.expanduser("~")))
    if _under(cwd, root) or _under(home, root):
        return "it is (or holds) the working directory or the home directory, which a new reference would empty"
    if _under(root, run) or _under(run, root):
        return "it is the run dir, or inside it, or holds it: a reference outlives the run that makes it"
    return None


def run_dependence_errors(
    spec: Spec,
    mode: str,
    environ: Mapping[str, str],
    steps: Sequence[tuple[int, Mapping[str, Any]]],
) -> list[SpecError]:
    """A reference whose definition reads the run (its run_dir or run_id, directly or through a
    value): resolved as another run would resolve it, it differs, so no run could ever reuse it."""
    refs = [(i, s) for i, s in steps if (s.get("reference") or {}).get("dir")]
    if not refs:
        return []
    other = {**default_builtins(spec, mode), **OTHER_RUN}
    res = resolve(layer(spec.data, mode, environ, {}, other), spec.locate)
    if res.errors:
        return []
    errors = []
    raw_steps = spec.data.get("steps") or []
    for i, step in refs:
        again, problems = resolve_step(spec, i, raw_steps[i], res.values, mode)
        if problems or not again:
            continue
        moved = definition_changes(step_definition(step), step_definition(again))
        if moved:
            shown = "; ".join(moved[:3]) + (f"; and {len(moved) - 3} more" if len(moved) > 3 else "")
            errors.append(
                spec.error(
                    ("steps", i, "reference"),
                    f"step {step['name']!r} is a reference, but its definition changes from run to run "
                    f"({shown}): it reads run_dir or run_id, so no run could reuse it; derive what it "
                    f"reads and writes from values that stay (work_dir, spec_dir)",
                )
            )
    return errors
