"""Headless Chromium driven over the DevTools protocol, for tests that must see a page as a person
would: did it load, what did its console say, what did it fetch, how big is each element drawn,
and a screenshot.

Debian's `chromium` (installed by .ci/run) and the websocket-client package; nothing is
downloaded. As root Chromium needs --no-sandbox, and on a machine with no network the background
services must be off, or it keeps trying to reach Google's hosts.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
    "--mute-audio",
)


def chromium_path() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


@dataclass
class PageResult:
    loaded: bool
    title: str
    console: list[dict[str, Any]] = field(default_factory=list)  # every console/log entry and exception
    requests: list[str] = field(default_factory=list)  # every URL the page asked for
    measured: Any = None  # what the measuring expression returned
    png: bytes = b""

    def errors(self) -> list[dict[str, Any]]:
        return [c for c in self.console if c.get("level") in ("error", "exception", "warning")]


class _Session:
    def __init__(self, ws: Any) -> None:
        self.ws = ws
        self.next_id = 0
        self.events: list[dict[str, Any]] = []

    def send(
        self, method: str, params: dict[str, Any] | None = None, session: str | None = None, timeout_s: float = 30
    ) -> dict[str, Any]:
        self.next_id += 1
        msg: dict[str, Any] = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        self.ws.send(json.dumps(msg))
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            reply = json.loads(self.ws.recv())
            if reply.get("id") == self.next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)
        raise TimeoutError(f"{method}: no reply in {timeout_s} s")

    def wait_for(self, method: str, timeout_s: float = 30) -> dict[str, Any]:
        for event in self.events:
            if event.get("method") == method:
                return event
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            event = json.loads(self.ws.recv())
            self.events.append(event)
            if event.get("method") == method:
                return event
        raise TimeoutError(f"no {method} in {timeout_s} s")


def render(url: str, measure: str, profile_dir: Path, width: int = 1100, timeout_s: float = 60) -> PageResult:
    """Load `url` in a fresh headless Chromium, evaluate the JavaScript expression `measure` (its
    value, JSON-able, comes back in `measured`) and take a full-page PNG screenshot."""
    import websocket  # websocket-client, a dev dependency

    binary = chromium_path()
    if binary is None:
        raise FileNotFoundError("chromium is not installed (.ci/run installs Debian's package)")
    profile_dir.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen(
        [
            binary,
            *FLAGS,
            f"--user-data-dir={profile_dir}",
            "--remote-debugging-port=0",
            f"--window-size={width},900",
            "about:blank",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        port_file = profile_dir / "DevToolsActivePort"
        deadline = time.monotonic() + timeout_s
        while not (port_file.is_file() and len(port_file.read_text().split()) >= 2):
            if proc.poll() is not None:
                raise RuntimeError(f"chromium exited {proc.returncode}: {proc.stderr.read().decode()[-2000:]}")
            if time.monotonic() > deadline:
                raise TimeoutError("chromium did not open its DevTools port")
            time.sleep(0.05)
        port, path = port_file.read_text().split()[:2]
        ws = websocket.create_connection(f"ws://127.0.0.1:{port}{path}", timeout=timeout_s, suppress_origin=True)
        cdp = _Session(ws)
        target = cdp.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        sid = cdp.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Page", "Runtime", "Log", "Network"):
            cdp.send(f"{domain}.enable", session=sid)
        cdp.send(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": 900, "deviceScaleFactor": 1, "mobile": False},
            session=sid,
        )
        cdp.events.clear()
        cdp.send("Page.navigate", {"url": url}, session=sid)
        loaded = bool(cdp.wait_for("Page.loadEventFired", timeout_s))
        state = cdp.send(
            "Runtime.evaluate",
            {"expression": "document.readyState + '|' + document.title", "returnByValue": True},
            session=sid,
        )["result"]["value"]
        measured = cdp.send(
            "Runtime.evaluate", {"expression": f"JSON.stringify({measure})", "returnByValue": True}, session=sid
        )["result"].get("value")
        metrics = cdp.send("Page.getLayoutMetrics", session=sid)["cssContentSize"]
        height = int(metrics["height"]) + 1
        cdp.send(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
            session=sid,
        )
        shot = cdp.send(
            "Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True}, session=sid, timeout_s=timeout_s
        )
        # Late console messages (a resource refused after load) still count.
        cdp.send("Runtime.evaluate", {"expression": "1"}, session=sid)
        console, requests = [], []
        for event in cdp.events:
            method, params = event.get("method"), event.get("params", {})
            if method == "Runtime.consoleAPICalled":
                console.append(
                    {
                        "level": params.get("type"),
                        "text": " ".join(str(a.get("value", a.get("description", ""))) for a in params.get("args", [])),
                    }
                )
            elif method == "Runtime.exceptionThrown":
                console.append({"level": "exception", "text": json.dumps(params.get("exceptionDetails"))})
            elif method == "Log.entryAdded":
                entry = params.get("entry", {})
                console.append({"level": entry.get("level"), "text": entry.get("text"), "url": entry.get("url")})
            elif method == "Network.requestWillBeSent":
                requests.append(params.get("request", {}).get("url"))
        try:
            cdp.send("Browser.close", timeout_s=5)
        except Exception:  # the browser may close the socket before it answers
            pass
        ws.close()
        status, _, title = state.partition("|")
        return PageResult(
            loaded=loaded and status == "complete",
            title=title,
            console=console,
            requests=requests,
            measured=json.loads(measured) if measured else None,
            png=base64.b64decode(shot["data"]),
        )
    finally:
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait(timeout=10)
