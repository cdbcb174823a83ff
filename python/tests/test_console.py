"""The web console (docs/console.md) in a real browser, headless Chromium (browser.py),
against a real server: the streams table agrees with the API; a query answers as a table
and a chart; a stream is created, cleared and dropped through the page; the ingest rate
rises while a producer writes; a tail shows new events as they arrive; a token is asked
for and used; the agent's page shows its spool.

With TIDEMARK_SAVE_SCREENSHOTS=1 the screenshots of docs/console.md are written again."""

from __future__ import annotations

import json
import os
import re
import subprocess
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

import tidemark

from browser import Browser
from conftest import REPO, Server, binary, free_port

SCREENSHOTS = REPO / "docs" / "img"
MINUTE_NS = 60 * 10**9
T0 = 1_794_999_600 * 10**9  # 2026-11-18T11:00:00Z, a whole hour

# Run before each document: any error the page throws, or logs as an error, is kept, and
# the test fails on it at the end (a console that half works in silence is a failure).
CATCH_ERRORS = """
window.pageErrors = [];
window.addEventListener("error", (e) => window.pageErrors.push(String(e.message)));
window.addEventListener("unhandledrejection", (e) => window.pageErrors.push(String(e.reason)));
// And every request the page makes, with when it was made and its abort signal.
window.fetched = [];
const realFetch = window.fetch;
window.fetch = (path, options = {}) => {
  window.fetched.push({ path: String(path), at: performance.now(), signal: options.signal });
  return realFetch(path, options);
};
"""


# Minutes of work, if nothing stopped it.
LONG_QUERY = "SELECT count(*) FROM generate_series(1, 100000) a CROSS JOIN generate_series(1, 1000000) b"


def wait_until(condition: Callable[[], bool], what: str, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"waited {timeout} s for {what}"
        time.sleep(0.1)


def screenshot(browser: Browser, name: str) -> None:
    if os.environ.get("TIDEMARK_SAVE_SCREENSHOTS") == "1":
        browser.screenshot(SCREENSHOTS / f"console-{name}.png")


def no_page_errors(browser: Browser) -> None:
    assert browser.evaluate("JSON.stringify(window.pageErrors)") == "[]"


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Browser]:
    opened = Browser(tmp_path / "chromium")
    try:
        yield opened
    finally:
        opened.close()


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    started = Server(tmp_path / "data")
    try:
        yield started
    finally:
        started.stop()


def ticks(start_minute: int, count: int) -> list[dict[str, Any]]:
    return [
        {"tstart": T0 + (start_minute + i) * MINUTE_NS, "symbol": "AB"[i % 2], "price": 100.0 + i, "size": i}
        for i in range(count)
    ]


def table_rows(browser: Browser, selector: str) -> list[list[str]]:
    script = f"""JSON.stringify([...document.querySelectorAll({json.dumps(selector)} + " tbody tr")]
        .map((tr) => [...tr.cells].map((c) => c.textContent)))"""
    rows: list[list[str]] = json.loads(browser.evaluate(script))
    return rows


def set_sql(browser: Browser, sql: str) -> None:
    browser.evaluate(f"document.querySelector('.CodeMirror').CodeMirror.setValue({json.dumps(sql)})")


def run_query(browser: Browser, sql: str) -> str:
    """Runs `sql` with the Run button; the status line once the answer (or error) is in."""
    set_sql(browser, sql)
    browser.evaluate("document.getElementById('query-status').textContent = ''")
    browser.evaluate("document.getElementById('run').click()")
    status: str = browser.wait_for(
        "(() => { const s = document.getElementById('query-status').textContent;"
        " const e = document.getElementById('query-error');"
        " return (/rows? in/.test(s) && s) || (!e.hidden && 'error: ' + e.textContent); })()",
        what="the query's answer",
    )
    return status


