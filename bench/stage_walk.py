"""How often a run's data climbs back up a stage on its way through the engine, traced from real calls.

    python bench/stage_walk.py            # one table per path
    python bench/stage_walk.py --edges    # and every edge counted, under its path
    python bench/stage_walk.py --spec tests/specs/validate/ok_minimal.yaml   # another spec that needs no torch
    python bench/stage_walk.py --strict --sites --own   # other readings of "a step back up" (below)

It writes a small spec that needs no torch (three `python -c` legs, one of them failing with
diagnostics, a `command` collector, a `json_file` collector, a `remove` step; a secret in a value fed
from the environment and another in the engine's environment, printed by the legs and written into
the run dir), runs `engine run` on it in this process, then `engine check` of the saved run, both
under `sys.setprofile` (and `threading.setprofile`, for the threads that read a leg's output).

Each frame of a function defined under engine/ gets the stage of its module, from the ground up:
ground < expr < spec < run < judge < show < diff < cli (the stages of
tests/test_engine/test_layering.py; engine's top-level modules are the ground).

How it counts. The nearest engine frame below a called engine function on its thread's stack is its
caller. A call whose callee stands on a lower stage than its caller goes down; its return climbs back
up to the caller's stage. Each such edge, caller function -> callee function (module and qualified
name), counts once however often it is taken: a leg's million lines would otherwise count a million
times, and the count is of places in the code, not of iterations. Calls within a stage, or up a stage
(the judge the runner is handed), are not counted. A path is every engine call made, on any thread,
while its root function runs on the main thread (the call into the root itself is not part of it),
and each path follows one piece of data, named from the root's frame:

    plan through Runner.execute     engine.run.runner  Runner.execute   self.plan
    spec through recheck            engine.judge.recheck  recheck       spec
    engine run's arguments          engine.cli  cmd_run                 args

A step back up is an edge down that carries the data followed: one of the call's arguments (self
included) is that data, an object it holds, or what a call handed any of them returned (a constructor:
the object it built). Identity is what is followed, so a value computed in place (an f-string, a sum)
is new data, and scalars (numbers, one-letter strings) are never followed: unrelated code shares them.

The table gives, per path: the engine calls traced, how many times a call went down a stage (taken),
every edge down (down: what calls a ground utility with a leg's text counts too), the steps back up
(distinct edges that carried the data), and those by the module they climb out of (the callee's). An
import runs a module's body; that is not a step of the data, and is not counted. A comprehension is
counted as part of the function it is written in (Python 3.11 gives it a frame of its own).

Other readings, each a flag, for comparing with a count made by another method: `--strict` follows only
the data and what it holds, not what calls handed it returned (a scrubber built from the plan is then not
the plan); `--sites` counts distinct call sites (the caller's line) instead of function edges; `--own`
counts only the calls made by the root's own module (the runner's, the re-check's, the cli's lines).
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import io
import os
import sys
import tempfile
import threading
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from types import CodeType, FrameType, FunctionType, MethodType, ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
ENGINE = str(ROOT / "engine") + os.sep
STAGES = ("ground", "expr", "spec", "run", "judge", "show", "diff", "cli")
# (label, module, function, the data followed: a name in the root's frame, then attributes)
PATHS = (
    ("plan through Runner.execute", "engine.run.runner", "Runner.execute", ("self", "plan")),
    ("spec through recheck", "engine.judge.recheck", "recheck", ("spec",)),
    ("engine run's arguments", "engine.cli", "cmd_run", ("args",)),
)
COMPREHENSIONS = (".<locals>.<listcomp>", ".<locals>.<genexpr>", ".<locals>.<dictcomp>", ".<locals>.<setcomp>")
TOKEN = "hf_walkSECRETwalkSECRETwalk0123"
VALUE_SECRET = "apikey-walk-0123456789abcdef"

SPEC = """\
version: 1
name: stage_walk
budget_s: 600
env: {WALK_API_KEY: api_key}
values:
  api_key: none
  loss_ceiling: 5.0
