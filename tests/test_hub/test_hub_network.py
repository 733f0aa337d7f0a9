"""The network between the store and the Hub, through the real huggingface_hub client against tests/hubserver.py:
the token goes to the endpoint's host only, no wait outlasts the cap, a trickling transfer ends, a gated, a hidden
and a missing repo are told apart, a failing Xet falls back to plain HTTP, and a dead proxy is named."""

from __future__ import annotations

import email.utils
import importlib.util
import logging
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

import pytest
from blobs import sha, write
from hubserver import HUB_LFS_THRESHOLD, HUB_TOKEN, HubServer, SleepRecorder

from trainer.store import RepoMissing, StoreError
from trainer.store.hub import HubStore, RetryPolicy, Timeouts

REPO_ROOT = Path(__file__).resolve().parents[2]
COMMIT = r"/commit/main$"


def scaled(seconds: float) -> float:
    """``seconds`` stretched by the machine's load (its cores are shared): a time bound, never a sleep."""
    return seconds * max(1.0, os.getloadavg()[0] / (os.cpu_count() or 1))


def within(seconds: float, fn: Callable[[], Any]) -> Any:
    """``fn()``, which must end within ``seconds`` (load-scaled): a client that sleeps a day, or resumes a trickle
    forever, fails the test instead of hanging it (its thread is left behind as a daemon)."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as e:  # handed to the test's thread
            box["error"] = e

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(scaled(seconds))
    assert not worker.is_alive(), f"still running after {scaled(seconds):.0f}s"
    if "error" in box:
        raise box["error"]
    return box.get("value")


def store_on(
    server: HubServer, name: str, *, private: bool = True, timeouts: Timeouts | None = None, **policy: Any
) -> HubStore:
    settings = {"attempts": 3, "base_s": 0.01, "max_s": 0.05, "max_retry_after_s": 60, "sleep": SleepRecorder()}
    return HubStore(
        f"tester/{name}",
        endpoint=server.url,
        token=HUB_TOKEN,
        private=private,
        retry=RetryPolicy(**{**settings, **policy}),
        timeouts=timeouts or Timeouts(connect_s=5.0, read_s=5.0),
    )


def foreign(server: HubServer) -> list[dict]:
    return [r for r in server.log if r["host"] == "foreign"]


# ---------------------------------------------------------------------------------- the token's host (item 16)


def test_listing_pages_on_another_host_get_no_token(hub_server: HubServer, tmp_path: Path) -> None:
    hub_server.page_size = 2
    store = store_on(hub_server, "pages", private=False)
    store.create()
    names = [f"d/f{i}.json" for i in range(5)]
    store.commit({n: write(tmp_path, n, n.encode()) for n in names})
    hub_server.inject("foreign", r"/tree/main", times=100)
    assert sorted(store.list_files()) == names  # a public repo: the other host serves its pages without the token
    pages = foreign(hub_server)
    assert len(pages) >= 2 and all("/tree/main" in r["path"] for r in pages), pages
    assert [r for r in pages if r["auth_header"]] == []


def test_a_private_listing_paged_to_another_host_is_refused_naming_it_never_missing(
    hub_server: HubServer, tmp_path: Path
) -> None:
    hub_server.page_size = 2
    store = store_on(hub_server, "privpages")
    store.create()
    store.commit({f"f{i}.json": write(tmp_path, f"f{i}", b"{}") for i in range(4)})
    hub_server.inject("foreign", r"/tree/main", times=100)
    with pytest.raises(StoreError) as e:
        store.list_files()
    assert not isinstance(e.value, RepoMissing)
    msg = str(e.value)
    assert f"sent a request to {hub_server.foreign_url}, another host than the endpoint {hub_server.url}" in msg, msg
    assert "the token goes to the endpoint's host only" in msg and HUB_TOKEN not in msg
    assert foreign(hub_server) and [r for r in foreign(hub_server) if r["auth_header"]] == []


def test_an_lfs_verify_action_on_another_host_gets_no_token(hub_server: HubServer, tmp_path: Path) -> None:
    store = store_on(hub_server, "verify")
    store.create()
    before = hub_server.commit_count("tester/verify")
    hub_server.inject("foreign", r"/info/lfs/objects/batch$", times=100)
    with pytest.raises(StoreError, match="another host than the endpoint"):
        store.commit({"m.safetensors": write(tmp_path, "m", os.urandom(HUB_LFS_THRESHOLD * 2))})
    verifies = [r for r in foreign(hub_server) if r["path"].startswith("/__lfs__/verify/")]
    assert verifies and [r for r in verifies if r["auth_header"]] == []
    assert hub_server.commit_count("tester/verify") == before  # nothing was committed on an unverified upload


# ------------------------------------------------------------------------------------------- waits (item 17)


@pytest.mark.parametrize("path", [r"/tree/main", r"/commits/main"])
def test_a_day_long_retry_after_on_a_read_is_cut_to_the_cap(hub_server: HubServer, tmp_path: Path, path: str) -> None:
    sleeps = SleepRecorder()
    store = store_on(hub_server, "ratelimited", max_retry_after_s=1.0, sleep=sleeps)
    store.create()
    store.commit({"a.json": write(tmp_path, "a", b"{}")})
    hub_server.inject("status", path, status=429, retry_after=86_400)
    if path == r"/tree/main":
        assert within(30, store.list_files) == {"a.json": store.list_files()["a.json"]}
    else:  # the history is read back to settle a commit whose answer was lost
        hub_server.inject("lost_response", COMMIT)
        rev = within(30, lambda: store.commit({"b.json": write(tmp_path, "b", b"{}")}))
        assert rev == hub_server.repo("tester/ratelimited").head.oid
    assert all(d <= 1.0 for d in sleeps.delays), sleeps.delays  # the store's own waits: capped too
    assert [r["status"] for r in hub_server.requests("GET", path)][0] == 429


def test_a_retry_after_given_as_an_http_date_is_waited_for(
    hub_server: HubServer, hub_store, sleeps: SleepRecorder, tmp_path: Path
) -> None:
    store = hub_store("datewait")
    store.create()
    when = email.utils.formatdate(time.time() + 20, usegmt=True)  # "Wed, 02 Dec 2026 10:00:20 GMT"
    hub_server.inject("status", COMMIT, status=429, retry_after=when)
    store.commit({"a.json": write(tmp_path, "a", b"{}")})
    assert len(sleeps.delays) == 1 and 15 <= sleeps.delays[0] <= 21, sleeps.delays


def test_every_wait_an_answer_names_is_rewritten_to_whole_seconds_under_the_cap() -> None:
    from trainer.store.hub_http import _cap_waits, bound_requests

    bound_requests(Timeouts(), max_wait_s=120)  # what a store opened with SPECPROBE_HUB_MAX_WAIT_S=120 sets
    soon = email.utils.formatdate(time.time() + 30, usegmt=True)
    cases = {
        "86400": {"120"},  # a day: cut
        "7.5": {"8"},  # whole seconds: the client reads digits only
        soon: {"29", "30"},  # an HTTP date, which the client ignores: parsed (to the second)
        "Wed, 21 Oct 2015 07:28:00 GMT": {"0"},  # a date past
        "soon": {"soon"},  # neither: left to the client's own backoff
    }
    for given, want in cases.items():
        headers = {"Retry-After": given, "RateLimit": '"api";r=0;t=86400'}
        _cap_waits(headers)
        assert headers["Retry-After"] in want, (given, headers)
        assert headers["RateLimit"] == '"api";r=0;t=120'  # the client's other source of a wait


# ------------------------------------------------------------------------------------- transfers (item 18)

TRICKLE = Timeouts(connect_s=5.0, read_s=1.0, min_rate_kb_s=1.0, progress_s=0.5)


def trickling(
    server: HubServer, tmp: Path, name: str, data: bytes, *, attempts: int = 3, timeouts: Timeouts = TRICKLE, **how: Any
) -> HubStore:
    """A store `name` holding `data` as m.safetensors, whose downloads of it the server trickles as `how` says
    (rate_bps, delay_s, times: the server's `trickle` fault); the client tries `attempts` times."""
    store = store_on(server, name, attempts=attempts, timeouts=timeouts)
    store.create()
    store.commit({"m.safetensors": write(tmp, "m", data)})
    server.inject("trickle", r"/resolve/.*/m\.safetensors$", method="GET", **how)
    return store


def test_a_trickling_download_ends_at_its_deadline_and_is_fetched_again(
    hub_server: HubServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    data = os.urandom(4096)
    store = trickling(hub_server, tmp_path, "trickle", data, rate_bps=20)  # 205 s at this rate
    caplog.set_level(logging.INFO, logger="trainer.hub")
    t0 = time.monotonic()
    assert within(60, lambda: store.read_bytes("m.safetensors")) == data
    # 1 s plus 4 KB at 1 KB/s allowed, then a clean fetch: far from the 205 s of the trickle.
    assert time.monotonic() - t0 < scaled(20)
    gets = hub_server.requests("GET", r"/resolve/")
    assert gets[0]["fault"] == "trickle" and gets[-1]["fault"] is None
    assert "slower than the 1 KB/s a transfer must keep (SPECPROBE_HUB_MIN_RATE_KB_S)" in caplog.text
    progress = [r.getMessage() for r in caplog.records if "it must end within" in r.getMessage()]
    assert progress and "download of hf://tester/trickle/m.safetensors: " in progress[0], caplog.text


def test_a_trickle_that_persists_fails_the_read_instead_of_resuming_forever(
    hub_server: HubServer, tmp_path: Path
) -> None:
    store = trickling(hub_server, tmp_path, "tricklemore", os.urandom(4096), attempts=2, rate_bps=50, times=1000)
    with pytest.raises(StoreError) as e:
        within(60, lambda: store.read_bytes("m.safetensors"))
    assert "after 2 tries" in str(e.value) and "slower than the 1 KB/s" in str(e.value), str(e.value)


def test_a_download_the_client_resumes_again_and_again_still_ends_at_its_deadline(
    hub_server: HubServer, tmp_path: Path
) -> None:
    # Every answer sends a second's worth of bytes and stalls past the read timeout; the client resumes with a
    # Range request, and starts its count of retries again since bytes arrived: each request alone stays within
    # its own limit, the download as a whole never would.
    store = trickling(hub_server, tmp_path, "resumed", os.urandom(4096), attempts=1, rate_bps=50, delay_s=3, times=1000)
    with pytest.raises(StoreError) as e:
        within(60, lambda: store.read_bytes("m.safetensors"))
    assert "download of hf://tester/resumed/m.safetensors: " in str(e.value), str(e.value)
    assert "slower than the 1 KB/s" in str(e.value) and len(hub_server.requests("GET", r"/resolve/")) >= 2


def test_a_long_transfer_says_how_far_it_got(
    hub_server: HubServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    data = os.urandom(2048)
    slower = Timeouts(connect_s=5.0, read_s=1.0, min_rate_kb_s=0.25, progress_s=0.4)
    store = trickling(hub_server, tmp_path, "progress", data, timeouts=slower, rate_bps=1024)
    caplog.set_level(logging.INFO, logger="trainer.hub")
    assert within(60, lambda: store.read_bytes("m.safetensors")) == data
    lines = [r.getMessage() for r in caplog.records if "it must end within" in r.getMessage()]
    assert lines and all("of 2.0 KB (" in line for line in lines), caplog.text
    assert hub_server.requests("GET", r"/resolve/")[-1]["fault"] == "trickle"  # one slow transfer, not cut


# ------------------------------------------------------------------------------- gated, hidden (item 20)


def test_gated_then_private_then_missing_are_told_apart_quoting_the_hub(hub_server: HubServer, tmp_path: Path) -> None:
    store = store_on(hub_server, "access")
    store.create()
    store.commit({"a.json": write(tmp_path, "a", b"{}")})
    repo_paths = r"/(api/)?datasets/tester/access\b"
    hub_server.inject("gated", repo_paths, times=1000)
    for op in (store.list_files, store.exists, lambda: store.read_bytes("a.json")):
        with pytest.raises(StoreError) as e:
            op()
        assert not isinstance(e.value, RepoMissing)  # never a fresh start over a repo that exists
        msg = str(e.value)
        assert "Hub dataset repo tester/access is gated and the token in use has no access to it" in msg, msg
        assert 'The Hub says (HTTP 403): "Access to dataset tester/access is restricted.' in msg, msg
    hub_server.clear_faults()
    hub_server.inject("hidden", repo_paths, times=1000)
    for op in (store.list_files, store.exists):
        with pytest.raises(StoreError) as e:
            op()
        assert not isinstance(e.value, RepoMissing)
        msg = str(e.value)
        assert "the token in use cannot see Hub dataset repo tester/access: it is private to other accounts" in msg
        assert 'The Hub says (HTTP 401): "Invalid username or password."' in msg and "does not exist" not in msg
    hub_server.clear_faults()
    missing = store_on(hub_server, "never-made")
    assert missing.exists() is False
    with pytest.raises(RepoMissing) as e:
        missing.list_files()
    assert "does not exist at" in str(e.value) and 'The Hub says (HTTP 404): "Repository not found"' in str(e.value)
    assert hub_server.commit_count("tester/access") == 2  # nothing was created or written meanwhile


# ------------------------------------------------------------------------------------------------ Xet (item 21)

XET = importlib.util.find_spec("hf_xet") is not None


def _xet_client() -> bool:
    import huggingface_hub.constants as hf_constants

    return hasattr(hf_constants, "HF_HUB_DISABLE_XET") and XET


needs_xet = pytest.mark.skipif(
    not _xet_client(), reason="this huggingface_hub has no Xet support, or hf_xet is not installed: it cannot fail"
)


UPLOAD = """
import os, pathlib, sys
from trainer.store.url import open_store
store = open_store("hf://tester/xetup")
store.create()
path = pathlib.Path(sys.argv[1])
path.write_bytes(os.urandom(4096))
store.commit({"m.safetensors": path})
print("sha256", store.sha256("m.safetensors"))
"""


@needs_xet
@pytest.mark.parametrize("code", [404, 503])
def test_a_failing_xet_write_token_falls_back_to_a_plain_upload(
    hub_server: HubServer, tmp_path: Path, code: int
) -> None:
    hub_server.inject("status", r"/xet-write-token/", status=code, times=1000)
    # A fresh process: the client as shipped (Xet on), hf_xet told to give up on the first refusal (by default it
    # retries a 503 for minutes before failing: its own knob, read once per process).
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "SPECPROBE_HUB_"))}
    env.update(hub_server.env(disable_xet=False), PYTHONPATH=str(REPO_ROOT), HF_XET_CLIENT_RETRY_MAX_ATTEMPTS="1")
    done = subprocess.run(
        [sys.executable, "-c", UPLOAD, str(tmp_path / "m")], env=env, capture_output=True, text=True, timeout=180
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-3000:]
    assert done.stdout.split() == ["sha256", sha((tmp_path / "m").read_bytes())], out[-3000:]
    assert hub_server.files("tester/xetup")["m.safetensors"] == (tmp_path / "m").read_bytes()
    assert hub_server.requests("GET", r"/xet-write-token/") and hub_server.requests("PUT", r"^/__lfs__/upload/")
    assert f"({code} " in out and "Xet storage failed" in out and "HF_HUB_DISABLE_XET=1" in out, out[-3000:]
    assert HUB_TOKEN not in out