def test_the_console_shows_streams_queries_charts_and_tails(server: Server, browser: Browser) -> None:
    client = tidemark.Client(server.url)
    client.create_stream("ticks", {"symbol": "STRING", "price": "DOUBLE", "size": "LONG"})
    client.create_stream("sensors", {"temp": "FLOAT"})
    client.append("ticks", ticks(0, 120))
    client.append("sensors", [{"tstart": T0 + i * MINUTE_NS, "temp": 20.5} for i in range(7)])

    browser.open(server.url + "/", before_load=CATCH_ERRORS)
    # The streams table, against the API (names and event counts, in the API's order).
    expected = [[s.name, f"{s.event_count:,}"] for s in client.streams()]
    browser.wait_for(
        "document.querySelectorAll('#streams-table tbody tr').length === 2"
        " && document.querySelector('[data-stream=ticks] [data-cell=events]').textContent !== ''",
        what="the streams table",
    )
    rows = json.loads(browser.evaluate("""JSON.stringify([...document.querySelectorAll('#streams-table tbody tr')]
        .map((tr) => [tr.dataset.stream, tr.querySelector('[data-cell=events]').textContent,
                      tr.querySelector('[data-cell=range]').textContent, tr.querySelector('.schema').textContent]))"""))
    assert sorted([r[0], r[1]] for r in rows) == sorted(expected)
    ticks_row = next(r for r in rows if r[0] == "ticks")
    assert ticks_row[2] == "2026-11-18T11:00:00.000Z …2026-11-18T12:59:00.000Z", ticks_row  # its time range, two lines
    assert ticks_row[3] == "symbol STRING, price DOUBLE, size LONG", ticks_row
    screenshot(browser, "streams")

    # A time-bucketed query: a table of its rows and a chart drawn on a canvas.
    browser.evaluate("location.hash = '#query'")
    browser.wait_for("!!document.querySelector('.CodeMirror')", what="the editor")
    sql = (
        "SELECT date_bin(INTERVAL '10 minutes', tstart) AS t, avg(price) AS price, max(size) AS size "
        "FROM ticks GROUP BY 1 ORDER BY 1"
    )
    assert re.fullmatch(r"12 rows in \d+ ms", run_query(browser, sql))
    answer = client.query(sql)
    shown = table_rows(browser, "#result")
    assert len(shown) == len(answer) == 12
    assert [float(r[1]) for r in shown] == pytest.approx(list(answer["price"]))
    assert browser.evaluate("document.getElementById('chart').dataset.points") == "12"
    assert browser.evaluate("document.getElementById('chart').dataset.series") == "2"
    drawn = """(() => { const c = document.querySelector('#chart canvas');
        const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
        let painted = 0; for (let i = 3; i < d.length; i += 4) if (d[i] > 0) painted++;
        return painted; })()"""
    assert browser.evaluate(drawn) > 500, "the chart's canvas has lines on it"
    screenshot(browser, "query")

    # An error is the server's message, and the editor's cursor goes to its position.
    status = run_query(browser, "SELECT symbl FROM ticks")
    assert status.startswith("error: bad_sql") and "symbl" in status, status

    # A long query is cancelled from the page, and stops on the server too.
    assert server.metric("tidemark_sql_queries_running") == 0
    set_sql(browser, LONG_QUERY)
    browser.evaluate("document.getElementById('run').click()")
    wait_until(lambda: server.metric("tidemark_sql_queries_running") == 1, "the long query to run")
    browser.evaluate("document.getElementById('cancel').click()")
    browser.wait_for("document.getElementById('query-status').textContent === 'cancelled'", what="cancelled")
    wait_until(lambda: server.metric("tidemark_sql_queries_running") == 0, "the server to stop the query")

    # The history keeps what was run, newest first.
    history = json.loads(browser.evaluate("localStorage.getItem('tidemark.history')"))
    assert history[:3] == [LONG_QUERY, "SELECT symbl FROM ticks", sql]

    # Tail: the newest events, then new ones as they are appended.
    browser.evaluate("location.hash = '#tail/ticks'")
    browser.wait_for("document.querySelectorAll('#tail-table tbody tr').length === 20", what="the tail's backlog")
    assert table_rows(browser, "#tail-table")[0][0] == "119"  # newest first, by position
    client.append("ticks", ticks(120, 3))
    browser.wait_for(
        "document.querySelector('#tail-table tbody tr td')?.textContent === '122'", what="the appended events"
    )
    newest = table_rows(browser, "#tail-table")[:3]
    assert [r[0] for r in newest] == ["122", "121", "120"]
    assert newest[0][1:] == ["2026-11-18T13:02:00.000Z", "A", "102", "2"], newest[0]

    # Paused, nothing new shows; resumed, what came in between does, none skipped.
    browser.evaluate("document.getElementById('tail-pause').click()")
    client.append("ticks", ticks(123, 2))
    time.sleep(0.5)
    assert table_rows(browser, "#tail-table")[0][0] == "122"
    browser.evaluate("document.getElementById('tail-pause').click()")
    browser.wait_for("document.querySelector('#tail-table tbody tr td')?.textContent === '124'", what="resume")
    assert [r[0] for r in table_rows(browser, "#tail-table")[:3]] == ["124", "123", "122"]
    screenshot(browser, "tail")

    # The node: embedded, with the fsync histogram and the writes taken.
    browser.evaluate("location.hash = '#node'")
    facts = browser.wait_for(
        "(() => { const t = document.getElementById('ingest-facts').textContent;"
        " return t.includes('events appended') && t; })()",
        what="the node's facts",
    )
    assert "132" in facts.replace(",", ""), facts  # 120 + 7 + 3 + 2 events appended
    assert browser.wait_for("document.querySelectorAll('#fsync-chart tr').length", what="the histogram") >= 2
    assert not browser.evaluate("document.getElementById('cluster-none').hidden")
    screenshot(browser, "node")
    no_page_errors(browser)