steps:
  - name: leg1
    run:
      argv: ["${python}", "-c", "import os; t = os.environ['HF_TOKEN']; print('token', t); \
print('RUN_JSON {\\"loss\\": 1.5, \\"steps\\": 4}'); print('step 2 of 4'); \
open('${run_dir}/rank0.log', 'w').write('rank 0 sees ' + t + '\\\\n')"]
      timeout_s: 60
      output:
        harvest:
          run_json: {marker: "RUN_JSON "}
  - name: state
    collect:
      collector: command
      args: {argv: ["${python}", "-c", "print('{\\"key\\": \\"${api_key}\\", \\"n\\": 3}')"]}
  - name: scratch
    collect:
      collector: json_file
      args: {path: "${run_dir}/scratch.json"}
  - name: wipe
    remove: ["${run_dir}/scratch.json"]
  - name: leg2
    run:
      argv: ["${python}", "-c", "import sys; print('key ${api_key}'); print('Traceback: boom'); sys.exit(3)"]
      timeout_s: 60
      ok_exit_codes: [0, 3]
  - name: leg3
    run:
      argv: ["${python}", "-c", "import sys; print('RUN_JSON {\\"loss\\": 9.0}'); sys.exit(1)"]
      timeout_s: 60
      output:
        harvest:
          run_json: {marker: "RUN_JSON "}
      on_failure:
        diagnostics: {dir: "${run_dir}/logs"}
checks:
  - name: leg1_loss
    why: The first leg's loss is under the ceiling.
    expr: "steps.leg1.harvest.run_json.loss < values.loss_ceiling"
  - name: state_read
    why: The collector read its document.
    expr: "state.state.n == `3`"
  - name: leg3_loss
    why: The third leg's loss is under the ceiling (it is not, on purpose).
    expr: "steps.leg3.harvest.run_json.loss < values.loss_ceiling"
