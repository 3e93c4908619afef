"""Open a page in real headless Chromium and report what a person's browser would see and complain about.

Talks the DevTools protocol over ``--remote-debugging-pipe`` (fds 3 and 4, NUL-separated
JSON), so it needs nothing beyond the standard library and Debian's ``chromium``
(``make setup`` installs it). Collected while the page loads: console messages, uncaught
exceptions, browser log entries (failed loads, blocked content), every network request
and any JavaScript dialog (an ``alert`` an injected script would open).
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

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
    "--disable-extensions",
    "--remote-debugging-pipe",
)


def chromium_binary() -> str:
    """``$LAKESCORE_CHROMIUM``, else the first Chromium on ``PATH``; raises (never skips) when there is none."""
    found = os.environ.get("LAKESCORE_CHROMIUM") or next(filter(None, map(shutil.which, CANDIDATES)), None)
    if not found:
        raise RuntimeError("no Chromium found: `make setup` installs Debian's chromium, or set LAKESCORE_CHROMIUM")
    return found


@dataclass
class PageVisit:
    """What loading one page produced."""

    console: list[dict[str, Any]] = field(default_factory=list)
    exceptions: list[str] = field(default_factory=list)
    log_entries: list[dict[str, Any]] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)
    dialogs: list[str] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)
    screenshot: bytes = b""

    def errors(self) -> list[str]:
        """Console errors, uncaught exceptions and error-level browser log entries, as text."""
        return (
            [f"console.{m['type']}: {m.get('text')}" for m in self.console if m["type"] in ("error", "assert")]
            + [f"exception: {e}" for e in self.exceptions]
            + [f"log: {e.get('text')} ({e.get('url')})" for e in self.log_entries if e.get("level") == "error"]
        )


class _Pipe:
    """The DevTools pipe: numbered commands, their results, and the events that arrive meanwhile."""

    def __init__(self, write_fd: int, read_fd: int, on_event) -> None:
        self._out, self._in = os.fdopen(write_fd, "wb", buffering=0), os.fdopen(read_fd, "rb", buffering=0)
        self._buffer, self._next, self._on_event = b"", 0, on_event

    def call(self, method: str, session: str | None = None, timeout: float = 30.0, **params) -> dict[str, Any]:
        self._next += 1
        message: dict[str, Any] = {"id": self._next, "method": method, "params": params}
        if session:
            message["sessionId"] = session
        self._out.write(json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            reply = self._read()
            if reply.get("id") == self._next:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
        raise TimeoutError(f"no reply to {method} within {timeout} s")

    def wait_for(self, event: str, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._read().get("method") == event:
                return
        raise TimeoutError(f"no {event} within {timeout} s")

    def _read(self) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            chunk = self._in.read(65536)
            if not chunk:
                raise RuntimeError("Chromium closed the DevTools pipe")
            self._buffer += chunk
        raw, self._buffer = self._buffer.split(b"\0", 1)
        message = json.loads(raw)
        if "method" in message:
            self._on_event(message)
        return message


def visit(url: str, facts_js: str, width: int = 1200) -> PageVisit:
    """Load ``url`` in a fresh headless Chromium, evaluate ``facts_js`` (an expression returning JSON-able
    data) after the load event, screenshot the whole page, and return everything collected."""
    result = PageVisit()
    commands_r, commands_w = os.pipe()
    replies_r, replies_w = os.pipe()
    profile = tempfile.mkdtemp(prefix="lakescore-chromium-")

    def fds() -> None:  # the child's fd 3 reads commands, fd 4 writes replies (the pipe's contract)
        reads, writes = os.dup(commands_r), os.dup(replies_w)  # above 4, so the dup2s below clobber nothing
        os.dup2(reads, 3, inheritable=True)
        os.dup2(writes, 4, inheritable=True)

    browser = subprocess.Popen(
        [chromium_binary(), *FLAGS, f"--user-data-dir={profile}", "about:blank"],
        preexec_fn=fds,
        close_fds=False,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    os.close(commands_r)
    os.close(replies_w)
    pipe = _Pipe(commands_w, replies_r, lambda event: _record(result, event))
    try:
        target = pipe.call("Target.createTarget", url="about:blank")["targetId"]
        session = pipe.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        for domain in ("Runtime", "Log", "Page", "Network"):
            pipe.call(f"{domain}.enable", session)
        pipe.call(
            "Emulation.setDeviceMetricsOverride", session, width=width, height=900, deviceScaleFactor=1, mobile=False
        )
        pipe.call("Page.navigate", session, url=url)
        pipe.wait_for("Page.loadEventFired")
        evaluated = pipe.call("Runtime.evaluate", session, expression=facts_js, returnByValue=True)
        result.facts = evaluated["result"].get("value") or {}
        height = pipe.call(
            "Runtime.evaluate", session, expression="document.documentElement.scrollHeight", returnByValue=True
        )["result"]["value"]
        pipe.call(
            "Emulation.setDeviceMetricsOverride",
            session,
            width=width,
            height=int(height),
            deviceScaleFactor=1,
            mobile=False,
        )
        shot = pipe.call("Page.captureScreenshot", session, format="png", timeout=60)
        result.screenshot = base64.b64decode(shot["data"])
        pipe.call("Browser.close")
    finally:
        if browser.poll() is None:
            browser.kill()
        browser.wait(timeout=30)
        shutil.rmtree(profile, ignore_errors=True)
    return result


def _record(result: PageVisit, event: dict[str, Any]) -> None:
    method, params = event["method"], event.get("params", {})
    if method == "Runtime.consoleAPICalled":
        text = " ".join(str(a.get("value", a.get("description", ""))) for a in params.get("args", []))
        result.console.append({"type": params.get("type"), "text": text})
    elif method == "Runtime.exceptionThrown":
        details = params.get("exceptionDetails", {})
        result.exceptions.append(str(details.get("exception", {}).get("description") or details.get("text")))
    elif method == "Log.entryAdded":
        result.log_entries.append(params.get("entry", {}))
    elif method == "Network.requestWillBeSent":
        result.requests.append(params.get("request", {}).get("url", ""))
    elif method == "Page.javascriptDialogOpening":
        result.dialogs.append(params.get("message", ""))