@needs_xet
@pytest.mark.parametrize("code", [404, 503])
def test_a_failing_xet_read_token_falls_back_to_a_plain_download(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, code: int
) -> None:
    import huggingface_hub.constants as hf_constants

    with HubServer(token=HUB_TOKEN, lfs_threshold=HUB_LFS_THRESHOLD, xet=True) as server:
        monkeypatch.setattr(hf_constants, "HF_HUB_DISABLE_XET", True)  # the upload through LFS
        store = store_on(server, "xetdown")
        store.create()
        data = os.urandom(HUB_LFS_THRESHOLD * 4)
        store.commit({"m.safetensors": write(tmp_path, "m", data)})
        monkeypatch.setattr(hf_constants, "HF_HUB_DISABLE_XET", False)  # the download as shipped: Xet first
        server.inject("status", r"/xet-read-token/", status=code, retry_after=0, times=1000)
        assert within(90, lambda: store.sha256("m.safetensors")) == sha(data)
        assert server.requests("GET", r"/xet-read-token/") and server.requests("GET", r"/resolve/")
    assert "Xet storage failed" in caplog.text and "HF_HUB_DISABLE_XET=1" in caplog.text


# ------------------------------------------------------------------------------------------ proxy (item 22)


def test_a_dead_proxy_is_named_in_the_error_without_its_password(hub_server: HubServer) -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    proxy = f"http://bob:Pr0xyPassw0rd@127.0.0.1:{dead}"
    code = (
        "from trainer.store.url import open_store\n"
        "try:\n    open_store('hf://tester/behindproxy').exists()\n"
        "except Exception as e:\n    print('ERROR', type(e).__name__, e)\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy") and not k.startswith("HF_")}
    env.update(
        hub_server.env(),
        PYTHONPATH=str(REPO_ROOT),
        HTTP_PROXY=proxy,
        SPECPROBE_HUB_RETRIES="1",
        SPECPROBE_HUB_OUTAGE_S="0",
    )
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    out = done.stdout + done.stderr
    assert "ERROR StoreUnavailable" in done.stdout, out[-3000:]
    said = f"the request went through the proxy http://<redacted>@127.0.0.1:{dead} (from HTTP_PROXY)"
    assert said in done.stdout, out[-3000:]
    assert "Pr0xyPassw0rd" not in out and HUB_TOKEN not in out
