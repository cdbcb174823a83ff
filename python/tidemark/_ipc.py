"""Reading an Arrow IPC answer off an HTTP response into Arrow's own memory.

Arrow's stream reader asks its source for each message's bytes and keeps them as the
arrays' buffers. Handed an ``http.client.HTTPResponse`` it gets ``bytes`` that
http.client joins from the answer's chunks: a copy of every byte, into memory that
is returned to the system and faulted in again on the next large answer. This source
reads straight from the socket (``readinto``) into buffers from Arrow's memory pool,
aligned as Arrow wants them, which become the arrays: one copy, the kernel's.
"""

from __future__ import annotations

import http.client

import pyarrow as pa


class ArrowBody:
    """A readable source of an answer's body for ``pyarrow.ipc.open_stream``."""

    closed = False

    def __init__(self, response: http.client.HTTPResponse) -> None:
        self._response = response

    def readable(self) -> bool:
        return True

    def read(self, size: int | None = -1) -> pa.Buffer | bytes:
        if size is None or size < 0:
            return self._response.read()
        buffer = pa.allocate_buffer(size, resizable=True)
        view = memoryview(buffer)
        filled = 0
        while filled < size:
            got = self._response.readinto(view[filled:])
            if not got:
                break
            filled += got
        view.release()
        if filled < size:
            buffer.resize(filled)
        return buffer

    def close(self) -> None:
        self.closed = True
