"""Refusals name what is wrong and say what was stored; 429s are ridden through exactly."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Iterator

import pyarrow as pa
import pytest

import tidemark
from conftest import Server


def test_a_column_the_stream_lacks_is_a_400_naming_it(client: tidemark.Client, stream_name: str) -> None:
    client.create_stream(stream_name, {"A": "INTEGER"})
    with pytest.raises(tidemark.TidemarkError) as refused:
        client.append(stream_name, pa.table({"tstart": [1], "A": [1], "VOLUME": [2.0]}))
    assert refused.value.status == 400 and refused.value.code == "bad_request"
    assert "VOLUME" in refused.value.message and "A:INTEGER" in refused.value.message
    assert refused.value.appended == 0
    with pytest.raises(tidemark.TidemarkError) as no_time:
        client.append(stream_name, pa.table({"A": [1]}))
    assert "tstart" in no_time.value.message


def test_an_unknown_stream_is_a_404(client: tidemark.Client) -> None:
    with pytest.raises(tidemark.TidemarkError) as refused:
        client.append("no_such_stream", pa.table({"tstart": [1]}))
    assert refused.value.status == 404


def test_a_refused_batch_says_how_many_rows_before_it_were_stored(server: Server, stream_name: str) -> None:
    with tidemark.connect(server.url, batch_rows=1000) as client:
        client.create_stream(stream_name, {"A": "LONG"})
        rows = 3500
        ends: list[int | None] = [None] * rows
        ends[2500] = -1  # An end before its start: the third batch is refused whole.
        table = pa.table({"tstart": pa.array(range(rows), pa.int64()),
                          "tend": pa.array(ends, pa.int64()),
                          "A": pa.array(range(rows), pa.int64())})
        with pytest.raises(tidemark.TidemarkError) as refused:
            client.append(stream_name, table)
        assert refused.value.status == 400 and refused.value.appended == 2000
        assert client.stream(stream_name).event_count == 2000
        stored = client.query(f"SELECT max(A) AS m FROM {stream_name}")["m"][0]
        assert stored == 1999


def test_a_bad_query_is_a_400_with_the_statements_fault(client: tidemark.Client) -> None:
    with pytest.raises(tidemark.TidemarkError) as refused:
        client.query("SELEC 1")
    assert refused.value.status == 400 and refused.value.code == "bad_sql"


@pytest.fixture
def tiny(tmp_path: Path) -> Iterator[Server]:
    """A server whose write budget holds one small request at a time."""
    config = "[limits]\nmax_body_bytes = 65536\nmax_in_flight_bytes = 65536\n"
    running = Server(tmp_path / "tiny", config)
    yield running
    running.stop()


def test_pushback_is_ridden_through_with_the_exact_count_stored(tiny: Server) -> None:
    with tidemark.connect(tiny.url) as setup:
        setup.create_stream("pushed", {"V": "LONG", "S": "STRING"})
    writers, rows = 4, 40_000
    stored = [0] * writers
    failures: list[BaseException] = []

    def write(i: int) -> None:
        try:
            # About 24 KiB per batch: two fit the budget, four writers overflow it.
            with tidemark.connect(tiny.url, batch_rows=1000) as client:
                table = pa.table({
                    "tstart": pa.array(range(i * rows, (i + 1) * rows), pa.int64()),
                    "V": pa.array(range(rows), pa.int64()),
                    "S": pa.array([f"w{i}"] * rows),
                })
                stored[i] = client.append("pushed", table)
        except BaseException as e:  # noqa: BLE001 - reported below
            failures.append(e)

    threads = [threading.Thread(target=write, args=(i,)) for i in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures, failures
    assert stored == [rows] * writers
    pushed_back = tiny.metric('tidemark_rejected_requests_total{reason="overloaded"}')
    assert pushed_back > 0, "the budget never pushed back: the test proves nothing"
    with tidemark.connect(tiny.url) as client:
        counts = client.query("SELECT S, count(*) AS n, count(DISTINCT V) AS d FROM pushed GROUP BY S ORDER BY S")
    assert counts["n"].tolist() == [rows] * writers
    assert counts["d"].tolist() == [rows] * writers


def test_the_token_is_sent_and_its_absence_refused(tmp_path: Path) -> None:
    config = '[auth]\nwrite_token = "write-0123456789abcdef"\nread_token = "read-0123456789abcdef"\n'
    guarded = Server(tmp_path / "guarded", config)
    try:
        with tidemark.connect(guarded.url) as anonymous:
            with pytest.raises(tidemark.TidemarkError) as refused:
                anonymous.streams()
            assert refused.value.status == 401
        with tidemark.connect(guarded.url, token="read-0123456789abcdef") as reader:
            assert reader.streams() == []
            with pytest.raises(tidemark.TidemarkError) as read_only:
                reader.create_stream("guarded", {"V": "LONG"})
            assert read_only.value.status == 401 and "write token" in read_only.value.message
        with tidemark.connect(guarded.url, token="write-0123456789abcdef") as writer:
            writer.create_stream("guarded", {"V": "LONG"})
            assert writer.append("guarded", pa.table({"tstart": [1, 2], "V": [3, 4]})) == 2
            assert writer.query("SELECT sum(V) AS s FROM guarded")["s"][0] == 7
    finally:
        guarded.stop()


def test_a_batch_sent_again_with_its_tag_is_stored_once(client: tidemark.Client, stream_name: str) -> None:
    """What a lost answer leads to: the client sends the batch again under the same
    Tidemark-Producer tag, and the server stores it once."""
    from tidemark import _frames

    client.create_stream(stream_name, {"V": "LONG"})
    body = _frames.ipc_stream(pa.table({"tstart": pa.array([1, 2, 3], pa.int64()),
                                        "V": pa.array([1, 2, 3], pa.int64())}))
    client._append_batch(stream_name, body)
    client._sequence -= 1  # the same (producer, sequence) as the batch just stored
    client._append_batch(stream_name, body)
    assert client.stream(stream_name).event_count == 3
    client._append_batch(stream_name, body)  # a new sequence: a new batch
    assert client.stream(stream_name).event_count == 6


def test_a_record_batch_is_taken_as_it_is(client: tidemark.Client, stream_name: str) -> None:
    client.create_stream(stream_name, {"V": "DOUBLE"})
    batch = pa.record_batch({"tstart": pa.array([5, 6], pa.timestamp("ns", tz="UTC")),
                             "V": pa.array([0.5, None])})
    assert client.append(stream_name, batch) == 2
    got = client.query_arrow(f"SELECT V FROM {stream_name} ORDER BY tstart").column("V")
    assert got.to_pylist() == [0.5, None]


def test_bytes_that_are_not_arrow_are_a_400_and_the_server_stays_up(
    server: Server, client: tidemark.Client, stream_name: str
) -> None:
    """The Arrow route reads untrusted bytes with Arrow's own reader, which panics on some
    malformed streams: the server checks every message first (tidemark_protocol::arrow)."""
    from tidemark import _frames

    client.create_stream(stream_name, {"S": "STRING", "V": "LONG"})
    good = _frames.ipc_stream(pa.table({"tstart": pa.array([1, 2], pa.int64()),
                                        "S": pa.array(["a", "b"], pa.large_string()),
                                        "V": pa.array([1, 2], pa.int64())})).to_pybytes()
    damaged = bytearray(good)
    for at in range(8, len(damaged), 7):
        damaged[at] ^= 0x5A
    path = f"/v1/streams/{stream_name}/events"
    headers = {"Content-Type": "application/vnd.apache.arrow.stream"}
    for body in [b"", b"not arrow at all", good[: len(good) // 2], bytes(damaged)]:
        answer = client._http.request("POST", path, body, headers)
        assert answer.status == 400, (body[:20], answer.status, answer.body)
        assert answer.json()["error"] == "bad_request"
    assert client._http.request("POST", path, good, headers).json()["events"] == 2
    shouted = {"Content-Type": "Application/VND.Apache.Arrow.Stream"}  # media types ignore case
    assert client._http.request("POST", path, good, shouted).json()["events"] == 2
    assert client.stream(stream_name).event_count == 4
