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

#: A message up to this size is read into one buffer set aside at once (Tidemark's
#: batches are a few MB).
PART_BYTES = 64 << 20


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
        if size <= PART_BYTES:
            return self._fill(pa.allocate_buffer(size))
        # The size comes from the answer's own message header: a larger message is read in
        # parts, so that memory grows only as bytes arrive (a header that lies cannot make
        # the client allocate what it claims), then put together: one more copy, for
        # messages far larger than Tidemark's batches.
        parts = []
        left = size
        while left > 0:
            part = self._fill(pa.allocate_buffer(min(left, PART_BYTES)))
            parts.append(part)
            left -= part.size
            if part.size < PART_BYTES and left > 0:
                break  # The body ended early; Arrow's reader says so.
        whole = pa.allocate_buffer(sum(p.size for p in parts))
        view = memoryview(whole)
        at = 0
        for part in parts:
            view[at:at + part.size] = memoryview(part)
            at += part.size
        view.release()
        return whole

    def _fill(self, buffer: pa.Buffer) -> pa.Buffer:
        """`buffer` filled from the body, or its start as far as the body went."""
        view = memoryview(buffer)
        filled = 0
        while filled < buffer.size:
            got = self._response.readinto(view[filled:])
            if not got:
                break
            filled += got
        view.release()
        return buffer if filled == buffer.size else buffer.slice(0, filled)

    def close(self) -> None:
        self.closed = True

