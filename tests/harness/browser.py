"""A real headless Chromium (Debian's package) driven over the DevTools protocol.

Playwright cannot download its browsers here, so the tests speak CDP to the system's
chromium themselves: a page is navigated, read and clicked with JavaScript evaluated in
it (`Runtime.evaluate`), and photographed with `Page.captureScreenshot`. The browser is
a `Proc`, stopped by its process group like every other server a test starts.
"""

import base64
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import websocket

from tests.harness.procs import Proc, free_port
from tests.harness.servers import service_env


def chromium_path() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        # A developer without it may skip; CI (which scripts/test provisions) must not.
        if os.environ.get("CI"):
            pytest.fail("chromium is not installed, and CI must run the console's test")
        pytest.skip("chromium is not installed (scripts/test installs it)")
    return found


class Browser:
    """One tab of a headless Chromium, with its own profile (cookies) under `workdir`."""

    def __init__(self, workdir: Path, width: int = 1280, height: int = 900) -> None:
        port = free_port()
        self.proc = Proc("chromium", [
            chromium_path(), "--headless", "--disable-gpu", "--no-sandbox",
            "--disable-dev-shm-usage", "--no-first-run", "--no-default-browser-check",
            f"--user-data-dir={workdir / 'chromium-profile'}", f"--remote-debugging-port={port}",
            "--remote-allow-origins=*", f"--window-size={width},{height}", "about:blank"],
            service_env(), workdir)
        base = f"http://127.0.0.1:{port}"
        self.proc.wait_until(lambda: httpx.get(f"{base}/json/version", timeout=2).is_success)
        page = next(t for t in httpx.get(f"{base}/json", timeout=5).json() if t["type"] == "page")
        self.ws = websocket.create_connection(page["webSocketDebuggerUrl"], timeout=60,
                                              suppress_origin=True)
        self._id = 0
        self.send("Page.enable")
        self.send("Runtime.enable")
        self.resize(width, height)

    def send(self, method: str, **params: Any) -> dict[str, Any]:
        """One CDP command and its result (events arriving meanwhile are dropped)."""
        self._id += 1
        self.ws.send(json.dumps({"id": self._id, "method": method, "params": params}))
        while True:
            message = json.loads(self.ws.recv())
            if message.get("id") == self._id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message.get("result", {})

    def evaluate(self, expression: str) -> Any:
        """The expression's value in the page (promises awaited)."""
        result = self.send("Runtime.evaluate", expression=expression, returnByValue=True,
                           awaitPromise=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def goto(self, url: str) -> None:
        self.send("Page.navigate", url=url)
        self.settled()

    def settled(self, timeout: float = 30.0) -> None:
        """Wait for the page (a navigation, a form's answer) to have loaded."""
        time.sleep(0.2)
        self.wait_for("document.readyState === 'complete'", timeout)

    def wait_for(self, expression: str, timeout: float = 30.0, every: float = 0.1) -> Any:
        """Poll the expression until it is truthy; its value."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                value = self.evaluate(expression)
            except RuntimeError:  # the page is being replaced
                value = None
            if value:
                return value
            if time.monotonic() > deadline:
                raise TimeoutError(f"{expression!r} still false after {timeout}s "
                                   f"at {self.evaluate('location.href')}: "
                                   f"{self.evaluate('document.body.innerText')[:600]}")
            time.sleep(every)

    def fill(self, selector: str, text: str) -> None:
        self.evaluate(f"document.querySelector({json.dumps(selector)}).value = "
                      f"{json.dumps(text)}")

    def click(self, selector: str) -> None:
        """Click it as a user would, by its DOM (a button submits its form)."""
        self.evaluate(f"document.querySelector({json.dumps(selector)}).click()")

    def text(self, selector: str) -> str:
        return self.evaluate(f"(document.querySelector({json.dumps(selector)}) || "
                             "{innerText: ''}).innerText")

    def resize(self, width: int, height: int, mobile: bool = False) -> None:
        self.send("Emulation.setDeviceMetricsOverride", width=width, height=height,
                  deviceScaleFactor=1, mobile=mobile)

    def screenshot(self, path: Path, full_page: bool = True) -> None:
        params: dict[str, Any] = {"format": "png", "captureBeyondViewport": full_page}
        if full_page:
            width, height = self.evaluate(
                "[document.documentElement.scrollWidth, document.documentElement.scrollHeight]")
            params["clip"] = {"x": 0, "y": 0, "width": width, "height": height, "scale": 1}
        data = self.send("Page.captureScreenshot", **params)["data"]
        path.write_bytes(base64.b64decode(data))

    def close(self) -> None:
        try:
            self.ws.close()
        finally:
            self.proc.stop()
