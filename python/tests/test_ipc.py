"""ArrowBody, the source Arrow's stream reader reads answers from: messages split across
HTTP chunks anywhere, and bodies that end early. The body is served by Python's own HTTP
server in chunks of sizes chosen here (Tidemark's chunks follow its batches' buffers)."""

from __future__ import annotations

import http.client
import http.server
import threading
from typing import Iterator

import pyarrow as pa
import pytest

from tidemark._ipc import ArrowBody


def ipc_stream(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        for batch in table.to_batches(max_chunksize=1000):
            writer.write_batch(batch)
    return bytes(sink.getvalue().to_pybytes())


def serve_chunked(body: bytes, sizes: list[int], complete: bool) -> Iterator[int]:
    """A one-request server sending `body` in chunks of `sizes` (cycled); when not
    `complete`, it stops halfway and closes the connection."""

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            end = len(body) if complete else len(body) // 2
            at, i = 0, 0
            while at < end:
                piece = body[at:min(at + sizes[i % len(sizes)], end)]
                self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                at, i = at + len(piece), i + 1
            if complete:
                self.wfile.write(b"0\r\n\r\n")
            self.close_connection = True

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.handle_request)
    thread.start()
    try:
        yield int(server.server_address[1])
    finally:
        thread.join(timeout=10)
        server.server_close()


def table() -> pa.Table:
    return pa.table({
        "v": pa.array(range(10_000), pa.int64()),
        "s": pa.array([None if i % 7 == 0 else f"s{i}" for i in range(10_000)], pa.string()),
    })


def read(port: int) -> pa.Table:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", "/")
        return pa.ipc.open_stream(ArrowBody(conn.getresponse())).read_all()
    finally:
        conn.close()


@pytest.mark.parametrize("sizes", [[1], [7, 13, 1], [4096], [1 << 20]])
def test_messages_split_across_chunks_anywhere_read_whole(sizes: list[int]) -> None:
    expected = table()
    for port in serve_chunked(ipc_stream(expected), sizes, complete=True):
        got = read(port)
    assert got.equals(expected)


def test_reads_are_buffers_of_arrows_pool_and_stop_at_the_end() -> None:
    body = bytes(range(256)) * 40
    for port in serve_chunked(body, [7, 13, 1], complete=True):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        try:
            conn.request("GET", "/")
            source = ArrowBody(conn.getresponse())
            first = source.read(1000)
            rest = source.read(len(body))  # more than is left
        finally:
            conn.close()
    # Arrow's memory (64-byte aligned by its pool), not bytes copied out of http.client.
    assert isinstance(first, pa.Buffer) and first.address % 64 == 0
    assert first.to_pybytes() == body[:1000]
    assert isinstance(rest, pa.Buffer) and rest.to_pybytes() == body[1000:]


@pytest.mark.parametrize("part_bytes", [None, 1000])
def test_a_body_cut_short_raises(part_bytes: int | None, monkeypatch: pytest.MonkeyPatch) -> None:
    import tidemark._ipc as ipc

    if part_bytes is not None:
        monkeypatch.setattr(ipc, "PART_BYTES", part_bytes)
    for port in serve_chunked(ipc_stream(table()), [4096], complete=False):
        with pytest.raises((pa.ArrowInvalid, OSError, http.client.HTTPException)):
            read(port)


def test_a_message_larger_than_a_part_reads_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    import tidemark._ipc as ipc

    monkeypatch.setattr(ipc, "PART_BYTES", 1000)  # messages of up to ~16 KB come in parts
    expected = table()
    for port in serve_chunked(ipc_stream(expected), [4096], complete=True):
        got = read(port)
    assert got.equals(expected)
