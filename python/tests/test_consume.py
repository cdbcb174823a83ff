"""Consuming a stream by position (docs/consuming.md) through `Client.subscribe`, against a
real server: each event once and in order, resumed by a consumer's name, through a
`kill -9` of the server, and a gap raised rather than jumped."""

from __future__ import annotations

import threading
from pathlib import Path

import pyarrow as pa
import pytest

import tidemark

from conftest import Server


def ticks(first: int, n: int) -> list[dict[str, object]]:
    """`n` events whose V is first..first+n, one microsecond apart."""
    return [{"tstart": (first + i) * 1_000, "V": first + i} for i in range(n)]


def values(batches: list[pa.RecordBatch]) -> list[int]:
    return [v for b in batches for v in b.column("V").to_pylist()]


def test_a_read_to_the_end_gives_each_event_once_with_its_position(
    client: tidemark.Client, stream_name: str
) -> None:
    client.create_stream(stream_name, {"V": "LONG"})
    for start in range(0, 300, 100):
        client.append(stream_name, ticks(start, 100))
    batches = list(client.subscribe(stream_name, follow=False, limit=70))
    assert [b.schema.names for b in batches[:1]] == [["position", "tstart", "tend", "V"]]
    assert all(b.num_rows <= 70 for b in batches)
    positions = [p for b in batches for p in b.column("position").to_pylist()]
    assert positions == list(range(300))
    assert values(batches) == list(range(300))
    # After a position, and from a time: the first event appended at or after it.
    assert values(list(client.subscribe(stream_name, after=249, follow=False))) == list(
        range(250, 300))
    assert values(list(client.subscribe(stream_name, from_time=120_000, follow=False))) == list(
        range(120, 300))
    frames = list(client.subscribe(stream_name, after=297, follow=False).frames())
    assert [list(f["V"]) for f in frames] == [[298, 299]]


def test_a_named_consumer_resumes_after_what_it_processed(
    client: tidemark.Client, stream_name: str
) -> None:
    client.create_stream(stream_name, {"V": "LONG"})
    client.append(stream_name, ticks(0, 50))
    seen: list[int] = []
    for batch in client.subscribe(stream_name, "billing", follow=False, limit=20):
        seen += batch.column("V").to_pylist()
        if len(seen) >= 40:
            break  # The batch in hand was processed but not committed: it comes again.
    assert seen == list(range(40))
    assert client.consumers(stream_name) == [{"name": "billing", "position": 19, "behind": 30}]
    again = values(list(client.subscribe(stream_name, "billing", follow=False, limit=20)))
    assert again == list(range(20, 50))
    assert client.consumers(stream_name)[0]["position"] == 49


def test_a_follow_gets_appends_as_they_come_and_survives_a_kill_9(tmp_path: Path) -> None:
    server = Server(tmp_path / "data")
    try:
        with tidemark.connect(server.url, retry_for=30) as client:
            client.create_stream("ticks", {"V": "LONG"})
            client.append("ticks", ticks(0, 10))
            seen: list[int] = []
            positions: list[int] = []
            killed = threading.Event()

            def produce() -> None:
                with tidemark.connect(server.url, retry_for=30) as producer:
                    producer.append("ticks", ticks(10, 10))
                    killed.wait(30)
                    producer.append("ticks", ticks(20, 10))

            thread = threading.Thread(target=produce)
            thread.start()
            subscription = client.subscribe("ticks", "follower", limit=7)
            for batch in subscription:
                seen += batch.column("V").to_pylist()
                positions += batch.column("position").to_pylist()
                if len(seen) >= 20 and not killed.is_set():
                    # Everything acknowledged so far was fsync'd: it is there after restart.
                    server.kill()
                    server.start()
                    killed.set()
                if len(seen) >= 30:
                    break
            thread.join()
            # Each once, in order, none skipped: resumed after the last handed out.
            assert seen == list(range(30))
            assert positions == list(range(30))
    finally:
        server.stop()


def test_events_removed_before_they_were_read_are_raised_not_skipped(
    client: tidemark.Client, stream_name: str
) -> None:
    client.create_stream(stream_name, {"V": "LONG"})
    client.append(stream_name, ticks(0, 5))
    client.clear(stream_name)
    client.append(stream_name, ticks(5, 5))
    with pytest.raises(tidemark.TidemarkError) as gone:
        list(client.subscribe(stream_name, after=1, follow=False))
    assert gone.value.status == 410 and gone.value.code == "positions_removed"
    assert "5" in gone.value.message
    # From the earliest held is the reader's own choice.
    assert values(list(client.subscribe(stream_name, follow=False))) == list(range(5, 10))
    with pytest.raises(ValueError):
        client.subscribe(stream_name, after=1, from_time=0)
