"""Shared helpers for tests that drive the real trainer (`python -m trainer.train`) under torchrun.

Import as `from trainer_helpers import ...` (pytest puts tests/ on sys.path). Everything here runs real
processes: a synthetic mix built by `python -m trainer.data.mix`, torchrun with gloo ranks on CPU, a local
file:// store, and real signals.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import re
import shlex
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from filelock import FileLock
from processes import descendants, kill_tree, start_job

from trainer.runconfig import RunIdentity

REPO_ROOT = Path(__file__).resolve().parents[1]
PYTHON = sys.executable
TORCHRUN = str(Path(sys.executable).with_name("torchrun"))
TEE = re.compile(r"^\[(?:default|rank|worker)\d*\]:\s*")  # torchrun --tee prefix

# The tiny CPU recipe: 2 ranks x micro 2 x accum 2 x seq 32 = 256 tokens per step.
NPROC = 2
SEQ_LEN, MICRO, ACCUM = 32, 2, 2
TOKENS_PER_STEP = NPROC * MICRO * ACCUM * SEQ_LEN
# A valid command line of the tiny recipe (6 steps on 2 ranks) whose paths lead nowhere: for what the trainer
# decides from its arguments alone, before it reads a mix or a store.
PLAN_ARGS = shlex.split(
    "--root /nonexistent/mix --out /tmp/x --hub-repo file:///tmp/s/o/n --model tiny --seq-len 32 --micro-batch 2 "
    "--accum 2 --tokens 1536"
)

# A run's identity for the tests of the checkpoint protocol that push and resume without training: what their
# pointers and trainer_state.json files carry.
RUN_CONFIG = {
    "mix": "0" * 64,
    "model": "tiny",
    "seq_len": 64,
    "micro_batch": 2,
    "accum": 1,
    "world_size": 1,
    "tokens": 2560,
    "lr": 3e-4,
    "min_lr": 3e-5,
    "warmup_steps": 2,
    "weight_decay": 0.1,
    "grad_clip": 1.0,
    "seed": 1,
    "schedule": "cosine",
    "precision": "fp32",
    "numerics": {"bf16_residual": True, "fp32_wgrad": True, "addmm_fp32": True},
}
IDENTITY = RunIdentity(RUN_CONFIG)


def build_tiny_mix(
    out: Path, *, tokens: int = 60_000, val_tokens: int = 4_000, vocab: int = 512, seed: int = 0
) -> Path:
    """A synthetic mix for the `tiny` geometry, built by the real CLI; returns its root."""
    cmd = [PYTHON, "-m", "trainer.data.mix", "build", "--out", str(out), "--synthetic", "--shards", "2"]
    cmd += shlex.split(f"--tokens {tokens} --val-tokens {val_tokens} --vocab {vocab} --seed {seed}")
    r = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        raise RuntimeError(f"mix build failed ({r.returncode}):\n{r.stdout}\n{r.stderr}")
    return out


def store_url(root: Path, name: str = "probe/ckpt") -> str:
    return f"file://{root}/{name}"


def trainer_args(
    *,
    root: Path,
    out: Path,
    repo: str,
    steps: int,
    push_every: int,
    stop: int = 0,
    resume: str = "auto",
    val_tokens: int = 256,
    lr: float = 3e-3,
    extra: Sequence[str] = (),
    nproc: int = NPROC,
) -> list[str]:
    """The reference probe's command line (tiny geometry, CPU sizes), without the launcher."""
    tps = nproc * MICRO * ACCUM * SEQ_LEN
    paths = ["--root", str(root), "--out", str(out), "--hub-repo", repo]  # one token each, whatever they hold
    options = shlex.split(
        f"--prune --model tiny --seq-len {SEQ_LEN} --attn eager --no-grad-ckpt --micro-batch {MICRO} "
        f"--accum {ACCUM} --tokens {steps * tps} --lr {lr} --warmup-steps 2 --push-every-steps {push_every} "
        f"--val-tokens {val_tokens} --log-every 1 --resume {resume} --stop-after-steps {stop}"
    )
    return [*paths, *options, *extra]


def torchrun_cmd(args: Sequence[str], *, nproc: int = NPROC, log_dir: Path | None = None) -> list[str]:
    cmd = [TORCHRUN, "--standalone", f"--nproc_per_node={nproc}"]
    if log_dir is not None:
        cmd += ["--redirects", "3", "--tee", "3", "--log-dir", str(log_dir)]
    return [*cmd, "-m", "trainer.train", *args]


def single_cmd(args: Sequence[str]) -> list[str]:
    return [PYTHON, "-m", "trainer.train", *args]


