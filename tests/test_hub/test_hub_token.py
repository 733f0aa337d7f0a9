"""HF_TOKEN is sent as the bearer token and appears nowhere else: not in logs (DEBUG included), stdout, stderr,
exception messages and tracebacks, reprs, the server's request log or files the store writes."""

from __future__ import annotations

import json
import logging
import os
import traceback
from pathlib import Path

import pytest
from hubserver import HUB_TOKEN, HubServer

from trainer.store import RepoMissing, StoreError
from trainer.store.hub import HubStore, RetryPolicy
from trainer.store.url import open_store


def test_token_is_the_bearer_and_never_leaks(
    hub_server: HubServer,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("HF_ENDPOINT", hub_server.url)
    monkeypatch.setenv("HF_TOKEN", HUB_TOKEN)
    caplog.set_level(logging.DEBUG)  # every logger, the client's request dumps included
    logging.getLogger("huggingface_hub").setLevel(logging.DEBUG)
    texts: list[str] = []

    def keep(exc: BaseException) -> None:
        texts.append("".join(traceback.format_exception(exc)))

    store = open_store("hf://tester/secret")
    store.retry = RetryPolicy(attempts=3, base_s=0.0, sleep=lambda s: None)  # type: ignore[attr-defined]
    texts.append(repr(store))
    try:
        store.list_files()
    except RepoMissing as e:
        keep(e)
    store.create()
    big = tmp_path / "w.bin"
    big.write_bytes(os.urandom(4096))
    hub_server.inject("lost_response", r"/commit/main$")
    hub_server.inject("status", r"/commit/main$", status=503, nth=2)
    store.commit({"ckpt/checkpoint-1/model.safetensors": big, "a.json": big}, message="c")
    store.commit({"b.json": big})
    store.download("a.json", tmp_path / "out" / "a.json")
    hub_server.inject("corrupt", r"/commit/main$")
    store.commit({"c.bin": big})
    try:
        store.read_bytes("c.bin")
    except StoreError as e:
        keep(e)
    hub_server.inject("status", r"/commit/main$", status=503, times=10)
    try:
        store.commit({"d.bin": big})
    except StoreError as e:
        keep(e)
    # A rejected token: the message says so without repeating it.
    wrong = HubStore(
        "tester/secret",
        endpoint=hub_server.url,
        token=HUB_TOKEN + "x",
        retry=RetryPolicy(attempts=1, sleep=lambda s: None),
    )
    try:
        wrong.list_files()
    except StoreError as e:
        keep(e)
        assert "401" in str(e)

    # The token was the bearer of every write the server saw.
    writes = hub_server.requests("POST", r"/commit/main$") + hub_server.requests("POST", r"^/api/repos/create$")
    assert writes and all(r["authorized"] for r in writes)

    out, err = capfd.readouterr()
    files = [p.read_bytes().decode("latin-1") for p in tmp_path.rglob("*") if p.is_file()]
    everything = {
        "log": caplog.text,
        "stdout": out,
        "stderr": err,
        "exceptions": "\n".join(texts),
        "server_log": json.dumps(hub_server.log),
        "files": "\n".join(files),
    }
    assert len(texts) == 5 and caplog.text  # the checks below looked at real output
    for where, text in everything.items():
        assert HUB_TOKEN not in text, f"the token leaked into {where}"
        assert HUB_TOKEN[3:] not in text, f"part of the token leaked into {where}"


def test_messages_redact_anything_shaped_like_a_token() -> None:
    store = HubStore("tester/x", endpoint="http://127.0.0.1:9", token=HUB_TOKEN)
    assert store._safe(f"boom {HUB_TOKEN} and hf_OtherLookingToken123") == "boom <redacted> and <redacted>"
    # A presigned storage URL in a transport error's text: its signature is a credential for the object.
    signed = "url: /b/o?X-Amz-Credential=AKIA1/x&X-Amz-Signature=5f3e9a&part=1 and /__lfs__/upload/a?sig=9c1d"
    assert store._safe(signed) == (
        "url: /b/o?X-Amz-Credential=<redacted>&X-Amz-Signature=<redacted>&part=1 and /__lfs__/upload/a?sig=<redacted>"
    )
    assert HUB_TOKEN not in repr(store) and HUB_TOKEN not in str(vars(store).get("url"))
