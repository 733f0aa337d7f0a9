"""Shared fixtures: the Hub-protocol test server (tests/hubserver.py) and Hub stores pointed at it.

``hub_server`` runs in the pytest process on 127.0.0.1 with a free port. A test driving a subprocess (a
trainer) passes ``hub_server.env()`` (HF_ENDPOINT, HF_TOKEN, HF_HUB_DISABLE_XET=1) to it and arms faults
with ``hub_server.inject(kind, path_pattern, nth=N, times=K)``, or over HTTP: ``POST /__control__/inject``.
"""

from __future__ import annotations

import os
import resource
import shutil
import signal
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Callable, Iterator

import pytest
from hubserver import HUB_LFS_THRESHOLD, HUB_TOKEN, HubServer, SleepRecorder


def _parses_commit_urls_of(endpoint: str) -> bool:
    from huggingface_hub import CommitInfo

    oid = "0" * 40
    try:
        CommitInfo(
            commit_url=f"{endpoint}/datasets/a/b/commit/{oid}",
            commit_message="m",
            commit_description="",
            oid=oid,
            _endpoint=endpoint,
        )
    except (TypeError, ValueError):
        return False
    return True


@pytest.fixture
def hub_server(monkeypatch: pytest.MonkeyPatch) -> Iterator[HubServer]:
    """A running test Hub. In-process clients get Xet disabled (the client reads HF_HUB_DISABLE_XET at import,
    so the constant is patched); subprocesses get it through ``hub_server.env()``."""
    import huggingface_hub.constants as hf_constants

    monkeypatch.setattr(hf_constants, "HF_HUB_DISABLE_XET", True, raising=False)  # absent before Xet (< 0.30)
    server = HubServer(token=HUB_TOKEN, lfs_threshold=HUB_LFS_THRESHOLD).start()
    if not _parses_commit_urls_of(server.url):
        # Older clients (0.26 ..) parse commit URLs against the endpoint read from HF_ENDPOINT at import only;
        # a process that sets HF_ENDPOINT before importing (the trainer) gets exactly this.
        # Emulate that import-time read: the constants and the copy file_download took of the URL template.
        import huggingface_hub.file_download as hf_file_download

        template = server.url + "/{repo_id}/resolve/{revision}/{filename}"
        monkeypatch.setattr(hf_constants, "ENDPOINT", server.url)
        monkeypatch.setattr(hf_constants, "HUGGINGFACE_CO_URL_TEMPLATE", template)
        monkeypatch.setattr(hf_file_download, "HUGGINGFACE_CO_URL_TEMPLATE", template, raising=False)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def sleeps() -> SleepRecorder:
    return SleepRecorder()


@pytest.fixture
def hub_store(hub_server: HubServer, sleeps: SleepRecorder) -> Callable[..., object]:
    """Factory: ``hub_store("name")`` -> a HubStore on ``tester/name`` with a fast, recorded retry policy."""
    from trainer.store.hub import HubStore, RetryPolicy

    def make(
        name: str = "ckpt", *, token: str | None = HUB_TOKEN, attempts: int = 5, repo_type: str = "dataset"
    ) -> HubStore:
        policy = RetryPolicy(attempts=attempts, base_s=0.01, max_s=0.05, max_retry_after_s=60, sleep=sleeps)
        return HubStore(f"tester/{name}", repo_type=repo_type, endpoint=hub_server.url, token=token, retry=policy)

    return make