def trainer_cli(
    *args: str, env: dict[str, str] | None = None, module: str = "trainer.train"
) -> subprocess.CompletedProcess[str]:
    """`python -m MODULE ARGS` (the trainer by default) in one process, for what it decides before any work (a
    usage error, exit 2; a preflight); `env`, when given, is its whole environment."""
    command = [PYTHON, "-m", module, *args]
    return subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=120, env=env)


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"
    env["OMP_NUM_THREADS"] = "1"
    env.pop("HF_TOKEN", None)
    return env


@dataclass
class Run:
    rc: int
    lines: list[str]
    seconds: float
    killed_at: str | None = None
    stderr: str = ""
    run_json: dict | None = field(default=None)

    @property
    def text(self) -> str:
        return "\n".join(self.lines)

    def starting(self, prefix: str) -> list[str]:
        return [line for line in self.lines if line.startswith(prefix)]


def run_trainer(
    cmd: Sequence[str],
    *,
    kill_on: str | None = None,
    timeout: float = 180,
    on_line: Callable[[str], None] | None = None,
    env: dict[str, str] | None = None,
    kill_after: str | None = None,
    cwd: Path = REPO_ROOT,
) -> Run:
    """Run a trainer command in its own process group; output merged, torchrun's tee prefix stripped.

    kill_on: a regex; at the first output line matching it torchrun and every rank get SIGKILL (a real
    crash at that phase: no handler, no flush, no cleanup); with kill_after, only a match after a line
    matching kill_after counts (the second push of a step: final/). on_line: called with every line as it
    arrives (to change the world at a precise phase, e.g. break the store). env: set on top of the
    test environment. cwd: where it runs (the checkout by default)."""
    t0 = time.time()
    p = start_job(cmd, cwd=cwd, env={**_env(), **(env or {})})
    lines: list[str] = []
    killed_at = None
    pat = re.compile(kill_on) if kill_on else None
    armed_by = re.compile(kill_after) if kill_after else None
    # A watchdog, not a per-line check: a hung rank prints nothing, and then no line would ever come.
    timed_out = threading.Event()

    hung: list[str] = []

    def _expire() -> None:
        timed_out.set()
        for q in [p.pid, *descendants(p.pid)]:  # where each process sat, for the failure message
            try:
                cmdline = Path(f"/proc/{q}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:120]
                hung.append(f"pid {q} wchan={Path(f'/proc/{q}/wchan').read_text()} {cmdline}")
            except OSError:
                pass
        kill_tree(p.pid)

    watchdog = threading.Timer(timeout, _expire)
    watchdog.daemon = True
    watchdog.start()
    try:
        assert p.stdout is not None
        for raw in p.stdout:
            line = TEE.sub("", raw.rstrip("\n"), count=1)
            lines.append(line)
            if on_line is not None:
                on_line(line)
            if armed_by is not None and armed_by.search(line):
                armed_by = None
                continue
            if pat is not None and killed_at is None and armed_by is None and pat.search(line):
                killed_at = line
                kill_tree(p.pid)
        rc = p.wait()
    except BaseException:
        kill_tree(p.pid)
        p.wait()
        raise
    finally:
        watchdog.cancel()
    if timed_out.is_set():
        raise TimeoutError(
            f"{' '.join(cmd)} ran past {timeout}s (hung?); processes: {hung}; last lines:\n" + "\n".join(lines[-30:])
        )
    if killed_at is not None:
        # Reap the whole tree before the caller touches the store: no rank may still be writing.
        for _ in range(100):
            if not descendants(p.pid):
                break
            kill_tree(p.pid)
            time.sleep(0.05)
    run = Run(rc=rc, lines=lines, seconds=time.time() - t0, killed_at=killed_at)
    for line in reversed(lines):
        if line.startswith("RUN_JSON "):
            run.run_json = json.loads(line[len("RUN_JSON ") :])
            break
    return run


def repo_dir(url: str) -> Path:
    assert url.startswith("file://"), url
    return Path(url[len("file://") :])


def open_repo(url: str):
    from trainer.store.url import open_store

    return open_store(url)


def pointer(url: str) -> dict | None:
    from trainer.ckpt.checkpointer import read_pointer
    from trainer.store import RepoMissing

    try:
        p = read_pointer(open_repo(url))
    except RepoMissing:
        return None
    return None if p is None else p.to_json()


def weights_sha256(url: str, path: str = "final/model.safetensors") -> str:
    """sha256 of the stored bytes of `path` (re-read, not the recorded metadata)."""
    data = open_repo(url).read_bytes(path)
    return hashlib.sha256(data).hexdigest()


def repo_files(url: str) -> list[str]:
    return sorted(open_repo(url).list_files())


def copy_repo(src_url: str, dst_root: Path, name: str = "probe/ckpt") -> str:
    """A byte copy of a local store repo (to corrupt or extend without touching the original)."""
    dst = dst_root / name
    shutil.copytree(repo_dir(src_url), dst)
    return store_url(dst_root, name)


def losses(run: Run) -> dict[str, float]:
    assert run.run_json is not None, "no RUN_JSON:\n" + run.text[-3000:]
    return run.run_json["losses"]


def explain(run: Run) -> str:
    return f"rc={run.rc} after {run.seconds:.1f}s; last lines:\n" + "\n".join(run.lines[-40:])


_SHARED: dict[str, object] = {}


def shared(key: str, tmp_path_factory, build):
    """Build an expensive artifact once per pytest session, whichever test (and whichever xdist worker)
    asks first: built under a file lock in the directory every worker's temp dir lives in, pickled there,
    and loaded by the others (pytest-xdist's recipe). Callers read the artifact and copy what they change."""
    if key in _SHARED:
        return _SHARED[key]
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the session's directory, above each worker's own
    done = root / f"shared-{key}.pickle"
    with FileLock(str(root / f"shared-{key}.lock")):
        if done.exists():
            value = pickle.loads(done.read_bytes())
        else:
            where = root / f"shared-{key}"
            shutil.rmtree(where, ignore_errors=True)  # what a builder that failed left behind
            where.mkdir()
            value = build(where)
            done.write_bytes(pickle.dumps(value))
    _SHARED[key] = value
    return value


def tiny_mix(tmp_path_factory) -> Path:
    return shared("mix", tmp_path_factory, lambda d: build_tiny_mix(d / "mix"))


BASELINE_STEPS, BASELINE_PUSH_EVERY = 6, 2


@dataclass
class Baseline:
    mix: Path
    repo: str
    run: Run
    final_sha: str

    def args(self, out: Path, repo: str, **options) -> list[str]:
        """A session of the baseline's recipe (its mix, steps and pushes) writing to `out` and `repo`; `options`
        are trainer_args' others (a stop, a resume, a launcher's rank count, extra flags)."""
        return trainer_args(
            root=self.mix, out=out, repo=repo, steps=BASELINE_STEPS, push_every=BASELINE_PUSH_EVERY, **options
        )


def baseline(tmp_path_factory, *, nproc: int = NPROC) -> Baseline:
    """The uninterrupted reference run: 6 steps, push every 2, one session to the horizon; under torchrun with
    2 ranks, or with ``nproc=1`` in one plain process (`single_cmd`), the baseline of one-process sessions."""
    mix = tiny_mix(tmp_path_factory)

    def build(d: Path) -> Baseline:
        repo = store_url(d / "store")
        args = trainer_args(
            root=mix, out=d / "out", repo=repo, steps=BASELINE_STEPS, push_every=BASELINE_PUSH_EVERY, nproc=nproc
        )
        r = run_trainer(torchrun_cmd(args) if nproc == NPROC else single_cmd(args))
        assert r.rc == 0 and r.run_json is not None, explain(r)
        return Baseline(mix=mix, repo=repo, run=r, final_sha=weights_sha256(repo))

    return shared("baseline" if nproc == NPROC else f"baseline-{nproc}", tmp_path_factory, build)


def segment_one_process(tmp_path_factory) -> tuple[Path, str]:
    """(mix, store URL) of a one-process session stopped at step 4 (pointer ckpt/checkpoint-4, not terminal):
    where a refusal does not depend on the rank count, one process decides it at half the cost."""
    mix = tiny_mix(tmp_path_factory)

    def build(d: Path) -> tuple[Path, str]:
        repo = store_url(d / "store")
        args = trainer_args(
            root=mix,
            out=d / "out",
            repo=repo,
            steps=BASELINE_STEPS,
            push_every=BASELINE_PUSH_EVERY,
            stop=4,
            nproc=1,
        )
        r = run_trainer(single_cmd(args))
        assert r.rc == 0, explain(r)
        return mix, repo

    return shared("segment4-one-process", tmp_path_factory, build)


def rank_exit_codes(run: Run) -> dict[int, int]:
    """Each failed worker's exit code from torchrun's failure report (torchrun itself exits 1)."""
    codes: dict[int, int] = {}
    rank = None
    for line in run.lines:
        m = re.match(r"^\s*rank\s*:\s*(\d+)", line)
        if m:
            rank = int(m.group(1))
        m = re.match(r"^\s*exitcode\s*:\s*(-?\d+)", line)
        if m and rank is not None:
            codes[rank] = int(m.group(1))
            rank = None
    return codes