"""


def stage_of(module: str) -> str:
    parts = module.split(".")
    if len(parts) >= 2 and parts[1] in STAGES:
        return parts[1]
    return "ground"


class Taint:
    """The objects a path's followed data reached: its root argument, what it holds, and what any call
    that was handed one of them returned (a constructor: the object it built). Kept alive, so that an
    id is never reused by another object while the walk runs."""

    def __init__(self) -> None:
        self._held: dict[int, Any] = {}

    def add(self, obj: Any, depth: int = 6) -> None:
        todo = [(obj, depth)]
        while todo and len(self._held) < 200_000:
            item, left = todo.pop()
            if not _followable(item) or id(item) in self._held:
                continue
            self._held[id(item)] = item
            if left == 0:
                continue
            todo += [(child, left - 1) for child in _children(item)]

    def holds(self, values: list[Any]) -> bool:
        return any(id(value) in self._held and _followable(value) for value in values)


def _followable(obj: Any) -> bool:
    """Whether an object can carry the data by identity: a scalar (an int, a one-letter string) is
    shared by unrelated code, and a function or a module is code, not data."""
    if obj is None or isinstance(obj, (bool, int, float, complex, type, ModuleType, FunctionType, MethodType)):
        return False
    return not isinstance(obj, (str, bytes)) or len(obj) > 1


def _children(obj: Any) -> list[Any]:
    if isinstance(obj, Mapping):
        return [*obj.keys(), *obj.values()]
    if isinstance(obj, (list, tuple, set, frozenset)):
        return list(obj)
    if isinstance(obj, (str, bytes, io.IOBase)) or not hasattr(obj, "__dict__"):
        return []
    return list(vars(obj).values())


def _arguments(frame: FrameType) -> list[Any]:
    """The values a call was handed: its parameters (self included), *args' items, **kwargs' values."""
    code, local = frame.f_code, frame.f_locals
    n = code.co_argcount + code.co_kwonlyargcount
    values = [local[name] for name in code.co_varnames[:n] if name in local]
    if code.co_flags & inspect.CO_VARARGS:
        values += list(local.get(code.co_varnames[n], ()))
        n += 1
    if code.co_flags & inspect.CO_VARKEYWORDS:
        values += list(local.get(code.co_varnames[n], {}).values())
    return values


class Walk:
    """The profiler: every engine call, its caller, which paths were open when it was made, and which
    of them it carried the followed data of."""

    def __init__(self, strict: bool = False, sites: bool = False, own: bool = False) -> None:
        self.strict, self.sites, self.own = strict, sites, own
        self.roots: dict[CodeType, str] = {}
        self.open: list[str] = []  # the paths whose root runs now (main thread)
        self.open_frames: list[FrameType] = []
        self.calls: Counter[str] = Counter()
        self.edges: dict[str, Counter[tuple[str, str, str, str]]] = {name: Counter() for name, *_ in PATHS}
        self.carried: dict[str, Counter[tuple[str, str, str, str]]] = {name: Counter() for name, *_ in PATHS}
        self.taint: dict[str, Taint] = {name: Taint() for name, *_ in PATHS}
        self._follows = {name: follows for name, _, _, follows in PATHS}
        self._carrying: dict[FrameType, list[str]] = {}
        self._names: dict[CodeType, tuple[str, str] | None] = {}
        self._main = threading.main_thread()
        self._root_module = {name: module for name, module, _, _ in PATHS}

    def add_root(self, label: str, func: Any) -> None:
        self.roots[func.__code__] = label

    def _name(self, code: CodeType, frame: FrameType) -> tuple[str, str] | None:
        """(module, qualified name) of an engine function, None for any other code."""
        if code not in self._names:
            if not code.co_filename.startswith(ENGINE) or code.co_name == "<module>":
                self._names[code] = None  # an import runs a module's body: not a step of the data
            else:
                module = frame.f_globals.get("__name__", "?")
                qualname = getattr(code, "co_qualname", code.co_name)
                # A comprehension is a frame of its own before Python 3.12, and part of its function.
                while qualname.endswith(COMPREHENSIONS):
                    qualname = qualname.rsplit(".<locals>.", 1)[0]
                self._names[code] = (module, qualname)
        return self._names[code]

    def profile(self, frame: FrameType, event: str, arg: Any) -> None:
        if event == "return":
            self._returned(frame, arg)
            return
        if event != "call" or not (self.open or frame.f_code in self.roots):
            return
        code = frame.f_code
        carried = self._carries(frame) if self.open and code.co_name != "<module>" else []
        callee = self._name(code, frame)
        if callee is not None and self.open:
            self._count(frame, callee, carried)
        if code in self.roots and threading.current_thread() is self._main:
            # Opened after its own call is counted: the call into a path's root is not part of it.
            label = self.roots[code]
            self.open.append(label)
            self.open_frames.append(frame)
            obj = frame.f_locals
            for name in self._follows[label]:
                obj = obj[name] if isinstance(obj, Mapping) else getattr(obj, name)
            self.taint[label].add(obj)

    def _carries(self, frame: FrameType) -> list[str]:
        values = _arguments(frame)
        carried = [label for label in set(self.open) if self.taint[label].holds(values)]
        if carried:
            self._carrying[frame] = carried
        return carried

    def _returned(self, frame: FrameType, value: Any) -> None:
        carried = self._carrying.pop(frame, None)
        if carried and not self.strict:
            built = frame.f_locals.get("self") if frame.f_code.co_name == "__init__" else value
            for label in carried:
                self.taint[label].add(built)
        if self.open_frames and frame is self.open_frames[-1]:
            self.open_frames.pop()
            self.open.pop()

    def _count(self, frame: FrameType, callee: tuple[str, str], carried: list[str]) -> None:
        caller_frame = frame.f_back
        caller = None
        while caller_frame is not None:
            caller = self._name(caller_frame.f_code, caller_frame)
            if caller is not None:
                break
            caller_frame = caller_frame.f_back
        down = caller is not None and STAGES.index(stage_of(callee[0])) < STAGES.index(stage_of(caller[0]))
        edge = (*caller, *callee) if caller is not None else None
        if edge is not None and self.sites:
            edge = (caller[0], f"{caller[1]}:{caller_frame.f_lineno}", *callee)
        for label in set(self.open):
            self.calls[label] += 1
            if not down or (self.own and caller[0] != self._root_module[label]):
                continue
            self.edges[label][edge] += 1
            if label in carried:
                self.carried[label][edge] += 1


def write_spec(folder: Path) -> Path:
    spec = folder / "stage_walk.yaml"
    spec.write_text(SPEC)
    return spec


def walk(folder: Path, spec_path: Path | None = None, **reading: bool) -> Walk:
    """`engine run` then `engine check` of the walk's spec (or `spec_path`) in `folder`, traced; `reading`
    holds Walk's flags."""
    from engine.cli import cmd_run, main
    from engine.judge import recheck
    from engine.run import runner

    tracer = Walk(**reading)
    tracer.add_root(PATHS[0][0], runner.Runner.execute)
    tracer.add_root(PATHS[1][0], recheck.recheck)
    tracer.add_root(PATHS[2][0], cmd_run)
    spec = spec_path.resolve() if spec_path else write_spec(folder)
    (folder / "r").mkdir()
    (folder / "r" / "scratch.json").write_text('{"from": "before the run"}')
    saved_env, saved_cwd = dict(os.environ), os.getcwd()
    os.environ.update({"HF_TOKEN": TOKEN, "WALK_API_KEY": VALUE_SECRET})
    os.chdir(folder)
    out = io.StringIO()
    codes = []
    try:
        threading.setprofile(tracer.profile)
        sys.setprofile(tracer.profile)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            codes.append(main(["run", str(spec), "--run-dir", "r", "--force"]))
            codes.append(main(["check", str(spec), "--evidence", "r"]))
    finally:
        sys.setprofile(None)
        threading.setprofile(None)  # type: ignore[arg-type]
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)
    shown = out.getvalue()
    if (codes != [5, 5] and spec_path is None) or TOKEN in shown or VALUE_SECRET in shown:
        raise SystemExit(f"the walk's run did not go as planned (exit codes {codes}):\n{shown}")
    return tracer