# SPECPROBE_TEST_CPU=FILE appends each test's CPU seconds (its own process and the children it waited for) to
# FILE: where the suite's time goes, readable even on a loaded machine where wall times say little; with the
# xdist worker and the wall-clock start and end, the schedule too (which worker idles at the end, and why).
_CPU_LOG = os.environ.get("SPECPROBE_TEST_CPU")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    if not _CPU_LOG:
        yield
        return
    before = [resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    start = time.time()
    yield
    after = [resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    cpu = [a.ru_utime + a.ru_stime - b.ru_utime - b.ru_stime for a, b in zip(after, before)]
    with open(_CPU_LOG, "a", encoding="utf-8") as fh:
        worker = os.environ.get("PYTEST_XDIST_WORKER", "-")
        fh.write(
            f"{cpu[0] + cpu[1]:.2f}\t{cpu[0]:.2f}\t{cpu[1]:.2f}\t{item.nodeid}\t{worker}\t{start:.1f}\t{time.time():.1f}\n"
        )


# A test works on copies: one that leaves files in the checkout's specs/ or evidence/ (an `engine check` of a
# saved run writes its record beside it) would change what the next test, or the next commit, reads.
_GUARDED = ("specs", "evidence")
_ROOT = Path(__file__).resolve().parents[1]


def _guarded_files() -> set[str]:
    return {str(p.relative_to(_ROOT)) for d in _GUARDED for p in (_ROOT / d).rglob("*") if p.is_file()}


def pytest_sessionstart(session: pytest.Session) -> None:
    session.config._specprobe_files = _guarded_files()  # type: ignore[attr-defined]


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if hasattr(session.config, "workerinput"):
        return  # an xdist worker: the controller looks once, after every worker finished
    new = sorted(_guarded_files() - session.config._specprobe_files)  # type: ignore[attr-defined]
    if new:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        reporter.write_line(f"tests left files in the checkout: {new}", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_configure(config: pytest.Config) -> None:
    """One Inductor cache for the whole session, its own: the compiling tests (and the trainer runs they start,
    which inherit the variable, as xdist's workers do) reuse each other's kernels, and no other process on the
    machine can change or delete that cache under a test. Inductor's CPU kernels are scalar (below)."""
    # Every process of the session may write bytecode, so each module is compiled once and read back after:
    # the install skips pip's up-front compile of all of torch (--no-compile), and a machine that sets
    # PYTHONDONTWRITEBYTECODE would make every trainer process compile torch from source.
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    sys.dont_write_bytecode = False
    # A suite started in the background of a non-interactive shell (`nohup ... &`) inherits SIGINT ignored, and so
    # would every process it starts: the tests of a Ctrl-C (the engine's, the trainer's) need it delivered.
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    # Inductor's CPU kernels in scalar C++: the tests judge what a compiled model computes and keeps, never the
    # CPU kernels' speed, and the vectorized code costs g++ about half again as much (docs/performance.md).
    # A caller that sets the variable decides.
    os.environ.setdefault("TORCHINDUCTOR_VEC_ISA_OK", "0")
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False  # xdist keeps the collection order (below) as the schedule
    if hasattr(config, "workerinput") or "TORCHINDUCTOR_CACHE_DIR" in os.environ:
        return
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="specprobe-inductor-")
    config._specprobe_inductor = os.environ["TORCHINDUCTOR_CACHE_DIR"]  # type: ignore[attr-defined]


def pytest_unconfigure(config: pytest.Config) -> None:
    cache = getattr(config, "_specprobe_inductor", None)
    if cache is not None:
        shutil.rmtree(cache, ignore_errors=True)


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """`-n auto`: one worker more than the cores this process may use. A worker spends part of its time waiting
    (a Hub deadline, a trickled transfer, a lease renewal, a child's grace period) with its core idle; a third
    worker on 2 cores keeps both busy, where two left them idle about one tenth of the run."""
    return len(os.sched_getaffinity(0)) + 1


# xdist hands out whole files (--dist loadfile), the next one to a worker when its current file has two tests
# left, in the collection order (pytest_configure turns off its own reorder). Whole files, because a module's
# fixtures are built once by the process that runs it: the core install's venv, the real engine runs of the P4
# specs (test_e2e_local, test_two_stops), the review's template repo; split across workers, each would build
# them. That order is xdist's default, the files with the most tests first, which keeps the trainer's long
# runs running beside the engine's many short tests. Its one flaw is fixed: the few-but-long end-to-end files
# went last, and one worker ran them alone for a minute while the other idled. They go first.
_FEW_BUT_LONG = ("test_e2e_local.py", "test_refusal_report.py")


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    count = Counter(str(item.fspath) for item in items)

    def rank(item: pytest.Item) -> tuple[bool, int]:
        return Path(str(item.fspath)).name not in _FEW_BUT_LONG, -count[str(item.fspath)]

    items.sort(key=rank)  # stable: the order inside a file stays