def create_through_the_form(browser: Browser, name: str, schema: str) -> None:
    """Fills the Streams view's form and submits it; returns once the stream's row is there."""
    browser.evaluate(
        f"""(() => {{ const f = document.getElementById('create-form');
        f.elements.namedItem('name').value = {json.dumps(name)};
        f.elements.namedItem('schema').value = {json.dumps(schema)};
        f.requestSubmit(); }})()"""
    )
    browser.wait_for(f"!!document.querySelector('[data-stream={name}]')", what=f"the row of {name}")


def test_streams_are_created_cleared_and_dropped_through_the_page_and_the_rate_shows(
    server: Server, browser: Browser
) -> None:
    client = tidemark.Client(server.url)
    browser.open(server.url + "/#streams", before_load=CATCH_ERRORS)
    browser.wait_for("!document.getElementById('streams-empty').hidden", what="the empty list")

    create_through_the_form(browser, "made", "reading:DOUBLE,site:STRING")
    assert client.stream("made").schema == {"reading": "DOUBLE", "site": "STRING"}

    # The ingest rate rises while a producer writes, and its sparkline is drawn.
    stop = threading.Event()

    def produce() -> None:
        minute = 0
        while not stop.is_set():
            client.append("made", [{"tstart": T0 + (minute + i) * MINUTE_NS, "reading": 1.0, "site": "x"} for i in range(50)])
            minute += 50
            time.sleep(0.1)

    producer = threading.Thread(target=produce)
    producer.start()
    try:
        rate = browser.wait_for(
            "(() => { const t = document.querySelector('[data-stream=made] [data-cell=ingest]').textContent;"
            " return parseFloat(t.replace(/,/g, '')) > 0 && t; })()",
            what="an ingest rate above zero",
        )
        assert "ev/s" in rate
        # Two rates make a line: the sparkline's canvas gets painted.
        browser.wait_for(
            """(() => { const c = document.querySelector('[data-stream=made] canvas.sparkline');
            return c.getContext('2d').getImageData(0, 0, c.width, c.height).data.some((v, i) => i % 4 === 3 && v > 0); })()""",
            what="the sparkline",
        )
    finally:
        stop.set()
        producer.join()
    assert client.stream("made").event_count > 0
    screenshot(browser, "ingest")

    # Clear: the first click only asks; the button acts once the name is typed.
    browser.evaluate("[...document.querySelectorAll('[data-stream=made] button')].find((b) => b.textContent === 'Clear').click()")
    confirm = "document.querySelector('[data-stream=made] .confirm button.danger')"
    assert browser.evaluate(f"{confirm}.disabled") is True
    assert client.stream("made").event_count > 0, "nothing cleared before the confirmation"
    type_name = """(() => { const i = document.querySelector('[data-stream=made] .confirm input');
        i.value = 'made'; i.dispatchEvent(new Event('input')); })()"""
    browser.evaluate(type_name)
    assert browser.evaluate(f"{confirm}.disabled") is False
    browser.evaluate(f"{confirm}.click()")
    wait_until(lambda: client.stream("made").event_count == 0, "the stream to be cleared")
    browser.wait_for(
        "document.querySelector('[data-stream=made] [data-cell=events]').textContent === '0'", what="0 events"
    )

    # Drop, confirmed the same way; the row goes.
    browser.evaluate("[...document.querySelectorAll('[data-stream=made] button')].find((b) => b.textContent === 'Drop').click()")
    browser.evaluate(type_name)
    browser.evaluate(f"{confirm}.click()")
    browser.wait_for("!document.querySelector('[data-stream=made]')", what="the dropped stream's row to go")
    assert [s.name for s in client.streams()] == []
    no_page_errors(browser)


