"""A real headless browser for tests: Debian's chromium driven over the DevTools protocol (a
small client on `websocket-client`). Opens a page, records console errors, exceptions and
network requests, measures elements and saves a full-page screenshot."""

import base64
import json
import re
import shutil
import subprocess
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import websocket

CHROMIUM = ("chromium", "chromium-browser", "google-chrome")


def chromium_path() -> str | None:
    return next((p for p in map(shutil.which, CHROMIUM) if p), None)


@dataclass
class PageLoad:
    errors: list[str] = field(default_factory=list)  # console errors, exceptions, log errors
    requests: list[str] = field(default_factory=list)  # every URL the page asked for
    sizes: list[tuple[str, float, float]] = field(default_factory=list)  # (id, width, height)
    height: float = 0.0


class Chromium:
    """One headless chromium process with one page; use as a context manager."""

    def __init__(self, width: int = 1280):
        binary = chromium_path()
        if binary is None:
            raise RuntimeError("chromium is not installed: apt-get install -y chromium")
        self.width = width
        self.profile = tempfile.mkdtemp(prefix="onebuild-chromium-")
        self.process = subprocess.Popen(
            [binary, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
             "--remote-debugging-port=0", f"--user-data-dir={self.profile}",
             f"--window-size={width},800", "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )  # fmt: skip
        port = self._port()
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as answer:
            pages = [t for t in json.load(answer) if t["type"] == "page"]
        self.socket = websocket.create_connection(pages[0]["webSocketDebuggerUrl"], timeout=30)
        self.next_id = 0
        self.events: list[dict] = []

    def _port(self) -> int:
        """The DevTools port chromium chose, from the line it prints on stderr."""
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            line = self.process.stderr.readline().decode(errors="replace")
            found = re.search(r"DevTools listening on ws://[^:]+:(\d+)/", line)
            if found:
                return int(found.group(1))
            if not line and self.process.poll() is not None:
                break
        raise RuntimeError("chromium did not start its DevTools endpoint")

    def call(self, method: str, **params) -> dict:
        self.next_id += 1
        self.socket.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            message = json.loads(self.socket.recv())
            if message.get("id") == self.next_id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message["result"]
            self.events.append(message)

    def wait_for(self, event: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while not any(e.get("method") == event for e in self.events):
            if time.monotonic() > deadline:
                raise TimeoutError(f"no {event} within {timeout} s")
            self.events.append(json.loads(self.socket.recv()))

    def open(self, path: Path, screenshot: Path, selector: str) -> PageLoad:
        """Load `path`, measure the elements matching `selector` (by their closest id) and
        save a full-page PNG screenshot."""
        self.events.clear()
        for domain in ("Runtime", "Log", "Network", "Page"):
            self.call(f"{domain}.enable")
        self.call("Page.navigate", url=path.resolve().as_uri())
        self.wait_for("Page.loadEventFired")
        result = PageLoad()
        script = (
            f"JSON.stringify(Array.from(document.querySelectorAll({json.dumps(selector)}))"
            ".map(e => { const r = e.getBoundingClientRect();"
            " return [(e.closest('[id]') || e).id, r.width, r.height]; }))"
        )
        value = self.call("Runtime.evaluate", expression=script, returnByValue=True)
        result.sizes = [tuple(x) for x in json.loads(value["result"]["value"])]
        metrics = self.call("Page.getLayoutMetrics")
        result.height = metrics["cssContentSize"]["height"]
        self.call("Emulation.setDeviceMetricsOverride", width=self.width,
                  height=int(result.height), deviceScaleFactor=1, mobile=False)  # fmt: skip
        shot = self.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)
        screenshot.parent.mkdir(parents=True, exist_ok=True)
        screenshot.write_bytes(base64.b64decode(shot["data"]))
        for event in self.events:
            method, params = event.get("method"), event.get("params", {})
            if method == "Runtime.exceptionThrown":
                result.errors.append(params["exceptionDetails"].get("text", "exception"))
            elif method == "Runtime.consoleAPICalled" and params.get("type") == "error":
                result.errors.append(str(params.get("args")))
            elif method == "Log.entryAdded" and params["entry"]["level"] == "error":
                result.errors.append(params["entry"]["text"])
            elif method == "Network.requestWillBeSent":
                result.requests.append(params["request"]["url"])
        return result

    def evaluate(self, expression: str):
        """The JSON-serializable value of a JavaScript expression on the open page."""
        value = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        return value["result"].get("value")

    def __enter__(self) -> "Chromium":
        return self

    def __exit__(self, *exc) -> None:
        self.socket.close()
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        shutil.rmtree(self.profile, ignore_errors=True)
