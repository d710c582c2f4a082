"""Drive a headless Chromium over the DevTools protocol on a pipe: Python's standard library only.

Chromium started with ``--remote-debugging-pipe`` reads protocol commands (JSON, each ended by a NUL byte) from its
file descriptor 3 and writes answers and events to descriptor 4; no port, no websocket, no extra package. Used by the
viewer's browser test and by ``scripts/viewer_screenshots.py``.

    with Chromium() as browser:
        page = browser.open(Path("attention.html"))          # waits for the load event
        page.wait_for("document.body.dataset.ready === 'true'")
        page.evaluate("document.title")
        page.screenshot(Path("shot.png"))
        page.errors                                        # console errors, uncaught exceptions, failed loads
        page.requests                                      # every URL the page asked for
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

# run in a small Python process that puts the pipe ends at descriptors 3 and 4, then becomes the browser
TRAMPOLINE = "import os, sys; os.dup2(int(sys.argv[1]), 3); os.dup2(int(sys.argv[2]), 4); os.execv(sys.argv[3], sys.argv[3:])"
CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def find_chromium() -> str | None:
    """The first Chromium-like executable on PATH (Debian's package installs ``chromium``), or None."""
    for name in CANDIDATES:
        path = shutil.which(name)
        if path:
            return path
    return None


class ChromiumError(RuntimeError):
    """The browser did not answer, answered with an error, or a condition did not become true in time."""


class Chromium:
    """One headless Chromium process; `open` gives a `Page` per file."""

    def __init__(self, executable: str | None = None, width: int = 1400, height: int = 1000, timeout: float = 30.0):
        executable = executable or find_chromium()
        if not executable:
            raise ChromiumError(f"no Chromium found on PATH (looked for {', '.join(CANDIDATES)})")
        self.timeout = timeout
        self.profile = tempfile.mkdtemp(prefix="hf-attn-chromium-")
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()
        # the browser's ends at descriptors >= 10, so that moving them to 3 and 4 never overwrites one with the other
        child_r = fcntl.fcntl(to_browser_r, fcntl.F_DUPFD_CLOEXEC, 10)
        child_w = fcntl.fcntl(from_browser_w, fcntl.F_DUPFD_CLOEXEC, 10)
        os.close(to_browser_r)
        os.close(from_browser_w)
        args = [executable, "--headless=new", "--remote-debugging-pipe", f"--user-data-dir={self.profile}",
                "--no-first-run", "--no-default-browser-check", "--disable-gpu", "--disable-extensions",
                "--disable-background-networking", "--disable-sync", "--disable-dev-shm-usage", "--mute-audio",
                "--hide-scrollbars", f"--window-size={width},{height}", "about:blank"]
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            args.insert(1, "--no-sandbox")  # Chromium refuses to run as root with its sandbox
        self.log_path = Path(self.profile) / "chromium.log"
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen([sys.executable, "-c", TRAMPOLINE, str(child_r), str(child_w), *args],
                                         pass_fds=(child_r, child_w), stdin=subprocess.DEVNULL,
                                         stdout=subprocess.DEVNULL, stderr=log)
        os.close(child_r)
        os.close(child_w)
        self._next_id = 0
        self._answers: dict[int, dict] = {}
        self._events: queue.Queue = queue.Queue()
        self._cond = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self.send("Browser.getVersion")  # the browser is up and listening

    # ---- protocol ----------------------------------------------------------------------------------------------
    def _read(self) -> None:
        buffer = b""
        while True:
            try:
                chunk = os.read(self._from_browser, 1 << 16)
            except OSError:
                chunk = b""
            if not chunk:
                with self._cond:
                    self._answers[-1] = {"closed": True}
                    self._cond.notify_all()
                return
            buffer += chunk
            *messages, buffer = buffer.split(b"\0")
            for raw in messages:
                message = json.loads(raw)
                if "id" in message:
                    with self._cond:
                        self._answers[message["id"]] = message
                        self._cond.notify_all()
                else:
                    self._events.put(message)

    def send(self, method: str, params: dict | None = None, session: str | None = None, timeout: float | None = None):
        """Send one command and wait for its answer's ``result``."""
        with self._cond:
            self._next_id += 1
            ident = self._next_id
        message = {"id": ident, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + (timeout or self.timeout)
        with self._cond:
            while ident not in self._answers:
                if -1 in self._answers:
                    raise ChromiumError(f"Chromium closed the pipe during {method} (log: {self.log_path})")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise ChromiumError(f"no answer to {method} within {timeout or self.timeout:.0f} s")
                self._cond.wait(left)
            answer = self._answers.pop(ident)
        if "error" in answer:
            raise ChromiumError(f"{method}: {answer['error'].get('message')}")
        return answer.get("result", {})

    def events(self) -> list[dict]:
        """The events received since the last call."""
        out = []
        while True:
            try:
                out.append(self._events.get_nowait())
            except queue.Empty:
                return out

    # ---- pages ---------------------------------------------------------------------------------------------------
    def open(self, path: Path, timeout: float | None = None) -> "Page":
        """A new tab showing the local file ``path``, once its load event fired."""
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        page = Page(self, target, session)
        for domain in ("Page", "Runtime", "Log", "Network"):
            self.send(f"{domain}.enable", session=session)
        self.send("Page.navigate", {"url": Path(path).resolve().as_uri()}, session=session)
        page.wait_for_event("Page.loadEventFired", timeout)
        return page

    def close(self) -> None:
        try:
            if self.proc.poll() is None:
                try:
                    self.send("Browser.close", timeout=5)
                except ChromiumError:
                    pass
                try:
                    self.proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait()
        finally:
            for fd in (self._to_browser, self._from_browser):
                try:
                    os.close(fd)
                except OSError:
                    pass
            shutil.rmtree(self.profile, ignore_errors=True)

    def __enter__(self) -> "Chromium":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class Page:
    """One tab: evaluate scripts, wait for conditions, take screenshots, collect errors and requests."""

    def __init__(self, browser: Chromium, target: str, session: str):
        self.browser, self.target, self.session = browser, target, session
        self.errors: list[str] = []
        self.requests: list[str] = []

    def _collect(self) -> list[dict]:
        mine = []
        for event in self.browser.events():
            if event.get("sessionId") != self.session:
                continue
            method, params = event["method"], event.get("params", {})
            if method == "Runtime.exceptionThrown":
                details = params.get("exceptionDetails", {})
                text = details.get("exception", {}).get("description") or details.get("text", "exception")
                self.errors.append(f"uncaught: {text}")
            elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
                args = " ".join(str(a.get("value", a.get("description", ""))) for a in params.get("args", []))
                self.errors.append(f"console.{params['type']}: {args}")
            elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
                self.errors.append(f"log: {params['entry'].get('text')} {params['entry'].get('url', '')}".strip())
            elif method == "Network.requestWillBeSent":
                self.requests.append(params.get("request", {}).get("url", ""))
            mine.append(event)
        return mine

    def wait_for_event(self, method: str, timeout: float | None = None) -> dict:
        deadline = time.monotonic() + (timeout or self.browser.timeout)
        while time.monotonic() < deadline:
            for event in self._collect():
                if event["method"] == method:
                    return event
            time.sleep(0.05)
        raise ChromiumError(f"no {method} within {timeout or self.browser.timeout:.0f} s")

    def evaluate(self, expression: str, timeout: float | None = None):
        """The value of a JavaScript expression (promises awaited), as JSON-ready Python data."""
        result = self.browser.send("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                                        "awaitPromise": True}, self.session, timeout)
        self._collect()
        if "exceptionDetails" in result:
            details = result["exceptionDetails"]
            raise ChromiumError(f"{expression[:80]!r} threw: "
                                f"{details.get('exception', {}).get('description') or details.get('text')}")
        return result.get("result", {}).get("value")

    def wait_for(self, condition: str, timeout: float | None = None) -> None:
        """Poll the JavaScript ``condition`` until it is truthy."""
        deadline = time.monotonic() + (timeout or self.browser.timeout)
        while not self.evaluate(f"Boolean({condition})"):
            if time.monotonic() > deadline:
                raise ChromiumError(f"{condition!r} still false after {timeout or self.browser.timeout:.0f} s; "
                                    f"page errors: {self.errors or 'none'}")
            time.sleep(0.05)

    def screenshot(self, path: Path, selector: str | None = None) -> Path:
        """A PNG of the whole page (or of the element ``selector``), written to ``path``."""
        if selector:
            box = self.evaluate(f"(() => {{ const r = document.querySelector({json.dumps(selector)})"
                                ".getBoundingClientRect(); return [r.x + scrollX, r.y + scrollY, r.width, r.height]; })()")
            clip = {"x": box[0], "y": box[1], "width": box[2], "height": box[3], "scale": 1}
        else:
            size = self.evaluate("[document.documentElement.scrollWidth, document.documentElement.scrollHeight]")
            clip = {"x": 0, "y": 0, "width": size[0], "height": size[1], "scale": 1}
        data = self.browser.send("Page.captureScreenshot", {"format": "png", "clip": clip,
                                                            "captureBeyondViewport": True}, self.session)["data"]
        Path(path).write_bytes(base64.b64decode(data))
        self._collect()
        return Path(path)