def test_the_console_asks_for_a_token_and_uses_it(tmp_path: Path, browser: Browser) -> None:
    read, write = "read-token-0123456789", "write-token-0123456789"
    server = Server(tmp_path / "data", config=f'[auth]\nread_token = "{read}"\nwrite_token = "{write}"\n')
    try:
        tidemark.Client(server.url, token=write).create_stream("secret", {"v": "LONG"})
        browser.open(server.url + "/", before_load=CATCH_ERRORS)
        # The page itself is open; its first read is refused, and the token dialog opens.
        browser.wait_for("document.getElementById('token-dialog').open", what="the token prompt")
        assert "token" in browser.evaluate("document.getElementById('token-why').textContent")
        screenshot(browser, "token")
        browser.evaluate(f"document.getElementById('token-input').value = {json.dumps(read)}")
        browser.evaluate("document.querySelector('#token-dialog button[value=use]').click()")
        browser.wait_for("!!document.querySelector('[data-stream=secret]')", what="the streams, read with the token")
        assert browser.evaluate("sessionStorage.getItem('tidemark.token')") == read
        assert browser.evaluate("localStorage.getItem('tidemark.token')") is None, "kept for the tab only"
        # The read token does not drop: the server's refusal is shown, the stream stays.
        browser.evaluate("[...document.querySelectorAll('[data-stream=secret] button')].find((b) => b.textContent === 'Drop').click()")
        browser.evaluate(
            """(() => { const i = document.querySelector('[data-stream=secret] .confirm input');
            i.value = 'secret'; i.dispatchEvent(new Event('input'));
            document.querySelector('[data-stream=secret] .confirm button.danger').click(); })()"""
        )
        outcome = "(() => { const n = document.getElementById('streams-outcome'); return !n.hidden && n.textContent; })()"
        refusal = browser.wait_for(outcome, what="the refusal")
        assert "write token" in refusal, refusal
        time.sleep(2.5)  # a refresh of the list or two: the refusal stays until the next action
        assert browser.evaluate(outcome) == refusal
        assert [s.name for s in tidemark.Client(server.url, token=read).streams()] == ["secret"]
        no_page_errors(browser)
    finally:
        server.stop()


def batches(n: int) -> str:
    return f"{n:,} batch{'' if n == 1 else 'es'}"


def test_the_agent_serves_its_own_page(tmp_path: Path, server: Server, browser: Browser) -> None:
    upstream_binary = server.args[server.args.index("--binary") + 1]
    http = f"127.0.0.1:{free_port()}"
    log = open(tmp_path / "agent.log", "wb")
    agent = subprocess.Popen(
        [str(binary()), "agent", "--upstream", upstream_binary, "--spool-dir", str(tmp_path / "spool"),
         "--http", http, "--binary", f"127.0.0.1:{free_port()}"],
        stdout=log, stderr=subprocess.STDOUT,
    )
    try:
        url = f"http://{http}"
        deadline = time.monotonic() + 30
        while True:
            try:
                tidemark.Client(url).request_json("GET", "/agent/status")
                break
            except Exception:
                assert agent.poll() is None and time.monotonic() < deadline, "the agent did not start"
                time.sleep(0.1)
        # Before anything is spooled the agent has not contacted its upstream, and says so
        # (its status says "down" without a reason).
        browser.open(url + "/", before_load=CATCH_ERRORS)
        browser.wait_for(
            "document.getElementById('agent-facts').textContent.includes('not contacted yet')",
            what="the upstream not yet contacted",
        )
        agent_client = tidemark.Client(url)
        agent_client.create_stream("via_agent", {"v": "LONG"})
        # The agent takes appends but answers no reads (the client's append reads the schema).
        agent_client.request_json("POST", "/v1/streams/via_agent/events", [{"tstart": T0, "v": 1}])
        facts = browser.wait_for(
            "(() => { const t = document.getElementById('agent-facts').textContent;"
            " return t.replace(/\\s/g, '').includes('upstreamup') && t; })()",
            what="the agent's upstream up after its first forward",
        )
        assert "upstreamup" in facts.replace(" ", ""), facts  # the agent's upstream is reachable
        # Only the agent's view is offered: its reads are the upstream's.
        assert browser.evaluate("location.hash = '#query'; document.getElementById('view-query').hidden") is True
        assert browser.evaluate("document.getElementById('view-agent').hidden") is False
        status = agent_client.request_json("GET", "/agent/status")
        browser.wait_for(
            f"document.getElementById('agent-facts').textContent.includes('{batches(status['forwardedBatches'])}')",
            what="the forwarded count",
        )
        screenshot(browser, "agent")
        no_page_errors(browser)
    finally:
        agent.kill()
        agent.wait()
        log.close()


