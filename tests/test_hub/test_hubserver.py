"""The Hub-protocol test server speaks what the real client expects (raw HTTP and through huggingface_hub)."""

from __future__ import annotations

import base64
import hashlib
import json
import time
import urllib.error
import urllib.request
from typing import Any

import pytest
from hubserver import HUB_TOKEN, HubServer, git_blob_sha1
from huggingface_hub import CommitOperationAdd, HfApi
from huggingface_hub.utils import EntryNotFoundError, RepositoryNotFoundError, RevisionNotFoundError


@pytest.fixture(autouse=True)
def token_to_this_server(hub_server: HubServer) -> None:
    """These tests drive the client without a store: the token may go to this server (a store opened on an
    endpoint allows its host; trainer/store/hub_http.py withholds it from any other once a store was opened)."""
    from trainer.store.hub_http import allow_token_host

    allow_token_host(hub_server.url)


def http(
    server: HubServer,
    method: str,
    path: str,
    body: Any = None,
    *,
    token: str | None = HUB_TOKEN,
    headers: dict[str, str] | None = None,
    raw: bytes | None = None,
    timeout: float = 10,
) -> tuple[int, dict[str, str], bytes]:
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    req = urllib.request.Request(server.url + path, data=data, method=method)
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    if body is not None:
        req.add_header("Content-Type", "application/json")
    for k, v in (headers or {}).items():
        req.add_header(k, v)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def create(server: HubServer, name: str = "r") -> None:
    status, _, _ = http(
        server,
        "POST",
        "/api/repos/create",
        {"name": name, "organization": "tester", "type": "dataset", "private": True},
    )
    assert status == 200


def commit(server: HubServer, lines: list[dict], name: str = "r", token: str | None = HUB_TOKEN):
    raw = b"".join(json.dumps(x).encode() + b"\n" for x in lines)
    return http(
        server,
        "POST",
        f"/api/datasets/tester/{name}/commit/main",
        raw=raw,
        token=token,
        headers={"Content-Type": "application/x-ndjson"},
    )


def file_line(path: str, data: bytes) -> dict:
    return {"key": "file", "value": {"path": path, "content": base64.b64encode(data).decode(), "encoding": "base64"}}


def test_create_twice_answers_409_with_the_url(hub_server: HubServer) -> None:
    create(hub_server)
    status, _, body = http(
        hub_server, "POST", "/api/repos/create", {"name": "r", "organization": "tester", "type": "dataset"}
    )
    assert status == 409
    assert json.loads(body)["url"] == f"{hub_server.url}/datasets/tester/r"
    assert hub_server.commit_count("tester/r") == 1  # the initial commit with .gitattributes


def test_writes_need_the_bearer_token(hub_server: HubServer) -> None:
    status, _, _ = http(hub_server, "POST", "/api/repos/create", {"name": "r", "type": "dataset"}, token=None)
    assert status == 401
    create(hub_server)
    status, _, _ = commit(hub_server, [{"key": "header", "value": {"summary": "x"}}], token="hf_wrong")
    assert status == 401
    # Private repos are invisible without a token, like on the Hub.
    status, headers, _ = http(hub_server, "GET", "/api/datasets/tester/r", token=None)
    assert (status, headers["X-Error-Code"]) == (404, "RepoNotFound")


def test_commit_history_and_parent_commit_conflict(hub_server: HubServer) -> None:
    create(hub_server)
    head0 = json.loads(http(hub_server, "GET", "/api/datasets/tester/r")[2])["sha"]
    status, _, body = commit(
        hub_server,
        [{"key": "header", "value": {"summary": "one", "parentCommit": head0}}, file_line("a.txt", b"hello")],
    )
    assert status == 200
    oid1 = json.loads(body)["commitOid"]
    assert json.loads(body)["commitUrl"].endswith(f"/datasets/tester/r/commit/{oid1}")
    # A second commit on the stale parent is refused with 412 and changes nothing.
    status, _, _ = commit(
        hub_server, [{"key": "header", "value": {"summary": "two", "parentCommit": head0}}, file_line("b.txt", b"x")]
    )
    assert status == 412
    assert hub_server.files("tester/r") == {
        ".gitattributes": hub_server.files("tester/r")[".gitattributes"],
        "a.txt": b"hello",
    }
    history = json.loads(http(hub_server, "GET", "/api/datasets/tester/r/commits/main")[2])
    assert [c["id"] for c in history] == [oid1, head0]
    assert history[0]["title"] == "one"


def test_deleting_an_absent_file_is_entry_not_found(hub_server: HubServer) -> None:
    create(hub_server)
    status, headers, _ = commit(
        hub_server,
        [{"key": "header", "value": {"summary": "d"}}, {"key": "deletedFile", "value": {"path": "nope.txt"}}],
    )
    assert (status, headers["X-Error-Code"]) == (404, "EntryNotFound")
    assert hub_server.commit_count("tester/r") == 1


