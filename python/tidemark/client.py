"""The client: streams, appends and SQL over Tidemark's HTTP API (docs/server.md)."""

from __future__ import annotations

import http.client
import json
import secrets
import threading
import time
import urllib.parse
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterator, Mapping

import pyarrow as pa

from . import _frames
from ._http import Answer, Connection, refusal, retry_after
from ._ipc import ArrowBody
from .consume import Subscription
from .errors import TidemarkError

if TYPE_CHECKING:
    import pandas

ARROW_STREAM = "application/vnd.apache.arrow.stream"


@dataclass(frozen=True)
class Stream:
    """A stream as the server describes it (`GET /v1/streams/{name}`)."""

    name: str
    #: Field name -> type (``"DOUBLE"``, ``"STRING"``...), in the stream's order.
    schema: dict[str, str]
    evolving: bool
    event_count: int
    #: The first and last ``tstart``, in nanoseconds since the epoch (None when empty).
    first_ns: int | None
    last_ns: int | None
    bytes_on_disk: int
    #: Its time partition (``"1d"``, ``"6h"``): no segment holds events of two.
    partition: str = "1d"

    @staticmethod
    def from_json(info: Mapping[str, Any]) -> Stream:
        times = info.get("timeRange") or {}
        return Stream(
            name=info["name"],
            schema={f["name"]: f["type"] for f in info["schema"]},
            evolving=bool(info.get("evolving", False)),
            event_count=int(info["eventCount"]),
            first_ns=times.get("first"),
            last_ns=times.get("last"),
            bytes_on_disk=int(info.get("bytesOnDisk", 0)),
            partition=(info.get("partition") or {}).get("text", "1d"),
        )


