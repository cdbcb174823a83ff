"""Following a stream by position (docs/consuming.md): its events in the order they were
appended, as Arrow record batches, resuming after the last one handed out.

A :class:`Subscription` holds one HTTP answer open (``GET /v1/streams/{s}/events`` with
``follow=true``, as an Arrow IPC stream) and reads its batches as they come. When the
connection drops, the server restarts or the answer ends (an evolving stream's schema
grew), it asks again after the last position it handed out: no event is repeated or
skipped within a subscription. A gap (events removed by retention or a clear before they
were read) is raised, never jumped over.
"""

from __future__ import annotations

import http.client
import time
import urllib.parse
from typing import TYPE_CHECKING, Generator, Iterator

import pyarrow as pa

from ._http import Answer, Connection, refusal, retry_after
from ._ipc import ArrowBody
from .errors import TidemarkError

if TYPE_CHECKING:
    import pandas

    from .client import Client

ARROW_STREAM = "application/vnd.apache.arrow.stream"

#: The column of every batch that holds each event's position.
POSITION = "position"


class Subscription:
    """The events of one stream after a position, as they become durable. Iterate it for
    ``pyarrow.RecordBatch`` es (a ``position`` column first, then ``tstart``, ``tend`` and
    the stream's fields), or :meth:`frames` for pandas DataFrames. Make one with
    :meth:`tidemark.Client.subscribe`.

    With a ``consumer`` name and ``commit=True``, the position of each batch is committed
    (durably, on the server) when the next batch is asked for, that is once the loop body
    has processed it: a consumer that stops, or dies, and subscribes again by the same name
    gets every event at least once. :meth:`commit` commits what was handed out so far, for
    a loop that ends with ``break``.
    """

    def __init__(
        self,
        client: Client,
        connection: Connection,
        stream: str,
        *,
        consumer: str | None,
        after: int | str | None,
        from_time: str | int | None,
        follow: bool,
        limit: int,
        commit: bool,
        retry_for: float,
    ) -> None:
        if sum(x is not None for x in (after, from_time)) > 1:
            raise ValueError("say where to start once: after or from_time")
        if commit and consumer is None:
            raise ValueError("commit=True needs a consumer name")
        self._client = client
        self._http = connection
        self.stream = stream
        self.consumer = consumer
        self._start: dict[str, str] = {}
        if after is not None:
            self._start["after"] = str(after)
        elif from_time is not None:
            self._start["from"] = str(from_time)
        elif consumer is not None:
            self._start["consumer"] = consumer
        else:
            self._start["after"] = "earliest"
        self.follow = follow
        self.limit = limit
        self.auto_commit = commit
        self.retry_for = retry_for
        #: The position of the last event handed out (None before the first).
        self.position: int | None = None
        self._committed: int | None = None
        self._conn: http.client.HTTPConnection | None = None
        self._iterator: Iterator[pa.RecordBatch] | None = None
        #: When the subscription last failed without progress since (None: it is flowing).
        self._failing_since: float | None = None

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        # One iteration per subscription: iterating again goes on where it was.
        if self._iterator is None:
            self._iterator = self._batches()
        return self._iterator

    def frames(self) -> Iterator[pandas.DataFrame]:
        """The batches as pandas DataFrames (types as :meth:`tidemark.Client.query`)."""
        from .client import _to_pandas

        for batch in self:
            yield _to_pandas(pa.Table.from_batches([batch]))

    def commit(self) -> None:
        """Commits the position of the last event handed out under the consumer's name."""
        if self.consumer is None:
            raise ValueError("commit needs a consumer name")
        if self.position is not None and self.position != self._committed:
            self._client.commit_position(self.stream, self.consumer, self.position)
            self._committed = self.position

    def close(self) -> None:
        """Closes the answer held open (iteration ends)."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    # -----------------------------------------------------------------------------------

    def _batches(self) -> Generator[pa.RecordBatch, None, None]:
        try:
            while True:
                try:
                    caught_up = yield from self._one_answer()
                    self._failing_since = None
                    if caught_up:
                        return
                except _Retryable as e:
                    # A connection lost, a server restarting: ask again after the last
                    # position handed out, for up to `retry_for` seconds without progress.
                    now = time.monotonic()
                    since = self._failing_since = self._failing_since or now
                    if now - since > self.retry_for:
                        raise e.error from e
                    time.sleep(e.wait or min(0.05 * 2 ** min(int(now - since), 5), 1.0))
        finally:
            self.close()

    def _query(self) -> str:
        params = dict(self._start) if self.position is None else {"after": str(self.position)}
        params["limit"] = str(self.limit)
        if self.follow:
            params["follow"] = "true"
        elif "from" in params:
            # `from` alone asks for a scan by time: a wait of none makes it a read by position.
            params["wait"] = "0"
        return urllib.parse.urlencode(params)

    def _one_answer(self) -> Generator[pa.RecordBatch, None, bool]:
        """Reads one answer; returns True when a read that does not follow has caught up."""
        path = f"/v1/streams/{urllib.parse.quote(self.stream, safe='')}/events?{self._query()}"
        try:
            self._conn = self._http.open()
            self._conn.request("GET", self._http.path(path),
                               headers=self._http.headers({"Accept": ARROW_STREAM}))
            response = self._conn.getresponse()
        except (OSError, http.client.HTTPException) as e:
            self.close()
            raise _Retryable(TidemarkError(0, "connection", f"{self._http.url}: {e}")) from e
        if response.status != 200:
            headers = {k.lower(): v for k, v in response.getheaders()}
            answer = Answer(response.status, headers, response.read())
            self.close()
            if response.status in (429, 502, 503, 504):
                raise _Retryable(refusal(answer), retry_after(answer))
            raise refusal(answer)
        if response.getheader("content-type") != ARROW_STREAM:
            self.close()
            raise TidemarkError(200, "unexpected_answer",
                                f"a {response.getheader('content-type')} answer, not Arrow")
        next_position = int(response.getheader("tidemark-next-position") or 0)
        rows = 0
        try:
            for batch in pa.ipc.open_stream(ArrowBody(response)):
                if batch.num_rows == 0:
                    continue  # A heartbeat.
                first = batch.column(0)[0].as_py()
                # Each event once, in order: the answer goes on after the last handed out.
                if self.position is not None and first != self.position + 1:
                    raise TidemarkError(200, "out_of_order",
                                        f"position {first} after {self.position}")
                self.position = batch.column(0)[-1].as_py()
                self._failing_since = None  # Progress: a later failure has its own time.
                rows += batch.num_rows
                yield batch
                # Asked for the next batch: this one was processed.
                if self.auto_commit:
                    self.commit()
        except (pa.ArrowInvalid, OSError, http.client.HTTPException) as e:
            self.close()
            raise _Retryable(TidemarkError(200, "cut_short", f"the answer was cut short: {e}")) from e
        self.close()
        if self.follow:
            return False  # An answer that ended cleanly (a schema grew): ask again.
        return rows == 0 or (self.position is not None and self.position + 1 >= next_position)


class _Retryable(Exception):
    """A failure after which asking again may succeed (after `wait` seconds, when the
    server said)."""

    def __init__(self, error: TidemarkError, wait: float | None = None) -> None:
        super().__init__(str(error))
        self.error = error
        self.wait = wait
