"""How often a run's data climbs back up a stage on its way through the engine, traced from real calls.

    python bench/stage_walk.py            # one table per path
    python bench/stage_walk.py --edges    # and every edge counted, under its path
    python bench/stage_walk.py --spec tests/specs/validate/ok_minimal.yaml   # another spec that needs no torch

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
up to the caller's stage: that is one step back up. Each such edge, caller function -> callee
function (module and qualified name), counts once however often it is taken: a leg's million lines
would otherwise count a million times, and the count is of places in the code, not of iterations.
Calls within a stage, or up a stage (the judge the runner is handed), are not counted. A path is every
engine call made, on any thread, while its root function runs on the main thread (the call into the
root itself is not part of it):

    plan through Runner.execute     engine.run.runner  Runner.execute
    spec through recheck            engine.judge.recheck  recheck
    engine run's arguments          engine.cli  cmd_run

The table gives, per path: the engine calls traced, how many times a call went down a stage (taken),
the steps back up (distinct edges), and those by the module they climb out of (the callee's). An
import runs a module's body; that is not a step of the data, and is not counted. A comprehension is
counted as part of the function it is written in (Python 3.11 gives it a frame of its own).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import sys
import tempfile
import threading
from collections import Counter
from pathlib import Path
from types import CodeType, FrameType
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
ENGINE = str(ROOT / "engine") + os.sep
STAGES = ("ground", "expr", "spec", "run", "judge", "show", "diff", "cli")
PATHS = (
    ("plan through Runner.execute", "engine.run.runner", "Runner.execute"),
    ("spec through recheck", "engine.judge.recheck", "recheck"),
    ("engine run's arguments", "engine.cli", "cmd_run"),
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


class Walk:
    """The profiler: every engine call, its caller, and which paths were open when it was made."""

    def __init__(self) -> None:
        self.roots: dict[CodeType, str] = {}
        self.open: list[str] = []  # the paths whose root runs now (main thread)
        self.open_frames: list[FrameType] = []
        self.calls: Counter[str] = Counter()
        self.edges: dict[str, Counter[tuple[str, str, str, str]]] = {name: Counter() for name, _, _ in PATHS}
        self._names: dict[CodeType, tuple[str, str] | None] = {}
        self._main = threading.main_thread()

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
        if event == "return" and self.open_frames and frame is self.open_frames[-1]:
            self.open_frames.pop()
            self.open.pop()
            return
        if event != "call":
            return
        code = frame.f_code
        callee = self._name(code, frame)
        if callee is None:
            return
        if self.open:
            self._count(frame, callee)
        if code in self.roots and threading.current_thread() is self._main:
            # Opened after its own call is counted: the call into a path's root is not part of it.
            self.open.append(self.roots[code])
            self.open_frames.append(frame)

    def _count(self, frame: FrameType, callee: tuple[str, str]) -> None:
        caller_frame = frame.f_back
        caller = None
        while caller_frame is not None:
            caller = self._name(caller_frame.f_code, caller_frame)
            if caller is not None:
                break
            caller_frame = caller_frame.f_back
        down = caller is not None and STAGES.index(stage_of(callee[0])) < STAGES.index(stage_of(caller[0]))
        for label in set(self.open):
            self.calls[label] += 1
            if down:
                self.edges[label][(*caller, *callee)] += 1


def write_spec(folder: Path) -> Path:
    spec = folder / "stage_walk.yaml"
    spec.write_text(SPEC)
    return spec


def walk(folder: Path, spec_path: Path | None = None) -> Walk:
    """`engine run` then `engine check` of the walk's spec (or `spec_path`) in `folder`, traced."""
    from engine.cli import cmd_run, main
    from engine.judge import recheck
    from engine.run import runner

    tracer = Walk()
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
    rows = [("path", "engine calls", "taken", "back up", "back up, by the module climbed out of")]
    for label, _, _ in PATHS:
        edges = tracer.edges[label]
        by_module = Counter(callee_module for _, _, callee_module, _ in edges)
        where = ", ".join(f"{m} {n}" for m, n in by_module.most_common())
        rows.append((label, str(tracer.calls[label]), str(sum(edges.values())), str(len(edges)), where or "-"))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = ["  ".join(f"{c:<{w}}" for c, w in zip(r[:4], widths)) + "  " + r[4] for r in rows]
    if show_edges:
        for label, _, _ in PATHS:
            lines += ["", f"-- {label}"]
            lines += [
                f"   {a}:{b} ({stage_of(a)}) -> {c}:{d} ({stage_of(c)})  x{n}"
                for (a, b, c, d), n in sorted(tracer.edges[label].items())
            ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--edges", action="store_true", help="list every edge counted, under its path")
    parser.add_argument("--spec", type=Path, help="walk this spec instead (it must need no torch)")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    with tempfile.TemporaryDirectory(prefix="stage-walk-") as tmp:
        tracer = walk(Path(tmp), args.spec)
    print(table(tracer, args.edges))
    return 0


if __name__ == "__main__":
    sys.exit(main())