def test_the_console_works_over_tls(tmp_path: Path) -> None:
    server = Server(tmp_path / "data", tls=True)
    browser = Browser(tmp_path / "chromium", trust_any_certificate=True)
    try:
        assert server.url.startswith("https://")
        browser.open(server.url + "/#streams", before_load=CATCH_ERRORS)
        browser.wait_for("!document.getElementById('streams-empty').hidden", what="the empty list")
        create_through_the_form(browser, "secure", "v:LONG")
        browser.evaluate("location.hash = '#query'")
        browser.wait_for("!!document.querySelector('.CodeMirror')", what="the editor")
        assert re.fullmatch(r"1 row in \d+ ms", run_query(browser, "SELECT count(*) AS n FROM secure"))
        assert table_rows(browser, "#result") == [["0"]]
        assert browser.evaluate("location.protocol") == "https:"
        no_page_errors(browser)
    finally:
        browser.close()
        server.stop()


def test_views_poll_only_while_on_screen_and_a_tail_ends_with_its_view(server: Server, browser: Browser) -> None:
    client = tidemark.Client(server.url)
    client.create_stream("ticks", {"symbol": "STRING", "price": "DOUBLE", "size": "LONG"})
    client.append("ticks", ticks(0, 3))
    browser.open(server.url + "/#streams", before_load=CATCH_ERRORS)
    browser.wait_for("!!document.querySelector('[data-stream=ticks]')", what="the streams table")
    # Showing the view again (its link, the token prompt closing) starts no second poller.
    for _ in range(3):
        browser.evaluate("location.hash = '#streams/again'; location.hash = '#streams'")
    time.sleep(0.5)
    since = browser.evaluate("performance.now()")
    time.sleep(6.2)
    def lists(since: float) -> int:
        count: int = browser.evaluate(f"window.fetched.filter((f) => f.path === '/v1/streams' && f.at > {since}).length")
        return count

    assert 2 <= lists(since) <= 4, "one poll every two seconds"

    # Left for the Node view, the streams view asks nothing more.
    browser.evaluate("location.hash = '#node'")
    time.sleep(0.5)
    since = browser.evaluate("performance.now()")
    time.sleep(4.5)
    assert lists(since) == 0

    # A tail left before its first answer never follows: every follow it began is aborted.
    browser.evaluate("location.hash = '#tail/ticks'; setTimeout(() => { location.hash = '#streams'; }, 0)")
    time.sleep(1.5)
    follows = "window.fetched.filter((f) => f.path.includes('follow=true'))"
    assert browser.evaluate(f"{follows}.every((f) => f.signal && f.signal.aborted)")
    # And one left after it began is aborted too.
    browser.evaluate("location.hash = '#tail/ticks'")
    browser.wait_for(f"{follows}.length > 0", what="a follow")
    browser.evaluate("location.hash = '#query'")
    assert browser.evaluate(f"{follows}.every((f) => f.signal && f.signal.aborted)")

    # A LONG beyond 2^53 is shown as it is, not rounded to a neighbour.
    browser.wait_for("!!document.querySelector('.CodeMirror')", what="the editor")
    run_query(browser, "SELECT 9007199254740993 AS big, CAST(-9223372036854775807 AS BIGINT) AS low")
    assert table_rows(browser, "#result") == [["9007199254740993", "-9223372036854775807"]]
    no_page_errors(browser)
