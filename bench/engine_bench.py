"""Benchmark the engine's own overhead: what it costs on top of the work it supervises.

    python bench/engine_bench.py                                   # validate the default specs + stream overhead
    python bench/engine_bench.py --specs specs/p4_smoke.yaml --check specs/p4_smoke.yaml runs/p4_smoke-smoke-X
    python bench/engine_bench.py --lines 200000 --repeat 5
    python bench/engine_bench.py --specs --lines 0 --review HEAD    # only the `engine review` rows

Prints one table row per measurement (best and median wall seconds of --repeat runs):
  * `engine validate SPEC` for each spec;
  * `engine check SPEC --evidence RUN_DIR` for a saved run (with --check);
  * `engine review --base REV` on this repository, and on a copy of its specs and saved runs whose
    working tree loosens two gates, drops one and changes a leg (every spec loaded on both sides);
  * a leg printing N lines through `engine run` vs the same command piped to /dev/null; the
    difference is what streaming, scanning and logging every line costs; and the same run with
    three secrets in the engine's environment (what the secret filter adds);
  * the secret filter itself, in this process, in CPU seconds (`--no-secrets` skips it): a 1 MiB
    block of short lines and one 3 MiB line, with 3 and with 2,000 secrets, and the run-dir
    scrubber on a 64 MiB file (searched, hashed, only stat()ed) and on a 16 GiB sparse file.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Callable, Sequence

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_SPECS = ("specs/p4_smoke.yaml", "specs/p4_soak.yaml")

STREAM_SPEC = """\
version: 1
name: bench_stream
description: a leg that prints many lines, to time the engine's per-line cost
budget_s: 3600
values:
  lines: {lines}
steps:
  - name: printer
    run:
      argv: ["${{python}}", "{printer}", "${{lines}}"]
      timeout_s: 1800
      output:
        echo_prefixes: ["RUN_JSON "]
        harvest:
          run_json: {{marker: "RUN_JSON ", pick: last}}
checks:
  - name: printer_finished
    why: the leg reached its last line, so every line went through the engine
    expr: "steps.printer.harvest.run_json.n == values.lines"
"""
# Trainer-shaped lines, written as fast as Python can, so the engine is the bottleneck if any.
PRINTER = """\
import json, sys
n = int(sys.argv[1])
w = sys.stdout.write
for i in range(n):
    w("step %d/%d loss 1.2345 lr 3.0e-04 tok/s 1234\\n" % (i, n))
