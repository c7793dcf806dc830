"""Drive a local headless Chromium over the DevTools pipe: open a page, evaluate JS, take screenshots.

Used by the browser tests and `docs/screenshots/make_screenshots.py`. It talks the DevTools protocol
over `--remote-debugging-pipe` (NUL-separated JSON on file descriptors 3 and 4), so it needs no
websocket library and opens no port. Chromium comes from the system (`apt-get install chromium`).
"""

from __future__ import annotations

import base64
import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Self

from trace_tools.errors import TraceToolsError

CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
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
    "--remote-debugging-pipe",
)

# The command pipe is created first, so its fd is lower than the reply pipe's: moving it to 3
# can never overwrite the reply end before that one is moved to 4.
WIRE_FDS = (
    "import os, sys; os.dup2(int(sys.argv[1]), 3); os.dup2(int(sys.argv[2]), 4); os.execv(sys.argv[3], sys.argv[3:])"
)


def find_chromium() -> str | None:
    """Path of a Chromium/Chrome binary (`TRACE_TOOLS_CHROMIUM` wins), or None."""
    explicit = os.environ.get("TRACE_TOOLS_CHROMIUM")
    if explicit:
        return explicit if Path(explicit).exists() else None
    return next((path for name in CANDIDATES if (path := shutil.which(name))), None)


class Chromium:
    """One headless browser with one page; use as a context manager."""

    def __init__(self, binary: str | None = None, width: int = 1280, height: int = 860, timeout: float = 30.0):
        found = binary or find_chromium()
        if not found:
            raise TraceToolsError(
                "no Chromium found; install it (`apt-get install chromium`) or set TRACE_TOOLS_CHROMIUM"
            )
        self.binary: str = found
        self.width, self.height, self.timeout = width, height, timeout
        self._next_id = 0
        self._buffer = b""
        self._events: list[dict[str, Any]] = []

    def __enter__(self) -> Self:
        self._profile = tempfile.mkdtemp(prefix="tt-chromium-")
        commands, self._to_browser = os.pipe()
        self._from_browser, replies = os.pipe()
        # Chromium reads commands on fd 3 and writes replies to fd 4; a tiny launcher moves our pipe ends there
        self._proc = subprocess.Popen(
            [
                sys.executable,
                "-I",
                "-c",
                WIRE_FDS,
                str(commands),
                str(replies),
                self.binary,
                *FLAGS,
                f"--user-data-dir={self._profile}",
                f"--window-size={self.width},{self.height}",
                "about:blank",
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            pass_fds=(commands, replies),
        )
        os.close(commands)
        os.close(replies)
        self._session = self._attach_page()
        self.send("Page.enable")
        self.send("Runtime.enable")
        self.send(
            "Emulation.setDeviceMetricsOverride",
            {"width": self.width, "height": self.height, "deviceScaleFactor": 1, "mobile": False},
        )
        return self

    def __exit__(self, *exc) -> None:
        try:
            self.send("Browser.close", session=False)
        except (TraceToolsError, OSError):  # already gone: nothing left to close politely
            pass
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        os.close(self._to_browser)
        os.close(self._from_browser)
        shutil.rmtree(self._profile, ignore_errors=True)

    def open(self, url: str, ready: str | None = None) -> float:
        """Navigate and wait for the load event (and for the JS expression `ready` to be truthy).

        Returns the seconds from navigation to ready, measured by this driver.
        """
        self._events.clear()
        started = time.perf_counter()
        self.send("Page.navigate", {"url": url})
        self._wait_event("Page.loadEventFired")
        if ready:
            self.wait_for(ready)
        return time.perf_counter() - started

    def evaluate(self, expression: str) -> Any:
        """Value of a JS expression (promises awaited), or a TraceToolsError with the JS exception."""
        reply = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True, "awaitPromise": True})
        if "exceptionDetails" in reply:
            details = reply["exceptionDetails"]
            text = (details.get("exception") or {}).get("description") or details.get("text")
            raise TraceToolsError(f"JS error in {expression[:60]!r}: {text}")
        return reply["result"].get("value")

    def wait_for(self, expression: str) -> Any:
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            value = self.evaluate(expression)
            if value:
                return value
            time.sleep(0.02)
        raise TraceToolsError(f"timed out waiting for {expression!r}")

    def screenshot(self, path: str | Path, element: str | None = None, margin: int = 8) -> Path:
        """PNG of the viewport, or of the element matching the CSS selector `element` (plus `margin` px)."""
        params: dict[str, Any] = {"format": "png"}
        if element:
            box = self.evaluate(
                f"(() => {{ const r = document.querySelector({json.dumps(element)}).getBoundingClientRect();"
                " return [r.left + scrollX, r.top + scrollY, r.width, r.height]; })()"
            )
            params |= {
                "captureBeyondViewport": True,
                "clip": {
                    "x": max(box[0] - margin, 0),
                    "y": max(box[1] - margin, 0),
                    "width": box[2] + 2 * margin,
                    "height": box[3] + 2 * margin,
                    "scale": 1,
                },
            }
        data = self.send("Page.captureScreenshot", params)["data"]
        Path(path).write_bytes(base64.b64decode(data))
        return Path(path)

    def console_errors(self) -> list[str]:
        """Uncaught exceptions seen since the last `open`."""
        return [
            e["params"]["exceptionDetails"].get("text", "")
            + " "
            + str((e["params"]["exceptionDetails"].get("exception") or {}).get("description", ""))
            for e in self._events
            if e.get("method") == "Runtime.exceptionThrown"
        ]

    def send(self, method: str, params: dict[str, Any] | None = None, session: bool = True) -> dict[str, Any]:
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if session and getattr(self, "_session", None):
            message["sessionId"] = self._session
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        while True:
            reply = self._read()
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise TraceToolsError(f"DevTools {method}: {reply['error'].get('message')}")
                return reply.get("result", {})
            self._events.append(reply)

    def _attach_page(self) -> str:
        targets = self.send("Target.getTargets", session=False)["targetInfos"]
        page = next(t for t in targets if t["type"] == "page")
        return self.send("Target.attachToTarget", {"targetId": page["targetId"], "flatten": True}, session=False)[
            "sessionId"
        ]

    def _wait_event(self, method: str) -> dict[str, Any]:
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            for event in self._events:
                if event.get("method") == method:
                    return event
            self._events.append(self._read())
        raise TraceToolsError(f"timed out waiting for {method}")

    def _read(self) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            if not select.select([self._from_browser], [], [], self.timeout)[0]:
                raise TraceToolsError(f"Chromium did not answer within {self.timeout:.0f} s")
            chunk = os.read(self._from_browser, 1 << 16)
            if not chunk:
                raise TraceToolsError("Chromium closed the DevTools pipe (did it crash? try running it by hand)")
            self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)