def table(tracer: Walk, show_edges: bool) -> str:
    rows = [("path", "engine calls", "taken", "down", "back up", "back up, by the module climbed out of")]
    for label, *_ in PATHS:
        edges, carried = tracer.edges[label], tracer.carried[label]
        by_module = Counter(callee_module for _, _, callee_module, _ in carried)
        where = ", ".join(f"{m} {n}" for m, n in by_module.most_common())
        rows.append(
            (
                label,
                str(tracer.calls[label]),
                str(sum(edges.values())),
                str(len(edges)),
                str(len(carried)),
                where or "-",
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    lines = ["  ".join(f"{c:<{w}}" for c, w in zip(r[:5], widths)) + "  " + r[5] for r in rows]
    if show_edges:
        for label, *_ in PATHS:
            lines += ["", f"-- {label} (* carries the data followed: a step back up)"]
            lines += [
                f" {'*' if (a, b, c, d) in tracer.carried[label] else ' '} {a}:{b} ({stage_of(a)}) -> "
                f"{c}:{d} ({stage_of(c)})  x{n}"
                for (a, b, c, d), n in sorted(tracer.edges[label].items())
            ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--edges", action="store_true", help="list every edge counted, under its path")
    parser.add_argument("--spec", type=Path, help="walk this spec instead (it must need no torch)")
    parser.add_argument(
        "--strict", action="store_true", help="follow the data and what it holds, not what calls returned"
    )
    parser.add_argument("--sites", action="store_true", help="count call sites (caller lines), not function edges")
    parser.add_argument("--own", action="store_true", help="count only the calls made by the root's own module")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    with tempfile.TemporaryDirectory(prefix="stage-walk-") as tmp:
        tracer = walk(Path(tmp), args.spec, strict=args.strict, sites=args.sites, own=args.own)
    print(table(tracer, args.edges))
    return 0


if __name__ == "__main__":
    sys.exit(main())