w("RUN_JSON " + json.dumps({"n": n}) + "\\n")
"""


def engine_argv() -> list[str]:
    exe = Path(sys.executable).parent / "engine"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "engine.cli"]


def timed(argv: Sequence[str], cwd: Path, repeat: int, env: dict[str, str] | None = None) -> tuple[float, float, int]:
    """(best, median, last exit code) of `repeat` runs (with `env` added to the environment)."""
    times, rc = [], 0
    full_env = {**os.environ, **(env or {})}
    for _ in range(repeat):
        t0 = time.perf_counter()
        proc = subprocess.run(list(argv), cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=full_env)
        times.append(time.perf_counter() - t0)
        rc = proc.returncode
    return min(times), statistics.median(times), rc


def cpu_timed(
    argv: Sequence[str], cwd: Path, repeat: int, env: dict[str, str] | None = None
) -> tuple[tuple[float, float, int], tuple[float, float, int]]:
    """`timed`'s (best, median, rc) of wall seconds, and the same of CPU seconds (user + system of the
    command): on a machine shared with other work the CPU figure is the steadier one."""
    walls, cpus, rc = [], [], 0
    full_env = {**os.environ, **(env or {})}
    for _ in range(repeat):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        proc = subprocess.run(list(argv), cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=full_env)
        walls.append(time.perf_counter() - t0)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
        rc = proc.returncode
    return (min(walls), statistics.median(walls), rc), (min(cpus), statistics.median(cpus), rc)


def stream_rows(lines: int, repeat: int) -> list[tuple[str, float, float, int]]:
    with tempfile.TemporaryDirectory(prefix="engine-bench-") as tmp:
        work = Path(tmp)
        printer = work / "printer.py"
        printer.write_text(PRINTER)
        spec = work / "bench_stream.yaml"
        spec.write_text(STREAM_SPEC.format(lines=lines, printer=printer))
        plain = timed([sys.executable, str(printer), str(lines)], work, repeat)
        # The same command with its output through a pipe (to `cat`, then /dev/null): what any
        # reader of a leg's output costs the leg, before the engine does anything with the lines.
        piped = timed(["bash", "-c", f'"{sys.executable}" "{printer}" {lines} | cat > /dev/null'], work, repeat)
        # The engine's own stdout goes to /dev/null too, so both sides pay the same terminal cost.
        through = timed(engine_argv() + ["run", str(spec), "--run-dir", str(work / "run"), "--force"], work, repeat)
        # With and without the secrets, one after the other: the CPU seconds of the run (leg and
        # engine; the leg is the same) tell the filter's cost apart from the load of the machine.
        plain_cpu, secret_cpu, secret = [], [], []
        for _ in range(repeat):
            run = engine_argv() + ["run", str(spec), "--run-dir", str(work / "run-s"), "--force"]
            plain_cpu.append(cpu_timed(run, work, 1)[1])
            wall, cpu = cpu_timed(run, work, 1, SECRETS)
            secret_cpu.append(cpu)
            secret.append(wall)
        # The same run with a 1-line leg: the engine's fixed cost (imports, validation, evidence),
        # paid once per run whatever the leg prints; what is left is the per-line cost.
        spec.write_text(STREAM_SPEC.format(lines=1, printer=printer))
        fixed = timed(engine_argv() + ["run", str(spec), "--run-dir", str(work / "run1"), "--force"], work, repeat)
        tiny = timed([sys.executable, str(printer), "1"], work, repeat)
    fixed_cost = (fixed[0] - tiny[0], fixed[1] - tiny[1])
    filter_cpu = [(a[0] - b[0], 0.0, a[2] or b[2]) for a, b in zip(secret_cpu, plain_cpu)]
    per_line = (through[0] - plain[0] - fixed_cost[0], through[1] - plain[1] - fixed_cost[1])
    return [
        (f"{lines:,} lines redirected to /dev/null", *plain),
        (f"{lines:,} lines piped through cat to /dev/null", *piped),
        (f"{lines:,} lines through engine run", *through),
        ("  engine overhead, all of it", through[0] - plain[0], through[1] - plain[1], through[2]),
        ("  of which fixed per run (1-line leg)", *fixed_cost, fixed[2]),
        ("  streaming overhead (the rest)", *per_line, through[2]),
        ("  streaming overhead, % of the leg", 100 * per_line[0] / plain[0], 100 * per_line[1] / plain[1], through[2]),
        (f"{lines:,} lines through engine run, 3 secrets in its environment", *_spread(secret)),
        ("  CPU seconds of that run (leg + engine)", *_spread(secret_cpu)),
        ("  CPU seconds of the same run without a secret", *_spread(plain_cpu)),
        ("  the secret filter's CPU seconds (each pair: with - without)", *_spread(filter_cpu)),
        ("  the same per line, microseconds", *(1e6 * x / lines for x in _spread(filter_cpu)[:2]), 0),
        (
            "  engine vs the piped leg, % (fixed cost excluded)",
            100 * (through[0] - fixed_cost[0] - piped[0]) / piped[0],
            100 * (through[1] - fixed_cost[1] - piped[1]) / piped[1],
            through[2],
        ),
    ]


# Three credentials of the usual shapes: a Hugging Face token, a GitHub token, an AWS secret key.
SECRETS = {
    "HF_TOKEN": "hf_" + "AbCdEfGhIjKlMnOpQrStUvWxYz01234567",
    "GITHUB_TOKEN": "ghs_" + "0123456789abcdefghijABCDEFGHIJ012345",
    "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
}


def _spread(figures: list[tuple[float, float, int]]) -> tuple[float, float, int]:
    """(best, median, last rc) of single-run figures."""
    return min(f[0] for f in figures), statistics.median(f[0] for f in figures), figures[-1][2]


def _best_median(func: Callable[[], object], repeat: int) -> tuple[float, float, int]:
    """CPU seconds of this process: steadier than wall seconds on a shared machine."""
    times = []
    for _ in range(repeat):
        t0 = time.process_time()
        func()
        times.append(time.process_time() - t0)
    return min(times), statistics.median(times), 0


def secret_rows(repeat: int) -> list[tuple[str, float, float, int]]:
    """The secret filter (engine/secret_forms.py) on the shapes that matter: many short lines, one
    3 MiB line (torchrun's tee of a rank's long line), many secrets, a big file in the run dir."""
    from engine.secrets import Scrubber, TreeScrubber

    three = list(SECRETS.values())
    many = three + [f"tok_{i:05d}_{i * 7919:010d}" for i in range(1997)]
    block = "".join("step %d/200000 loss 1.2345 lr 3.0e-04 tok/s 1234\n" % i for i in range(23000))
    long_line = "x" * (3 << 20) + "\n"
    rows = []
    for label, secrets in (("3 secrets", three), ("2,000 secrets", many)):
        t0 = time.process_time()
        scrubber = Scrubber(secrets)
        built = time.process_time() - t0
        rows.append((f"secret filter, {label}: built (CPU s)", built, built, 0))
        rows.append(
            (
                f"  a 1 MiB block of {block.count(chr(10)):,} lines",
                *_best_median(partial(scrubber.scrub, block), repeat),
            )
        )
        rows.append(("  one 3 MiB line", *_best_median(partial(scrubber.scrub, long_line), repeat)))
    # An 'x' in a secret makes the whole 3 MiB line one run of bytes a fragment could be in.
    with_x = Scrubber(three + ["hf_xXxXxXxXxXxX0123456789abcdef"])
    rows.append(
        (
            "  one 3 MiB line of a letter a secret holds (4 secrets)",
            *_best_median(lambda: with_x.scrub(long_line), repeat),
        )
    )
    with tempfile.TemporaryDirectory(prefix="engine-bench-scrub-") as tmp:
        blob = Path(tmp) / "blob.bin"
        blob.write_bytes(os.urandom(64 << 20))
        rows.append(
            (
                "run-dir scrubber, one 64 MiB binary file, 3 secrets: searched",
                *_best_median(lambda: TreeScrubber(tmp, three).scrub(), repeat),
            )
        )
        files = TreeScrubber(tmp, three)
        files.scrub()

        def touched() -> None:
            os.utime(blob)  # new times, the same bytes: hashed, not searched
            files.scrub()

        rows.append(("  again, its times changed (its SHA-256 only)", *_best_median(touched, repeat)))
        time.sleep(2.1)  # its times settle (a file changed in the last 2 s is hashed again)
        files.scrub()
        rows.append(("  again, unchanged (its inode, size and times only)", *_best_median(files.scrub, repeat)))
    with tempfile.TemporaryDirectory(prefix="engine-bench-sparse-") as tmp:

        def sparse() -> None:
            with open(Path(tmp) / "sparse.bin", "wb") as fh:
                fh.truncate(16 << 30)
                fh.seek(8 << 30)
                fh.write(three[0].encode())
            TreeScrubber(tmp, three).scrub()

        rows.append(
            ("  a 16 GiB sparse file holding a secret: found, masked (holes kept)", *_best_median(sparse, repeat))
        )
    return rows


def _drop_last_check(text: str) -> str:
    return text[: text.rindex("\n  - name: ")] + "\n"


# The README's risky change ("Reviewing a spec change"): two gates loosened, one dropped, a leg's argv
# changed. File -> edits, each (old, new) text or a function of the text.
RISKY_CHANGE = {
    "specs/p4_soak.yaml": [("  gc_stall_max_s: 0.1\n", "  gc_stall_max_s: 0.5\n  log_every: 1\n"), _drop_last_check],
    "specs/lib/p4_segment.yaml": [("mul(let.last1, `0.25`)", "mul(let.last1, `0.5`)")],
}


def _git(cwd: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-c", "user.name=bench", "-c", "user.email=bench@localhost", *args],
        cwd=cwd,
        check=True,
        capture_output=True,
    )


def review_rows(base: str, repeat: int) -> list[tuple[str, float, float, int]]:
    wall, cpu = cpu_timed(engine_argv() + ["review", "--base", base], ROOT, repeat)
    rows = [(f"engine review --base {base} (this repository)", *wall), ("  its CPU seconds", *cpu)]
    with tempfile.TemporaryDirectory(prefix="engine-bench-review-") as tmp:
        work = Path(tmp)
        for part in ("specs", "evidence"):
            shutil.copytree(ROOT / part, work / part)
        _git(work, "init", "-q", "-b", "main")
        _git(work, "add", "-A")
        _git(work, "commit", "-q", "-m", "base")
        for name, edits in RISKY_CHANGE.items():
            text = (work / name).read_text()
            for e in edits:
                text = e(text) if callable(e) else text.replace(*e)
            (work / name).write_text(text)
        wall, cpu = cpu_timed(engine_argv() + ["review", "--base", "main"], work, repeat)
        rows += [
            ("engine review --base main (a copy, the README's risky change; rc 0 = it exited 1)", *_risky(wall)),
            ("  its CPU seconds", *_risky(cpu)),
        ]
    return rows


def _risky(figures: tuple[float, float, int]) -> tuple[float, float, int]:
    """A review of the risky copy succeeds by exiting 1 (risky changes found): that is its row's rc 0;
    0 (nothing found) or 2 (invalid) is its failure."""
    best, median, rc = figures
    return best, median, 0 if rc == 1 else (rc or 1)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--specs", nargs="*", default=list(DEFAULT_SPECS), help="specs to validate")
    parser.add_argument("--check", nargs=2, metavar=("SPEC", "RUN_DIR"), help="time engine check on a saved run")
    parser.add_argument("--lines", type=int, default=1_000_000, help="lines the streaming leg prints")
    parser.add_argument("--review", metavar="REV", help="time engine review --base REV (and on a risky copy)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--secrets", action=argparse.BooleanOptionalAction, default=True, help="time the secret filter (in-process)"
    )
    args = parser.parse_args(argv)

    rows: list[tuple[str, float, float, int]] = []
    for spec in args.specs:
        rows.append((f"engine validate {spec}", *timed(engine_argv() + ["validate", spec], ROOT, args.repeat)))
    if args.check:
        spec, run_dir = args.check
        with tempfile.TemporaryDirectory(prefix="engine-bench-check-") as tmp:
            # A copy: every `engine check` leaves a check-<stamp>.json record beside the evidence.
            copy = Path(tmp) / Path(run_dir).name
            shutil.copytree(ROOT / run_dir, copy)
            rows.append(
                (
                    f"engine check {spec}",
                    *timed(engine_argv() + ["check", spec, "--evidence", str(copy)], ROOT, args.repeat),
                )
            )
    if args.review:
        rows.extend(review_rows(args.review, args.repeat))
    if args.lines > 0:
        rows.extend(stream_rows(args.lines, args.repeat))
    if args.secrets:
        rows.extend(secret_rows(args.repeat))

    width = max(len(r[0]) for r in rows)
    print(f"{'measurement'.ljust(width)}  {'best s':>8}  {'median s':>8}  rc")
    for name, best, median, rc in rows:
        print(f"{name.ljust(width)}  {best:8.3f}  {median:8.3f}  {rc}")
    failed = sorted({name.strip() for name, *_, rc in rows if rc != 0})
    if failed:  # a refused or failed command is timed all the same: its figures measure nothing
        print(f"FAILED (rc != 0, figures void): {'; '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