def test_resolve_headers_range_and_errors(hub_server: HubServer) -> None:
    create(hub_server)
    data = bytes(range(256)) * 8  # 2048 bytes: above the 1 KB test threshold, but sent as a file line
    commit(hub_server, [{"key": "header", "value": {"summary": "s"}}, file_line("d/x.bin", data)])
    head = hub_server.repo("tester/r").head.oid
    status, headers, body = http(hub_server, "GET", "/datasets/tester/r/resolve/main/d/x.bin")
    assert status == 200 and body == data
    assert headers["ETag"] == f'"{git_blob_sha1(data)}"' and headers["X-Repo-Commit"] == head
    status, headers, body = http(
        hub_server, "GET", "/datasets/tester/r/resolve/main/d/x.bin", headers={"Range": "bytes=100-"}
    )
    assert status == 206 and body == data[100:] and headers["Content-Range"] == "bytes 100-2047/2048"
    status, headers, _ = http(hub_server, "HEAD", "/datasets/tester/r/resolve/main/d/nope")
    assert (status, headers["X-Error-Code"], headers["X-Repo-Commit"]) == (404, "EntryNotFound", head)
    status, headers, _ = http(hub_server, "GET", "/datasets/tester/r/resolve/" + "0" * 40 + "/d/x.bin")
    assert (status, headers["X-Error-Code"]) == (404, "RevisionNotFound")


def test_lfs_batch_upload_verify_and_linked_headers(hub_server: HubServer) -> None:
    create(hub_server)
    data = b"w" * 3000
    oid = hashlib.sha256(data).hexdigest()
    status, _, body = http(
        hub_server,
        "POST",
        "/datasets/tester/r.git/info/lfs/objects/batch",
        {"operation": "upload", "transfers": ["basic"], "objects": [{"oid": oid, "size": 3000}]},
    )
    obj = json.loads(body)["objects"][0]
    upload, verify = obj["actions"]["upload"]["href"], obj["actions"]["verify"]["href"]
    assert upload.startswith(hub_server.url)
    # The upload URL is presigned: no bearer token needed, but a bad signature is refused.
    path = upload[len(hub_server.url) :]
    assert http(hub_server, "PUT", path.replace("sig=", "sig=0"), raw=data, token=None)[0] == 403
    assert http(hub_server, "PUT", path, raw=data[:-1] + b"x", token=None)[0] == 400
    assert http(hub_server, "PUT", path, raw=data, token=None)[0] == 200
    assert http(hub_server, "POST", verify[len(hub_server.url) :], {"oid": oid, "size": 3000})[0] == 200
    # Once stored, the batch answer carries no actions (nothing to upload again).
    body = http(
        hub_server,
        "POST",
        "/datasets/tester/r.git/info/lfs/objects/batch",
        {"operation": "upload", "objects": [{"oid": oid, "size": 3000}]},
    )[2]
    assert "actions" not in json.loads(body)["objects"][0]
    commit(
        hub_server,
        [
            {"key": "header", "value": {"summary": "s"}},
            {"key": "lfsFile", "value": {"path": "w.bin", "algo": "sha256", "oid": oid, "size": 3000}},
        ],
    )
    status, headers, _ = http(hub_server, "HEAD", "/datasets/tester/r/resolve/main/w.bin")
    assert headers["X-Linked-Etag"] == f'"{oid}"' and headers["X-Linked-Size"] == "3000"


def test_request_log_redacts_authorization(hub_server: HubServer) -> None:
    create(hub_server)
    dumped = json.dumps(hub_server.log)
    assert HUB_TOKEN not in dumped
    assert hub_server.log[-1]["headers"]["authorization"] == "<redacted>" and hub_server.log[-1]["authorized"]


def test_faults_fire_on_the_nth_matching_request_via_the_control_endpoint(hub_server: HubServer) -> None:
    create(hub_server)
    status, _, body = http(
        hub_server,
        "POST",
        "/__control__/inject",
        {"kind": "status", "path_pattern": "^/api/datasets/tester/r$", "status": 500, "nth": 2, "times": 2},
    )
    assert status == 200 and json.loads(body)["nth"] == 2
    codes = [http(hub_server, "GET", "/api/datasets/tester/r")[0] for _ in range(4)]
    assert codes == [200, 500, 500, 200]
    hub_server.inject("status", "/api/datasets/", status=429, retry_after=3)
    status, headers, _ = http(hub_server, "GET", "/api/datasets/tester/r")
    assert (status, headers["Retry-After"]) == (429, "3")
    assert http(hub_server, "POST", "/__control__/inject", {"kind": "bogus"})[0] == 400


def test_small_requests_are_fast_keepalive(hub_server: HubServer) -> None:
    # TCP_NODELAY: 20 keep-alive round trips through the real client take far less than 20 x 40 ms
    # (Nagle + delayed ACK). Best of 3 rounds: that stall hits every round, a busy CI core only some.
    api = HfApi(endpoint=hub_server.url, token=HUB_TOKEN)
    api.create_repo("tester/r", repo_type="dataset")
    rounds = []
    for _ in range(3):
        t0 = time.monotonic()
        for _ in range(20):
            api.repo_info("tester/r", repo_type="dataset")
        rounds.append(time.monotonic() - t0)
    assert min(rounds) < 0.6, rounds


