"""Headless Chromium driven over the DevTools protocol on a pipe (`--remote-debugging-pipe`:
JSON messages ended by a NUL byte on file descriptors 3 and 4), so the browser tests need no
driver program and no WebSocket client. `.ci/run` installs Debian's `chromium`."""

from __future__ import annotations

import base64
import json
import os
import select
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest


def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    pytest.fail("no Chromium on PATH: .ci/run installs Debian's chromium (apt-get install chromium)")


class Browser:
    """Headless Chromium with one page, spoken to over the DevTools pipe."""

    def __init__(self, profile: Path, trust_any_certificate: bool = False) -> None:
        """`trust_any_certificate`: for a server whose certificate a test CA signed."""
        # fds 3 (commands in) and 4 (answers out) in the child, as --remote-debugging-pipe wants.
        commands_read, self.commands = os.pipe()
        self.answers, answers_write = os.pipe()

        def give_pipes() -> None:
            os.dup2(commands_read, 3)
            os.dup2(answers_write, 4)
            # dup2 onto itself (a pipe that already was fd 3 or 4) keeps close-on-exec.
            os.set_inheritable(3, True)
            os.set_inheritable(4, True)

        self.process = subprocess.Popen(
            [chromium(), "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
             "--remote-debugging-pipe", f"--user-data-dir={profile}", "about:blank",
             *(["--ignore-certificate-errors"] if trust_any_certificate else [])],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            # Not close_fds: it would close 3 and 4 after give_pipes made them.
            close_fds=False, preexec_fn=give_pipes,
        )
        os.close(commands_read)
        os.close(answers_write)
        self.next_id = 0
        self.unread = b""
        self.session = ""

    def call(self, method: str, session: bool = True, **params: Any) -> dict[str, Any]:
        """Sends one command and returns its result (events in between are skipped)."""
        self.next_id += 1
        message: dict[str, Any] = {"id": self.next_id, "method": method, "params": params}
        if session:
            message["sessionId"] = self.session
        os.write(self.commands, json.dumps(message).encode() + b"\0")
        while True:
            while b"\0" not in self.unread:
                # A browser that stops answering fails the test rather than hanging it.
                ready, _, _ = select.select([self.answers], [], [], 60)
                if not ready:
                    raise RuntimeError(f"Chromium did not answer {method} within 60 s")
                chunk = os.read(self.answers, 1 << 16)
                if not chunk:
                    raise RuntimeError("Chromium closed the DevTools pipe")
                self.unread += chunk
            raw, self.unread = self.unread.split(b"\0", 1)
            answer = json.loads(raw)
            if answer.get("id") == self.next_id:
                if "error" in answer:
                    raise RuntimeError(f"{method}: {answer['error']}")
                return answer["result"]

    def open(self, url: str, before_load: str = "") -> None:
        """Opens `url` in the one page, once `before_load` (a script) is set to run first in
        every document it loads, and waits until it has loaded."""
        if not self.session:
            target = self.call("Target.createTarget", session=False, url="about:blank")["targetId"]
            self.session = self.call("Target.attachToTarget", session=False, targetId=target, flatten=True)[
                "sessionId"
            ]
            # Scripts set to run before each document need the page domain on.
            self.call("Page.enable")
        if before_load:
            self.call("Page.addScriptToEvaluateOnNewDocument", source=before_load)
        self.call("Page.navigate", url=url)
        # The page is there once its document, not the one before, has loaded.
        origin = "/".join(url.split("/")[:3])
        deadline = time.monotonic() + 30
        while self.evaluate("location.origin + ' ' + document.readyState") != f"{origin} complete":
            assert time.monotonic() < deadline, "the page did not load"
            time.sleep(0.05)

    def wait_for(self, expression: str, timeout: float = 30, what: str = "") -> Any:
        """The value of `expression` once it is truthy; fails after `timeout` seconds saying
        `what` was awaited and what the expression last gave."""
        deadline = time.monotonic() + timeout
        while True:
            value = self.evaluate(expression)
            if value:
                return value
            assert time.monotonic() < deadline, f"waited {timeout} s for {what or expression}; last: {value!r}"
            time.sleep(0.1)

    def screenshot(self, path: Path, width: int = 1280, height: int = 800) -> None:
        """A PNG of the page as a `width` x `height` window shows it."""
        self.call("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1, mobile=False)
        png = self.call("Page.captureScreenshot", format="png")["data"]
        path.write_bytes(base64.b64decode(png))

    def evaluate(self, expression: str) -> Any:
        answer = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in answer:
            raise RuntimeError(f"{expression}: {answer['exceptionDetails']}")
        return answer["result"].get("value")

    def close(self) -> None:
        self.process.kill()
        self.process.wait()
        os.close(self.commands)
        os.close(self.answers)
