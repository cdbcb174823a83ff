"""A real browser follows a stream: headless Chromium's own `EventSource` (docs/consuming.md,
"Server-Sent Events") reads what was appended, then what is appended while it follows, and
through a `kill -9` of the server it reconnects by itself, sends the last id it received as
`Last-Event-ID`, and goes on after it: each event once, in order.

Chromium is driven over the DevTools protocol (browser.py)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import tidemark

from browser import Browser
from conftest import Server


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