def test_client_reads_tree_pages_paths_info_and_its_own_exceptions(hub_server: HubServer) -> None:
    hub_server.page_size = 2
    api = HfApi(endpoint=hub_server.url, token=HUB_TOKEN)
    url = api.create_repo("tester/r", repo_type="dataset", private=True)
    assert url.repo_id == "tester/r" and url.repo_type == "dataset"
    api.create_commit(
        "tester/r",
        [CommitOperationAdd(f"d/f{i}.txt", f"{i}".encode()) for i in range(5)]
        + [CommitOperationAdd("README.md", b"---\nlicense: mit\n---\nhi\n")],
        commit_message="five",
        repo_type="dataset",
    )
    tree = [e.path for e in api.list_repo_tree("tester/r", repo_type="dataset", recursive=True)]
    assert tree == [".gitattributes", "README.md", "d", "d/f0.txt", "d/f1.txt", "d/f2.txt", "d/f3.txt", "d/f4.txt"]
    assert any(r["path"] == "/api/validate-yaml" for r in hub_server.log)  # README.md is validated
    info = api.get_paths_info("tester/r", ["d/f3.txt", "d", "missing"], repo_type="dataset")
    assert [(type(i).__name__, i.path) for i in info] == [("RepoFile", "d/f3.txt"), ("RepoFolder", "d")]
    with pytest.raises(RepositoryNotFoundError):
        api.repo_info("tester/none", repo_type="dataset")
    with pytest.raises(RevisionNotFoundError):
        api.list_repo_tree("tester/r", repo_type="dataset", revision="f" * 40).__next__()
    with pytest.raises(EntryNotFoundError):
        from huggingface_hub import get_hf_file_metadata, hf_hub_url

        get_hf_file_metadata(
            hf_hub_url("tester/r", "nope", repo_type="dataset", endpoint=hub_server.url), token=HUB_TOKEN
        )
    assert api.whoami()["name"] == hub_server.user


def test_a_stalled_answer_comes_after_its_delay_with_the_work_done(hub_server: HubServer) -> None:
    create(hub_server)
    before = hub_server.commit_count("tester/r")
    hub_server.inject("stall", r"/commit/main$", delay_s=0.8)
    t0 = time.monotonic()
    status, _, _ = commit(hub_server, [{"key": "header", "value": {"summary": "s"}}, file_line("a.txt", b"a")])
    assert status == 200 and time.monotonic() - t0 >= 0.8
    assert hub_server.commit_count("tester/r") == before + 1


def test_a_stall_without_a_delay_never_answers_and_the_work_is_done(hub_server: HubServer) -> None:
    create(hub_server)
    before = hub_server.commit_count("tester/r")
    hub_server.inject("stall", r"/commit/main$")
    with pytest.raises(TimeoutError):  # urllib's socket timeout: no answer within it
        http(
            hub_server,
            "POST",
            "/api/datasets/tester/r/commit/main",
            timeout=0.5,
            raw=b"".join(
                json.dumps(x).encode() + b"\n"
                for x in [{"key": "header", "value": {"summary": "s"}}, file_line("a", b"a")]
            ),
        )
    assert hub_server.commit_count("tester/r") == before + 1


def test_a_stale_listing_leaves_out_the_matching_files_for_its_requests_only(hub_server: HubServer) -> None:
    create(hub_server)
    commit(
        hub_server,
        [{"key": "header", "value": {"summary": "s"}}, file_line("d/a.json", b"1"), file_line("d/b.json", b"2")],
    )
    hub_server.inject("stale_listing", r"/tree/main", file_pattern=r"b\.json$")
    paths = [
        [e["path"] for e in json.loads(http(hub_server, "GET", "/api/datasets/tester/r/tree/main?recursive=true")[2])]
        for _ in range(2)
    ]
    assert paths == [[".gitattributes", "d", "d/a.json"], [".gitattributes", "d", "d/a.json", "d/b.json"]]


def test_a_corrupt_fault_on_bytes_that_are_corrupt_already_leaves_them_corrupt(hub_server: HubServer) -> None:
    api = HfApi(endpoint=hub_server.url, token=HUB_TOKEN)
    api.create_repo("tester/r", repo_type="dataset")
    data = bytes(range(256)) * 8
    api.create_commit("tester/r", [CommitOperationAdd("m.safetensors", data)], commit_message="1", repo_type="dataset")
    hub_server.corrupt("tester/r", "m.safetensors")
    # The same bytes under another name: the upload deduplicates onto the stored (corrupt) object, and a second
    # corruption must not change it back.
    hub_server.inject("corrupt", r"/commit/main$", file_pattern=r"n\.safetensors$")
    api.create_commit("tester/r", [CommitOperationAdd("n.safetensors", data)], commit_message="2", repo_type="dataset")
    stored = hub_server.files("tester/r")
    assert stored["n.safetensors"] == stored["m.safetensors"] != data and hub_server.faults[0].fired == 1
