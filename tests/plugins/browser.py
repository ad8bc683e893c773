"""Headless Chromium driven over the DevTools protocol (``websocket-client``, already in the lock).

Just what the UI tests need: set a cookie, open a page, wait for a condition, evaluate
JavaScript, take a full-page screenshot.
"""

from __future__ import annotations

import base64
import itertools
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import websocket

BINARIES = ("chromium", "chromium-browser", "google-chrome")


def find_chromium() -> str | None:
    return next((path for path in map(shutil.which, BINARIES) if path), None)


class Chromium:
    """One headless browser with one page; use as a context manager."""

    def __init__(self, binary: str, width: int = 1400, height: int = 1000, timeout_s: float = 30.0):
        self.profile = tempfile.mkdtemp(prefix="dlrover-chromium-")
        self.log = Path(self.profile) / "chromium.log"
        with self.log.open("w") as log:
            self.process = subprocess.Popen(
                [binary, "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
                 "--no-default-browser-check", "--hide-scrollbars", "--remote-debugging-port=0",
                 f"--user-data-dir={self.profile}", f"--window-size={width},{height}", "about:blank"],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )
        announced = Path(self.profile) / "DevToolsActivePort"  # its first line is the port
        deadline = time.monotonic() + timeout_s
        while not (announced.exists() and announced.read_text().strip()):
            if time.monotonic() > deadline or self.process.poll() is not None:
                output = self.log.read_text()[-2000:]
                self.close()
                raise RuntimeError(f"chromium did not start: {output}")
            time.sleep(0.1)
        port = int(announced.read_text().split()[0])
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=timeout_s) as response:
            page = next(t for t in json.load(response) if t["type"] == "page")
        self.ws = websocket.create_connection(page["webSocketDebuggerUrl"], timeout=timeout_s, suppress_origin=True)
        self.ids = itertools.count(1)

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        call_id = next(self.ids)
        self.ws.send(json.dumps({"id": call_id, "method": method, "params": params}))
        while True:
            message = json.loads(self.ws.recv())
            if message.get("id") == call_id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message["result"]

    def evaluate(self, expression: str) -> Any:
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression[:60]}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def set_cookie(self, url: str, name: str, value: str) -> None:
        assert self.call("Network.setCookie", url=url, name=name, value=value, httpOnly=True)["success"]

    def open(self, url: str) -> None:
        self.call("Page.enable")
        self.call("Page.navigate", url=url)

    def wait_for(self, expression: str, timeout_s: float = 60.0) -> Any:
        """Poll until ``expression`` is truthy; returns its value."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                value = self.evaluate(expression)
            except RuntimeError:  # the page is still navigating
                value = None
            if value:
                return value
            time.sleep(0.1)
        raise TimeoutError(f"{expression!r} still false after {timeout_s:g} s")

    def screenshot(self, path: Path) -> Path:
        """The whole page, not only the viewport."""
        size = self.call("Page.getLayoutMetrics")["cssContentSize"]
        shot = self.call("Page.captureScreenshot", format="png", captureBeyondViewport=True,
                         clip={"x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1})
        path.write_bytes(base64.b64decode(shot["data"]))
        return path

    def close(self) -> None:
        if getattr(self, "ws", None) is not None:
            self.ws.close()
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        shutil.rmtree(self.profile, ignore_errors=True)

    def __enter__(self) -> "Chromium":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