class Client:
    """A connection to one Tidemark server. Make one with :func:`tidemark.connect`.

    A client may be shared by threads: its requests go one at a time over one kept-alive
    connection (:meth:`query_batches` opens one of its own while it reads).
    """

    def __init__(
        self,
        url: str = "http://127.0.0.1:8080",
        token: str | None = None,
        timeout: float = 60.0,
        *,
        batch_rows: int = 1_000_000,
        batch_bytes: int = 16 << 20,
        retry_for: float = 120.0,
    ) -> None:
        if batch_rows < 1 or batch_bytes < 1:
            raise ValueError("batch_rows and batch_bytes must be at least 1")
        self._http = Connection(url, token, timeout)
        self.batch_rows = batch_rows
        self.batch_bytes = batch_bytes
        self.retry_for = retry_for
        # Every batch carries (producer, sequence): a batch sent again after a lost answer
        # is stored once (docs/server.md, Tidemark-Producer).
        self._producer = secrets.randbits(63)
        self._sequence = 0
        self._sequence_lock = threading.Lock()
        self._schemas: dict[str, dict[str, str]] = {}

    @property
    def url(self) -> str:
        return self._http.url

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    # Streams -------------------------------------------------------------------------

    def streams(self) -> list[Stream]:
        """Every stream, with its schema and size."""
        return [Stream.from_json(info) for info in self._json("GET", "/v1/streams")]

    def stream(self, name: str) -> Stream:
        """One stream; raises TidemarkError (404 ``not_found``) when there is none."""
        info = Stream.from_json(self._json("GET", f"/v1/streams/{_quote(name)}"))
        self._schemas[name] = info.schema
        return info

    def create_stream(
        self,
        name: str,
        schema: str | Mapping[str, str],
        *,
        evolving: bool = False,
        partition: str | None = None,
    ) -> Stream:
        """Creates a stream, or answers the existing one if it has this schema.

        ``schema`` is a spec (``"SYMBOL:STRING,PRICE:DOUBLE"``) or a mapping of field name
        to type (``{"SYMBOL": "STRING", "PRICE": "DOUBLE"}``); types are BOOLEAN, BYTE,
        SHORT, INTEGER, LONG, FLOAT, DOUBLE, STRING, BYTES. ``partition`` is the stream's
        time partition (``"1h"`` ... ``"12h"`` dividing a day, or whole days; default
        ``"1d"``), fixed at creation: docs/server.md "Time partitions".
        """
        if not isinstance(schema, str):
            schema = ",".join(f"{field}:{ty}" for field, ty in schema.items())
        request: dict[str, Any] = {"name": name, "schema": schema, "evolving": evolving}
        if partition is not None:
            request["partition"] = partition
        info = Stream.from_json(self._json("POST", "/v1/streams", request))
        self._schemas[name] = info.schema
        return info

    def drop_stream(self, name: str) -> None:
        """Drops a stream and all its events."""
        self._json("DELETE", f"/v1/streams/{_quote(name)}")
        self._schemas.pop(name, None)

    def clear(self, name: str) -> None:
        """Deletes every event of a stream, keeping the stream."""
        self._json("POST", f"/v1/streams/{_quote(name)}/clear")

    # Appends -------------------------------------------------------------------------

    def append(self, stream: str, data: Any) -> int:
        """Appends events to ``stream`` and returns how many were stored, durably.

        ``data`` is a pandas DataFrame (a ``tstart`` column of datetimes or int64
        nanoseconds, or a DatetimeIndex), a pyarrow Table or RecordBatch, a polars
        DataFrame, or a list of dicts. Naive datetimes are taken as UTC. An optional
        ``tend`` column gives events an end. Columns are matched with the stream's fields
        by name and cast to their types with Arrow's checked casts (a value that does not
        fit raises ValueError before anything is sent); a field without a column is null.

        Large inputs go in batches of at most ``batch_rows`` rows and about
        ``batch_bytes`` bytes, in order. A batch the server pushes back (429) is sent again
        after the wait it asks for, for up to ``retry_for`` seconds; a batch whose answer
        was lost is sent again once and stored once. On any other failure a TidemarkError
        is raised whose ``appended`` says how many rows, from the first, were stored.
        """
        table = _frames.to_table(data)
        fields = self._schemas.get(stream)
        if fields is None:
            fields = self.stream(stream).schema
        table = _frames.conform(table, fields)
        stored = 0
        for piece in _frames.slices(table, self.batch_rows, self.batch_bytes):
            try:
                stored += self._append_batch(stream, _frames.ipc_stream(piece))
            except TidemarkError as e:
                e.appended = stored
                if e.status == 404 or e.status == 400:
                    # The stream may have been dropped or changed since its schema was read.
                    self._schemas.pop(stream, None)
                raise
        return stored

    def _append_batch(self, stream: str, body: pa.Buffer) -> int:
        with self._sequence_lock:
            self._sequence += 1
            tag = f"{self._producer}/{self._sequence}"
        headers = {"Content-Type": ARROW_STREAM, "Tidemark-Producer": tag}
        path = f"/v1/streams/{_quote(stream)}/events"
        deadline = time.monotonic() + self.retry_for
        while True:
            try:
                answer = self._http.request("POST", path, memoryview(body), headers)
            except TidemarkError:
                # The answer was lost: the same tag makes sending it again safe.
                answer = self._http.request("POST", path, memoryview(body), headers)
            if answer.status == 429 and time.monotonic() < deadline:
                time.sleep(min(retry_after(answer), max(deadline - time.monotonic(), 0.0)))
                continue
            if answer.status != 200:
                raise refusal(answer)
            return int(answer.json()["events"])

    # Queries -------------------------------------------------------------------------

    def query_arrow(self, sql: str) -> pa.Table:
        """The answer to ``sql`` as an Arrow table (``tstart`` and ``tend`` as UTC
        timestamps in nanoseconds)."""
        headers = {"Content-Type": "application/json", "Accept": ARROW_STREAM}

        def read(response: http.client.HTTPResponse) -> pa.Table:
            # Parsed as it arrives: no copy of the whole body is held first.
            try:
                return pa.ipc.open_stream(ArrowBody(response)).read_all()
            except (pa.ArrowInvalid, OSError, http.client.HTTPException) as e:
                raise TidemarkError(200, "cut_short", f"the answer was cut short: {e}") from e

        return self._http.request_reading("POST", "/v1/query", _sql_body(sql), headers, read)

    def query(self, sql: str) -> pandas.DataFrame:
        """The answer to ``sql`` as a pandas DataFrame: times as ``datetime64[ns, UTC]``,
        integers and booleans as pandas' nullable types (``Int64``, ``boolean``...: an
        int64 with nulls stays exact instead of becoming float64), floats as float64 (null
        and NaN both read NaN there; :meth:`query_arrow` tells them apart), strings as
        pandas' string dtype, bytes as objects."""
        return _to_pandas(self.query_arrow(sql))

    def query_batches(self, sql: str) -> Iterator[pa.RecordBatch]:
        """The answer to ``sql`` batch by batch as the server streams it, without holding
        it whole. Stopping early (``break``) closes the answer and stops the query."""
        conn = self._http.open()
        try:
            conn.request("POST", self._http.path("/v1/query"), _sql_body(sql),
                         self._http.headers({"Content-Type": "application/json",
                                             "Accept": ARROW_STREAM}))
            response = conn.getresponse()
            if response.status != 200:
                headers = {k.lower(): v for k, v in response.getheaders()}
                raise refusal(Answer(response.status, headers, response.read()))
            try:
                reader = pa.ipc.open_stream(ArrowBody(response))
                for batch in reader:
                    yield batch
            except (pa.ArrowInvalid, OSError) as e:
                raise TidemarkError(200, "cut_short", f"the answer was cut short: {e}") from e
        finally:
            conn.close()

    # Consuming ------------------------------------------------------------------------

    def subscribe(
        self,
        stream: str,
        consumer: str | None = None,
        *,
        after: int | str | None = None,
        from_time: str | int | None = None,
        follow: bool = True,
        limit: int = 10_000,
        commit: bool | None = None,
    ) -> Subscription:
        """The events of ``stream`` in the order they were appended, each with its
        position, as they become durable: iterate the answer for pyarrow RecordBatches
        (``position``, ``tstart``, ``tend``, the fields), or its ``frames()`` for pandas
        DataFrames (docs/consuming.md).

        Where it starts: ``after`` a position (or ``"earliest"``); ``from_time``, the first
        event appended that starts at or after that time (nanoseconds, RFC 3339, or
        ``now-1h``); else after the position ``consumer`` committed; else from the earliest
        event held. ``follow=False`` ends once caught up with the stream as it was when the
        read began. ``limit`` bounds the events of one batch (1 to 10,000).

        With ``consumer``, the position of each batch is committed under that name when the
        next one is asked for (``commit``, default True when there is a consumer), so that
        subscribing again by the name resumes after the last batch processed: each event
        at least once. Committing needs the write token; with the read token pass
        ``commit=False`` (the consumer's committed position is still where it starts). A lost connection or a restarting server is retried for
        ``retry_for`` seconds, resuming after the last event handed out; events removed
        before they were read (retention, a clear) raise TidemarkError 410
        ``positions_removed`` naming the earliest position still held.
        """
        if not 1 <= limit <= 10_000:
            raise ValueError("limit must be 1 to 10,000")
        return Subscription(
            self, self._http, stream, consumer=consumer, after=after, from_time=from_time,
            follow=follow, limit=limit, commit=consumer is not None if commit is None else commit,
            retry_for=self.retry_for,
        )

    def commit_position(self, stream: str, consumer: str, position: int) -> None:
        """Durably records that ``consumer`` has read ``stream`` to ``position``: a
        subscription by that name resumes after it."""
        self._json("POST", f"/v1/streams/{_quote(stream)}/consumers/{_quote(consumer)}",
                   {"position": position})

    def consumers(self, stream: str) -> list[dict[str, Any]]:
        """The named consumers of ``stream``: each one's ``name``, committed ``position``
        and how many positions it is ``behind``."""
        answer: list[dict[str, Any]] = self._json("GET", f"/v1/streams/{_quote(stream)}/consumers")
        return answer

    # Others ----------------------------------------------------------------------------

    def request_json(self, method: str, path: str, body: Any = None) -> Any:
        """Any route of the HTTP API that takes and answers JSON (docs/server.md), e.g.
        the ChronicleDB-compatible routes under ``/api``; refusals raise TidemarkError."""
        return self._json(method, path, body)

    def _json(self, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"} if data is not None else None
        answer = self._http.request(method, path, data, headers)
        if not 200 <= answer.status < 300:
            raise refusal(answer)
        return answer.json() if answer.body else None


def connect(
    url: str = "http://127.0.0.1:8080", token: str | None = None, timeout: float = 60.0,
    **options: Any,
) -> Client:
    """A client of the server at ``url``. ``token`` is sent as a bearer token (the
    server's read or write token, when it has them); ``timeout`` bounds each request in
    seconds. Keyword options (``batch_rows``, ``batch_bytes``, ``retry_for``) are
    :class:`Client`'s."""
    return Client(url, token, timeout, **options)


def _to_pandas(table: pa.Table) -> pandas.DataFrame:
    import pandas as pd

    nullable = {
        pa.int8(): pd.Int8Dtype(),
        pa.int16(): pd.Int16Dtype(),
        pa.int32(): pd.Int32Dtype(),
        pa.int64(): pd.Int64Dtype(),
        pa.uint64(): pd.UInt64Dtype(),
        pa.bool_(): pd.BooleanDtype(),
    }
    # split_blocks: a column each, not one 2-D block per type to copy them into.
    frame: pandas.DataFrame = table.to_pandas(types_mapper=nullable.get, split_blocks=True)
    return frame


def _quote(name: str) -> str:
    return urllib.parse.quote(name, safe="")


def _sql_body(sql: str) -> bytes:
    return json.dumps({"sql": sql}).encode()
