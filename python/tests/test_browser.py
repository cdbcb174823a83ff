"""A real browser follows a stream: headless Chromium's own `EventSource` (docs/consuming.md,
"Server-Sent Events") reads what was appended, then what is appended while it follows, and
through a `kill -9` of the server it reconnects by itself, sends the last id it received as
`Last-Event-ID`, and goes on after it: each event once, in order.

Chromium is driven over the DevTools protocol on a pipe (`--remote-debugging-pipe`: JSON
messages ended by a NUL byte on file descriptors 3 and 4), so the test needs no driver
program and no WebSocket client. `.ci/run` installs Debian's `chromium`."""

from __future__ import annotations

import json
import os
import select
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

import tidemark

from conftest import Server


def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    pytest.fail("no Chromium on PATH: .ci/run installs Debian's chromium (apt-get install chromium)")


class Browser:
    """Headless Chromium with one page, spoken to over the DevTools pipe."""

    def __init__(self, profile: Path) -> None:
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
             "--remote-debugging-pipe", f"--user-data-dir={profile}", "about:blank"],
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

    def open(self, url: str) -> None:
        target = self.call("Target.createTarget", session=False, url=url)["targetId"]
        self.session = self.call("Target.attachToTarget", session=False, targetId=target, flatten=True)[
            "sessionId"
        ]
        # The page is there once its document, not the about:blank a new target starts
        # on, has loaded.
        origin = "/".join(url.split("/")[:3])
        deadline = time.monotonic() + 30
        while self.evaluate("location.origin + ' ' + document.readyState") != f"{origin} complete":
            assert time.monotonic() < deadline, "the page did not load"
            time.sleep(0.05)

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


# What the page runs: an EventSource on the stream, each message kept as [lastEventId, data].
FOLLOW = """
window.received = [];
window.opened = 0;
const source = new EventSource("/v1/streams/%s/events?follow=true");
source.onopen = () => { window.opened += 1; };
source.onmessage = (m) => window.received.push([m.lastEventId, JSON.parse(m.data)]);
"""


def received(browser: Browser, count: int, timeout: float = 30) -> list[list[Any]]:
    """What the page received, once it holds `count` events (or fails after `timeout`)."""
    deadline = time.monotonic() + timeout
    while True:
        got = browser.evaluate("JSON.stringify(window.received)")
        events = json.loads(got)
        if len(events) >= count:
            return events
        assert time.monotonic() < deadline, f"the browser has {len(events)} of {count} events: {events}"
        time.sleep(0.05)


def test_a_browser_event_source_follows_a_stream_through_a_server_kill(tmp_path: Path) -> None:
    server = Server(tmp_path / "data")
    try:
        browser = Browser(tmp_path / "chromium")
    except BaseException:
        # No browser (or it did not start): the server this test started goes with it.
        server.stop()
        raise
    try:
        client = tidemark.Client(server.url)
        client.create_stream("ticks", {"V": "LONG"})
        client.append("ticks", [{"tstart": 1_000 * i, "V": i} for i in range(3)])
        # Any page of the server's origin: the EventSource is same-origin, as the console's.
        browser.open(server.url + "/ready")
        browser.evaluate(FOLLOW % "ticks")
        events = received(browser, 3)
        assert events == [[str(i), {"tstart": 1_000 * i, "V": i}] for i in range(3)]

        # Followed live: appended while the page waits.
        client.append("ticks", [{"tstart": 1_000 * i, "V": i} for i in range(3, 5)])
        assert [e[1]["V"] for e in received(browser, 5)] == list(range(5))

        # kill -9: the browser notices, retries on its own, and resumes after the last id it
        # saw (Last-Event-ID), not from the start, and loses nothing appended meanwhile.
        server.kill()
        server.start()
        client.append("ticks", [{"tstart": 1_000 * i, "V": i} for i in range(5, 8)])
        events = received(browser, 8)
        assert [e[0] for e in events] == [str(i) for i in range(8)], events
        assert [e[1]["V"] for e in events] == list(range(8))
        assert browser.evaluate("window.opened") >= 2, "the browser reconnected"
        time.sleep(0.3)
        assert len(received(browser, 8)) == 8, "nothing was sent twice"
    finally:
        browser.close()
        server.stop()
