"""The viewer's documentation screenshots (docs/images/viewer/<family>.png and side-by-side.png).

Trains one small model per variant family on Bible verses (German -> English, 150 steps on the CPU; kept
in --runs_dir and reused), writes each one's viewer with `hf-attn view`'s library function, opens it in headless
Chromium on a view that shows the family's overlay, and saves the page as a PNG.

    python scripts/viewer_screenshots.py [--runs_dir runs/viewer-shots] [--output docs/images/viewer] [--steps 150]

The browser is driven by `Chromium` below, over the DevTools protocol on a pipe with Python's standard library only
(the viewer's browser test, tests/analysis/test_viewer_browser.py, drives it too). Chromium started with
``--remote-debugging-pipe`` reads protocol commands (JSON, each ended by a NUL byte) from its file descriptor 3 and
writes answers and events to descriptor 4; no port, no websocket, no extra package:

    with Chromium() as browser:
        page = browser.open(Path("attention.html"))          # waits for the load event
        page.wait_for("document.body.dataset.ready === 'true'")
        page.evaluate("document.title")
        page.screenshot(Path("shot.png"))
        page.errors                                        # console errors, uncaught exceptions, failed loads
        page.requests                                      # every URL the page asked for
"""

from __future__ import annotations

import argparse
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

# --------------------------------------------------------------------------------------------------- the browser
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


# ----------------------------------------------------------------------------------------------- the screenshots
# family -> (preset, what to show: site, layer (-1 = last), head (-1 = mean; "nullest" = the head with most null
# rows among those that still attend somewhere, so that the picture shows null rows beside live ones), map (None =
# the weights))
FAMILIES = {
    "softmax": ("softmax", "cross", -1, -1, None),
    "rela": ("rela-g", "cross", -1, "nullest", None),
    "gmm": ("gmm", "cross", -1, 0, None),
    "reluformer": ("reluformer", "cross", -1, -1, None),
    "calibration": ("calibration-gate", "cross", -1, 0, "mask m"),
    "ran": ("ran-all", "encoder", -1, -1, None),
}
SIDE_BY_SIDE = ("softmax", "rela-g")

TRAIN_ARGS = [
    "--source", "de", "--target", "en", "--max_train_samples", "4000", "--max_eval_samples", "32",
    "--max_predict_samples", "16", "--vocab_size", "1000", "--d_model", "64", "--encoder_layers", "2",
    "--decoder_layers", "2", "--encoder_attention_heads", "4", "--decoder_attention_heads", "4",
    "--encoder_ffn_dim", "128", "--decoder_ffn_dim", "128", "--per_device_train_batch_size", "16",
    "--warmup_steps", "30", "--learning_rate", "3e-3", "--max_source_length", "48", "--max_target_length", "48",
    "--generation_max_new_tokens", "40", "--num_beams", "1", "--save_strategy", "no", "--eval_strategy", "no",
    "--logging_steps", "50", "--disable_tqdm", "true",
]


def train(preset: str, runs_dir: Path, steps: int) -> Path:
    """A small model of ``preset`` (trained once; an existing run directory is reused)."""
    from hf_attn.cli import main

    out = runs_dir / preset
    if (out / "results.json").is_file():
        return out
    rc = main(["train", "--preset", preset, *TRAIN_ARGS, "--max_steps", str(steps), "--output_dir", str(out)])
    if rc != 0:
        raise SystemExit(f"training {preset} failed (exit {rc})")
    return out


def shortest_sentence(data: dict, limit: int = 18) -> int:
    """The index of the longest sentence whose source has at most ``limit`` tokens (else the shortest one)."""
    lengths = [len(s["models"][0]["source_tokens"]) for s in data["sentences"]]
    fitting = [i for i, n in enumerate(lengths) if n <= limit]
    return max(fitting, key=lambda i: lengths[i]) if fitting else min(range(len(lengths)), key=lengths.__getitem__)


def shoot(browser: Chromium, page_path: Path, png: Path, site: str, layer: int, head, map_name) -> None:
    from hf_attn.analysis.viewer import read_viewer_data

    data = read_viewer_data(page_path)
    sentence = shortest_sentence(data)
    layers = data["sentences"][sentence]["models"][0]["sites"][site]
    layer = layer % len(layers)
    if head == "nullest":
        rates = layers[layer]["stats"]["null_rate"]
        live = [h for h in range(len(rates)) if rates[h] < 1] or list(range(len(rates)))  # (a head all null: blank)
        head = max(live, key=rates.__getitem__)
    page = browser.open(page_path)
    page.wait_for("document.body.dataset.ready === 'true'")
    for control, value in (("sentence", sentence), ("site", site), ("layer", layer), ("head", head)):
        page.evaluate(f"(() => {{ const s = document.getElementById('{control}'); s.value = {json.dumps(str(value))}; "
                      "s.dispatchEvent(new Event('change')); })()")
    if map_name:
        page.evaluate("(() => { const s = document.querySelector('.panel select.map'); "
                      f"s.value = {json.dumps(map_name)}; s.dispatchEvent(new Event('change')); }})()")
    page.evaluate("document.getElementById('controls').style.position = 'static'")
    page.screenshot(png)
    if page.errors:
        raise SystemExit(f"{page_path}: the page reported errors: {page.errors}")
    print(f"wrote {png}")


def main(argv=None) -> int:
    from hf_attn.analysis.viewer import write_viewer

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs_dir", type=Path, default=Path("runs/viewer-shots"))
    ap.add_argument("--output", type=Path, default=Path("docs/images/viewer"))
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--sentences", type=int, default=8)
    a = ap.parse_args(argv)
    a.output.mkdir(parents=True, exist_ok=True)
    runs = {preset: train(preset, a.runs_dir, a.steps) for preset, *_ in FAMILIES.values()}
    with Chromium(width=1280, height=900) as browser:
        for family, (preset, site, layer, head, map_name) in FAMILIES.items():
            page = write_viewer([runs[preset]], a.runs_dir / f"{family}.html", a.sentences, progress=False)
            shoot(browser, page, a.output / f"{family}.png", site, layer, head, map_name)
        page = write_viewer([runs[p] for p in SIDE_BY_SIDE], a.runs_dir / "side-by-side.html", a.sentences,
                            progress=False)
        shoot(browser, page, a.output / "side-by-side.png", "cross", -1, -1, None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
